"""execgatectl: the operator's window into execgate."""
