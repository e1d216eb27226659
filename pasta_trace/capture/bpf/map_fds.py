"""BPF maps reached by file descriptor or by id, through libbpf, without BCC.

The guardian (capture.procs.guardian) holds the late-load maps of a tracer that may
die at any moment, and must work in a small process of its own that does not
import BCC.  Tracers also look into each other's maps (by name) so that one
tracer never resumes a process that another tracer still holds stopped.
"""

from __future__ import annotations

import ctypes
import errno
import os
from typing import Iterator

from ...probes.libbpf import lib

_MAP_NAME_OFFSET = 24  # struct bpf_map_info: type, id, key_size, value_size, max_entries, map_flags, name[16]
_MAP_ID_OFFSET = 4
_INFO_LEN = 96


class Map:
    """One map, by descriptor; keys and values are bytes of the map's sizes."""

    def __init__(self, fd: int, key_size: int, value_size: int):
        self.fd, self.key_size, self.value_size = fd, key_size, value_size

    def lookup(self, key: bytes) -> bytes | None:
        val = ctypes.create_string_buffer(self.value_size)
        if lib().bpf_map_lookup_elem(self.fd, key, val) != 0:
            return None
        return val.raw

    def update(self, key: bytes, value: bytes) -> None:
        if lib().bpf_map_update_elem(self.fd, key, value, 0) != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))

    def delete(self, key: bytes) -> bool:
        return lib().bpf_map_delete_elem(self.fd, key) == 0

    def keys(self) -> list[bytes]:
        out: list[bytes] = []
        prev = None
        nxt = ctypes.create_string_buffer(self.key_size)
        while lib().bpf_map_get_next_key(self.fd, prev, nxt) == 0:
            out.append(nxt.raw)
            prev = ctypes.create_string_buffer(nxt.raw, self.key_size)
            if len(out) > 1 << 20:  # a map that keeps changing under us: enough for one pass
                break
        return out


def map_info(fd: int) -> tuple[int, str, int, int]:
    """(id, name, key size, value size) of the map behind ``fd``."""
    buf = ctypes.create_string_buffer(_INFO_LEN)
    n = ctypes.c_uint32(_INFO_LEN)
    if lib().bpf_obj_get_info_by_fd(fd, buf, ctypes.byref(n)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    ident = int.from_bytes(buf.raw[_MAP_ID_OFFSET:_MAP_ID_OFFSET + 4], "little")
    name = buf.raw[_MAP_NAME_OFFSET:_MAP_NAME_OFFSET + 16].split(b"\0", 1)[0].decode("ascii", "replace")
    key_size, value_size = (int.from_bytes(buf.raw[o:o + 4], "little") for o in (8, 12))
    return ident, name, key_size, value_size


def _map_ids() -> Iterator[int]:
    cur = ctypes.c_uint32(0)
    while lib().bpf_map_get_next_id(cur.value, ctypes.byref(cur)) == 0:
        yield cur.value
    if ctypes.get_errno() not in (0, errno.ENOENT):
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


class MapsByName:
    """Every map in the system with a given name, other than our own: the
    same program loaded by other tracers.  A matching map is opened only for
    one look (holding it would keep a dead tracer's map alive); ids of maps
    with other names are remembered and skipped (ids are not reused soon)."""

    def __init__(self, name: str, key_size: int, value_size: int, exclude_ids: set[int]):
        self.name, self.key_size, self.value_size = name, key_size, value_size
        self._exclude = set(exclude_ids)

    def any_holds(self, key: bytes) -> bool:
        """Whether any of these maps has ``key``."""
        return any(m.lookup(key) is not None for m in self._each())

    def keys(self) -> set[bytes]:
        """The keys of all these maps."""
        return {k for m in self._each() for k in m.keys()}

    def delete_everywhere(self, key: bytes) -> None:
        """Remove ``key`` from each of these maps."""
        for m in self._each():
            m.delete(key)

    def _each(self) -> Iterator[Map]:
        """Each of these maps, open while the caller looks at it."""
        for ident in list(_map_ids()):
            if ident in self._exclude:
                continue
            fd = lib().bpf_map_get_fd_by_id(ident)
            if fd < 0:
                continue  # freed since we listed it
            try:
                try:
                    _, name, ksize, vsize = map_info(fd)
                except OSError:
                    continue
                if (name, ksize, vsize) != (self.name, self.key_size, self.value_size):
                    self._exclude.add(ident)
                else:
                    yield Map(fd, self.key_size, self.value_size)
            finally:
                os.close(fd)
