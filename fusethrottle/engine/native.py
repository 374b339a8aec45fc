"""The native engine's C ABI (src/fusethrottle_engine.h) through ctypes.

The control plane calls in; no engine thread ever calls back into Python. The library is built
by ``scripts/install`` (``make -C fusethrottle/engine``); ``FUSETHROTTLE_ENGINE_LIBRARY`` names
another build (the sanitizers' in CI).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

#: Must match FT_ENGINE_ABI of the library.
ABI = 3
LIBRARY = Path(__file__).with_name("libfusethrottle_engine.so")
LIBRARY_ENV = "FUSETHROTTLE_ENGINE_LIBRARY"
_ERROR_SIZE = 512


class EngineUnavailable(RuntimeError):
    """The library is missing or of another ABI; ``str()`` is the one line to print."""


class _Config(ctypes.Structure):
    _fields_ = (
        ("source", ctypes.c_char_p),
        ("mountpoint", ctypes.c_char_p),
        ("fuse_options", ctypes.c_char_p),
        ("writeback_cache", ctypes.c_int),
        ("entry_timeout", ctypes.c_double),
        ("attr_timeout", ctypes.c_double),
        ("max_threads", ctypes.c_uint),
        ("switch_credentials", ctypes.c_int),
        ("xattrs", ctypes.c_int),
    )


class _Stats(ctypes.Structure):
    _fields_ = (
        ("known_files", ctypes.c_uint64),
        ("writeback_cache", ctypes.c_int),
        ("written_bytes", ctypes.c_uint64),
        ("lost_syncs", ctypes.c_uint64),
    )


@dataclass(frozen=True)
class EngineConfig:
    source: str
    mountpoint: str
    fuse_options: tuple[str, ...]
    writeback_cache: bool
    attr_timeout: float
    max_threads: int
    switch_credentials: bool
    xattrs: bool


@dataclass(frozen=True)
class EngineStats:
    known_files: int
    writeback_cache: bool
    written_bytes: int
    #: Files whose fsync failed as the kernel forgot them.
    lost_syncs: int


def library_path() -> Path:
    return Path(os.environ.get(LIBRARY_ENV) or LIBRARY)


def load() -> ctypes.CDLL:
    path = library_path()
    if not path.exists():
        raise EngineUnavailable(
            f"engine=native: {path} is not built (run scripts/install, or make -C {LIBRARY.parent})"
        )
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as err:
        raise EngineUnavailable(f"engine=native: cannot load {path}: {err}") from None
    lib.ft_engine_abi.restype = ctypes.c_int
    if lib.ft_engine_abi() != ABI:
        raise EngineUnavailable(
            f"engine=native: {path} is of ABI {lib.ft_engine_abi()}, not {ABI}: rebuild it"
        )
    lib.ft_engine_mount.restype = ctypes.c_void_p
    lib.ft_engine_mount.argtypes = (ctypes.POINTER(_Config), ctypes.c_char_p, ctypes.c_size_t)
    lib.ft_engine_serve.restype = ctypes.c_int
    lib.ft_engine_serve.argtypes = (ctypes.c_void_p,)
    lib.ft_engine_stop.restype = None
    lib.ft_engine_stop.argtypes = (ctypes.c_void_p,)
    lib.ft_engine_read_stats.restype = None
    lib.ft_engine_read_stats.argtypes = (ctypes.c_void_p, ctypes.POINTER(_Stats))
    lib.ft_engine_close_the_cache.restype = None
    lib.ft_engine_close_the_cache.argtypes = (ctypes.c_void_p,)
    lib.ft_engine_sync_all.restype = ctypes.c_uint64
    lib.ft_engine_sync_all.argtypes = (ctypes.c_void_p,)
    lib.ft_engine_free.restype = None
    lib.ft_engine_free.argtypes = (ctypes.c_void_p,)
    return lib


class NativeEngine:
    """One mounted engine. ``serve`` blocks (run it in a thread); ``stop`` may come from any
    thread; ``free`` only after ``serve`` returned."""

    def __init__(self, lib: ctypes.CDLL, handle: int) -> None:
        self._lib = lib
        self._handle: int | None = handle

    @classmethod
    def mount(cls, config: EngineConfig) -> NativeEngine:
        """Mount; an OSError says why not."""
        lib = load()
        raw = _Config(
            config.source.encode(),
            config.mountpoint.encode(),
            ",".join(config.fuse_options).encode(),
            int(config.writeback_cache),
            config.attr_timeout,
            config.attr_timeout,
            config.max_threads,
            int(config.switch_credentials),
            int(config.xattrs),
        )
        error = ctypes.create_string_buffer(_ERROR_SIZE)
        handle = lib.ft_engine_mount(ctypes.byref(raw), error, _ERROR_SIZE)
        if not handle:
            raise OSError(error.value.decode(errors="replace") or "the engine did not mount")
        return cls(lib, handle)

    def serve(self) -> int:
        assert self._handle is not None
        return int(self._lib.ft_engine_serve(self._handle))

    def stop(self) -> None:
        if self._handle is not None:
            self._lib.ft_engine_stop(self._handle)

    def stats(self) -> EngineStats:
        assert self._handle is not None
        raw = _Stats()
        self._lib.ft_engine_read_stats(self._handle, ctypes.byref(raw))
        return EngineStats(
            raw.known_files, bool(raw.writeback_cache), raw.written_bytes, raw.lost_syncs
        )

    def close_the_cache(self) -> None:
        """Refuse everything new but the kernel's write-back and closes (ENOTCONN)."""
        assert self._handle is not None
        self._lib.ft_engine_close_the_cache(self._handle)

    def sync_all(self) -> int:
        """fsync every file written since its last fsync; how many failed."""
        assert self._handle is not None
        return int(self._lib.ft_engine_sync_all(self._handle))

    def free(self) -> None:
        if self._handle is not None:
            self._lib.ft_engine_free(self._handle)
            self._handle = None
