"""The bpf(2) syscall through ctypes: pinned objects, map access, tracepoint links.

Stdlib only, so the daemon talks to its BPF programs without libbpf bindings or bcc: one syscall
per map operation, no process spawned. bpftool loads the objects; this reads and writes them.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from execgate.common.libc import libc

_NR_BPF = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351, "riscv64": 280,
           "loongarch64": 280}


BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_DELETE_ELEM = 3
BPF_MAP_GET_NEXT_KEY = 4
BPF_OBJ_PIN = 6
BPF_OBJ_GET = 7
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_ANY = 0
_ATTR_SIZE = 64  # enough for every command used here; the rest is zero as the kernel wants

_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    """libc, loaded once, with the prototypes used here."""
    global _libc
    if _libc is None:
        lib = libc()
        lib.syscall.restype = ctypes.c_long
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                             ctypes.c_int, ctypes.c_long]
        _libc = lib
    return _libc


def _syscall_bpf(cmd: int, attr: ctypes.Array) -> int:
    nr = _NR_BPF.get(platform.machine())
    if nr is None:
        raise OSError(errno.ENOSYS, f"bpf(2) syscall number unknown on {platform.machine()}")
    ret = _lib().syscall(ctypes.c_long(nr), ctypes.c_long(cmd),
                        ctypes.c_void_p(ctypes.addressof(attr)), ctypes.c_long(len(attr)))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf(cmd {cmd}): {os.strerror(err)}")
    return int(ret)


def _attr(fmt: str, *values: int) -> ctypes.Array:
    return ctypes.create_string_buffer(struct.pack(fmt, *values), _ATTR_SIZE)


def _addr(buf: ctypes.Array | None) -> int:
    return ctypes.addressof(buf) if buf is not None else 0


def obj_get(path: str) -> int:
    """BPF_OBJ_GET: an fd (O_CLOEXEC) for a pinned BPF object."""
    p = ctypes.create_string_buffer(os.fsencode(path))
    return _syscall_bpf(BPF_OBJ_GET, _attr("=QIIi", _addr(p), 0, 0, 0))


def obj_pin(fd: int, path: str) -> None:
    """BPF_OBJ_PIN: pins the object behind ``fd`` at ``path`` (on bpffs)."""
    p = ctypes.create_string_buffer(os.fsencode(path))
    _syscall_bpf(BPF_OBJ_PIN, _attr("=QIIi", _addr(p), fd, 0, 0))


def obj_info(fd: int, size: int = 96) -> bytes:
    """BPF_OBJ_GET_INFO_BY_FD: the raw bpf_{map,prog,link}_info."""
    info = ctypes.create_string_buffer(size)
    _syscall_bpf(BPF_OBJ_GET_INFO_BY_FD, _attr("=IIQ", fd, size, _addr(info)))
    return info.raw


@dataclass(frozen=True)
class MapInfo:
    type: int
    id: int
    key_size: int
    value_size: int
    max_entries: int
    name: str

    @classmethod
    def parse(cls, raw: bytes) -> MapInfo:
        typ, mid, ks, vs, me, _flags = struct.unpack_from("=6I", raw, 0)
        name = raw[24:40].split(b"\0", 1)[0].decode(errors="replace")
        return cls(typ, mid, ks, vs, me, name)


class BpfMap:
    """A BPF map by fd: lookup/update/delete/iterate with the bpf(2) syscall."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.info = MapInfo.parse(obj_info(fd))

    @classmethod
    def open(cls, path: str) -> BpfMap:
        fd = obj_get(path)
        try:
            return cls(fd)
        except BaseException:
            os.close(fd)
            raise

    def _key(self, key: bytes) -> ctypes.Array:
        if len(key) != self.info.key_size:
            raise ValueError(f"key of {len(key)} bytes for map {self.info.name!r} "
                             f"(key_size {self.info.key_size})")
        return ctypes.create_string_buffer(key, len(key))

    def lookup(self, key: bytes) -> bytes | None:
        k = self._key(key)
        v = ctypes.create_string_buffer(self.info.value_size)
        try:
            _syscall_bpf(BPF_MAP_LOOKUP_ELEM, _attr("=I4xQQQ", self.fd, _addr(k), _addr(v), 0))
        except FileNotFoundError:
            return None
        return v.raw

    def update(self, key: bytes, value: bytes, flags: int = BPF_ANY) -> None:
        if len(value) != self.info.value_size:
            raise ValueError(f"value of {len(value)} bytes for map {self.info.name!r} "
                             f"(value_size {self.info.value_size})")
        k = self._key(key)
        v = ctypes.create_string_buffer(value, len(value))
        _syscall_bpf(BPF_MAP_UPDATE_ELEM, _attr("=I4xQQQ", self.fd, _addr(k), _addr(v), flags))

    def delete(self, key: bytes) -> bool:
        k = self._key(key)
        try:
            _syscall_bpf(BPF_MAP_DELETE_ELEM, _attr("=I4xQQQ", self.fd, _addr(k), 0, 0))
        except FileNotFoundError:
            return False
        return True

    def iter_keys(self) -> Iterator[bytes]:
        prev: ctypes.Array | None = None
        nxt = ctypes.create_string_buffer(self.info.key_size)
        while True:
            try:
                _syscall_bpf(BPF_MAP_GET_NEXT_KEY,
                             _attr("=I4xQQQ", self.fd, _addr(prev), _addr(nxt), 0))
            except FileNotFoundError:
                return
            yield nxt.raw
            prev = ctypes.create_string_buffer(nxt.raw, self.info.key_size)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


