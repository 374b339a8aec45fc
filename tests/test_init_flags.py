"""The INIT reply gains FUSE_HANDLE_KILLPRIV_V2 through a one-shot writev hook in libfuse."""

from __future__ import annotations

import ctypes
import os
import struct

import pyfuse3  # noqa: F401  (maps the libfuse3 the daemon uses)

from fusethrottle.adapter import init_flags


def _slot_value() -> int | None:
    base, path = init_flags._loaded_libfuse()
    offset = init_flags._plt_slot(path, b"writev")
    assert offset is not None
    return ctypes.c_void_p.from_address(base + offset).value


def _libc_writev() -> int | None:
    return ctypes.cast(init_flags._libc.writev, ctypes.c_void_p).value


def _vectors(
    *parts: bytes,
) -> tuple[ctypes.Array[init_flags._Iovec], list[ctypes.Array[ctypes.c_char]]]:
    buffers = [ctypes.create_string_buffer(part, len(part)) for part in parts]
    iov = (init_flags._Iovec * len(parts))()
    for vector, buffer in zip(iov, buffers, strict=True):
        vector.base = ctypes.addressof(buffer)
        vector.len = len(buffer)
    return iov, buffers


def _send(hook: init_flags.KillprivV2, *parts: bytes) -> bytes:
    """What the kernel would read: *parts* written through the hook into a pipe."""
    iov, _keep = _vectors(*parts)
    read_end, write_end = os.pipe()
    try:
        written = hook._writev(write_end, ctypes.addressof(iov), len(parts))
        assert written == sum(len(part) for part in parts)
        return os.read(read_end, 4096)
    finally:
        os.close(read_end)
        os.close(write_end)


def test_libfuses_writev_slot_is_found_and_holds_libcs_writev() -> None:
    assert _slot_value() == _libc_writev()


def test_the_first_reply_after_arming_gains_the_flag_and_the_slot_is_put_back() -> None:
    hook = init_flags.KillprivV2()
    assert hook.arm()
    assert _slot_value() != _libc_writev()
    init_out = struct.pack("<IIII", 7, 38, 131072, 0x1) + bytes(48)
    header = struct.pack("<IiQ", 16 + len(init_out), 0, 2)
    sent = _send(hook, header, init_out)
    assert _slot_value() == _libc_writev()
    flags = struct.unpack_from("<I", sent, 16 + 12)[0]
    assert flags == 0x1 | init_flags.FUSE_HANDLE_KILLPRIV_V2
    assert sent[:16] == header and hook.asked


def test_an_error_reply_passes_unchanged() -> None:
    hook = init_flags.KillprivV2()
    assert hook.arm()
    header = struct.pack("<IiQ", 16, -22, 2)
    sent = _send(hook, header, bytes(64))
    assert sent == header + bytes(64)
    assert not hook.asked
    assert _slot_value() == _libc_writev()


def test_a_reply_that_is_not_init_passes_unchanged() -> None:
    """Should INIT ever not come through writev, the next reply (say, 64 bytes of file data)
    must reach the kernel as libfuse wrote it."""
    hook = init_flags.KillprivV2()
    assert hook.arm()
    data = bytes(range(64))
    header = struct.pack("<IiQ", 16 + len(data), 0, 40)
    sent = _send(hook, header, data)
    assert sent == header + data
    assert not hook.asked
    assert _slot_value() == _libc_writev()
