"""Decisions: memory-pressure state, admission of tool calls, the growth gate's controller."""