BPF_RAW_TRACEPOINT_OPEN = 17


def raw_tracepoint_open(prog_fd: int) -> int:
    """A link fd attaching a loaded ``tp_btf`` program at the tracepoint it was verified for;
    the program stays attached exactly as long as the fd (or a pin of it) lives."""
    return _syscall_bpf(BPF_RAW_TRACEPOINT_OPEN, _attr("=QI4xQ", 0, prog_fd, 0))


_RB_BUSY, _RB_DISCARD = 1 << 31, 1 << 30
_RB_HEAD = struct.Struct("=I")


def ring_records(data: memoryview | bytes, base: int, size: int, cons: int,
                 prod: int) -> tuple[list[bytes], int]:
    """The records between the consumer and producer positions of a BPF ring buffer whose data
    area (mapped twice in a row) starts at ``base`` in ``data``; with the new consumer
    position. A record still being written (busy) ends the walk; discarded ones are skipped."""
    out: list[bytes] = []
    mask = size - 1
    while cons < prod:
        off = base + (cons & mask)
        head = _RB_HEAD.unpack_from(data, off)[0]
        if head & _RB_BUSY:
            break
        length = head & ~(_RB_BUSY | _RB_DISCARD)
        if not head & _RB_DISCARD:
            out.append(bytes(data[off + 8:off + 8 + length]))
        cons += (length + 8 + 7) & ~7
    return out, cons


class RingBuffer:
    """The consumer side of a ``BPF_MAP_TYPE_RINGBUF`` map, mmap'd: reading costs no syscall.

    Layout (kernel/bpf/ringbuf.c): page 0 holds the consumer position (ours to write), page 1
    the producer position, then the data area, mapped twice in a row so that a record wrapping
    around the end reads as one piece. Each record: u32 length (bit 31 busy, bit 30 discarded),
    u32 page offset, then the data, padded to 8 bytes.
    """

    _U64 = struct.Struct("=Q")

    def __init__(self, fd: int, size: int) -> None:
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.size = size
        libc = _lib()
        mmap = libc.mmap
        prot_read, prot_write, map_shared = 1, 2, 1
        self._cons_addr = mmap(None, self.page, prot_read | prot_write, map_shared, fd, 0)
        if self._cons_addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap of the ring buffer's consumer page")
        self._prod_len = self.page + 2 * size
        self._prod_addr = mmap(None, self._prod_len, prot_read, map_shared, fd, self.page)
        if self._prod_addr in (None, ctypes.c_void_p(-1).value):
            err = ctypes.get_errno()
            libc.munmap(ctypes.c_void_p(self._cons_addr), ctypes.c_size_t(self.page))
            raise OSError(err, "mmap of the ring buffer's data")
        self._cons = (ctypes.c_char * self.page).from_address(self._cons_addr)
        self._data = memoryview((ctypes.c_char * self._prod_len).from_address(self._prod_addr))
        self.fd = fd

    def read(self) -> list[bytes]:
        """Every record committed so far, oldest first; a record still being written ends the
        read (it is picked up next time)."""
        cons = self._U64.unpack_from(self._cons, 0)[0]
        prod = self._U64.unpack_from(self._data, 0)[0]
        out, cons = ring_records(self._data, self.page, self.size, cons, prod)
        self._U64.pack_into(self._cons, 0, cons)
        return out

    def close(self) -> None:
        if self.fd < 0:
            return
        self._data.release()
        libc = _lib()
        libc.munmap(ctypes.c_void_p(self._prod_addr), ctypes.c_size_t(self._prod_len))
        libc.munmap(ctypes.c_void_p(self._cons_addr), ctypes.c_size_t(self.page))
        self.fd = -1
