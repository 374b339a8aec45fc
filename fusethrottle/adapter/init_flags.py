"""Ask the kernel for FUSE_HANDLE_KILLPRIV_V2 at INIT, which libfuse 3.14 cannot.

Why: before every write() the kernel must know whether the write removes set-ID bits or a
file capability, so it asks the daemon getxattr("security.capability") each time: one round
trip through Python per write, which made small writes several times slower than the data
itself. With FUSE_HANDLE_KILLPRIV_V2 the kernel leaves that removal to the server and marks an
inode S_NOSEC once a write found nothing to remove; it asks again only after the inode's
attributes were refreshed. The server's part is done by the target itself here: every call
runs with the caller's credentials (credentials.py), so the target clears set-ID bits and
the capability on a non-owner's write, truncate or chown exactly as a local file system does.

How: libfuse 3.14 has no capability bit for the flag and pyfuse3 hands the daemon no
``fuse_conn_info``. libfuse writes the INIT reply with writev() right after the init handler
returns, so for that one call libfuse's GOT entry for writev points at a function here that
adds the flag to the reply and puts the entry back first. Every step is checked (the entry
must hold libc's writev before it is touched); anything unexpected leaves libfuse alone and
the kernel keeps asking, which is slower but correct.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import mmap
import struct
from pathlib import Path

log = logging.getLogger(__name__)

FUSE_HANDLE_KILLPRIV_V2 = 1 << 28
_OUT_HEADER = 16  # struct fuse_out_header: len, error, unique
_FLAGS_AT = 12  # struct fuse_init_out: major, minor, max_readahead, flags
_INIT_OUT_SIZES = (24, 64)  # struct fuse_init_out before protocol 7.23, and since
_FUSE_MAJOR = 7
_PROT_READ, _PROT_WRITE = 1, 2
_SHT_RELA = 4

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_WRITEV = ctypes.CFUNCTYPE(ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_int)


class _Iovec(ctypes.Structure):
    _fields_ = (("base", ctypes.c_void_p), ("len", ctypes.c_size_t))


def _loaded_libfuse() -> tuple[int, str]:
    """Load address and file of the libfuse3 this process (pyfuse3) uses."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and "libfuse3.so" in fields[5] and int(fields[2], 16) == 0:
            return int(fields[0].split("-")[0], 16), fields[5]
    raise LookupError("libfuse3 is not mapped in this process")


def _protection_at(address: int) -> int:
    """The mprotect() flags of the mapping that holds *address*."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, perms = line.split()[:2]
        start, end = (int(x, 16) for x in span.split("-"))
        if start <= address < end:
            return (_PROT_READ if perms[0] == "r" else 0) | (_PROT_WRITE if perms[1] == "w" else 0)
    raise LookupError(f"no mapping holds {address:#x}")


def _plt_slot(path: str, symbol: bytes) -> int | None:
    """The GOT offset a 64-bit little-endian ELF library's PLT uses for *symbol*."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    for _name, kind, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if kind != _SHT_RELA or entsize != 24:
            continue
        symtab = sections[link]
        strtab = sections[symtab[6]]
        for at in range(offset, offset + size, 24):
            r_offset, r_info, _addend = struct.unpack_from("<QQq", data, at)
            sym_at = symtab[4] + (r_info >> 32) * symtab[9]
            name_at = strtab[4] + struct.unpack_from("<I", data, sym_at)[0]
            if data[name_at : data.index(b"\0", name_at)] == symbol:
                return r_offset
    return None


def _is_init_reply(header: _Iovec, body: _Iovec) -> bool:
    """A successful INIT reply of protocol 7: nothing else may be changed by the hook."""
    if header.len != _OUT_HEADER or body.len not in _INIT_OUT_SIZES:
        return False
    length, error = struct.unpack("<Ii", ctypes.string_at(header.base, 8))
    major = ctypes.c_uint32.from_address(body.base).value
    return error == 0 and length == _OUT_HEADER + body.len and major == _FUSE_MAJOR


class KillprivV2:
    """Arms once, at init: the next writev libfuse makes (its INIT reply) gains the flag."""

    def __init__(self) -> None:
        self.asked = False  # the flag went out in the INIT reply
        self._slot = 0
        self._real = 0
        self._protection = _PROT_READ
        self._hook = _WRITEV(self._writev)  # kept referenced: libfuse calls it by address

    def arm(self) -> bool:
        """Point libfuse's writev at the hook; False (and a log line) where that is unsafe."""
        try:
            base, path = _loaded_libfuse()
            offset = _plt_slot(path, b"writev")
            if offset is None:
                raise LookupError(f"no PLT slot for writev in {path}")
            slot = base + offset
            real = ctypes.cast(_libc.writev, ctypes.c_void_p).value
            if ctypes.c_void_p.from_address(slot).value != real:
                raise LookupError("libfuse's writev slot does not hold libc's writev")
            self._slot, self._real = slot, real or 0
            self._protection = _protection_at(slot)
            self._set_slot(ctypes.cast(self._hook, ctypes.c_void_p).value or 0)
            return True
        except (OSError, LookupError, ValueError, struct.error, IndexError) as exc:
            log.info("the kernel will ask security.capability per write: %s", exc)
            return False

    def _set_slot(self, address: int) -> None:
        page = self._slot & ~(mmap.PAGESIZE - 1)
        if _libc.mprotect(page, mmap.PAGESIZE, _PROT_READ | _PROT_WRITE) != 0:
            raise OSError(ctypes.get_errno(), "mprotect of libfuse's GOT")
        ctypes.c_void_p.from_address(self._slot).value = address
        # A BIND_NOW library's GOT is read-only (RELRO): give the page its protection back.
        _libc.mprotect(page, mmap.PAGESIZE, self._protection)

    def _writev(self, fd: int, iov: int, count: int) -> int:
        """libfuse's INIT reply passes through here, once; nothing may raise."""
        try:
            self._set_slot(self._real)
        except OSError:
            log.warning("libfuse's writev could not be put back; it stays routed through here")
        vectors = (_Iovec * count).from_address(iov)
        if count == 2 and _is_init_reply(vectors[0], vectors[1]):
            flags = ctypes.c_uint32.from_address(vectors[1].base + _FLAGS_AT)
            flags.value |= FUSE_HANDLE_KILLPRIV_V2
            self.asked = True
        return _WRITEV(self._real)(fd, iov, count)
