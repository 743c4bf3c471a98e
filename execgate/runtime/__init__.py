"""The OCI runtime wrapper: what Docker/containerd call instead of runc."""
