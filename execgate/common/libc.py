"""libc through ctypes, loaded once per process with errno kept for each call.

The runtime's exit hold (ptrace), the inside agents (inotify, pidfd_getfd) and the BPF loader
(bpf(2), mmap) each set the prototypes they call on this one handle.
"""

from __future__ import annotations

import ctypes

_LIBC: ctypes.CDLL | None = None


def libc() -> ctypes.CDLL:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC
