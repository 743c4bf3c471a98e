"""execgated: the host daemon."""
