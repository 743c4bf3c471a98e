"""cgroup v2 plumbing: where a container's cgroup is and how tool-call cgroups live inside it."""
