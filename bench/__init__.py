"""Trace-replay benchmark: workloads, schemes, metrics."""
