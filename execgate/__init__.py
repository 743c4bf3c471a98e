"""execgate: an OCI runtime wrapper and host daemon that admit AI-agent tool calls by memory.

The folders read as the flow, engine to kernel: ``runtime`` (what engines call instead of runc),
``calls`` (one tool call's record, shared by the runtime and the daemon), ``daemon``, ``policy``
(pure decisions), ``bpf`` (kernel programs), over ``cgroups``, ``oci`` and ``common``.
See docs/architecture.md.
"""

__version__ = "0.1.0"
