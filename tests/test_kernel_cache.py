"""The kernel's share of the window (pure rules, plus the sysfs file on a plain directory)."""

from __future__ import annotations

import errno
import io
import logging
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mount_util import wait_for

from fusethrottle.window import kernel_cache
from fusethrottle.window.kernel_cache import MIN_SHARE, RECOVERY_SHARE, KernelCache, kernel_share

MiB = 1 << 20


@given(window=st.integers(0, 1 << 34), limit=st.integers(1, 1 << 30))
def test_the_share_is_a_quarter_of_the_window_within_its_bounds(window: int, limit: int) -> None:
    share = kernel_share(window, limit)
    assert share <= limit
    assert share >= min(limit, MIN_SHARE)
    # Never more than half the window (beyond the floor that keeps writeback requests large),
    # so the gate keeps at least half of it for the target.
    assert share <= max(window // 2, MIN_SHARE)
    # A small window still leaves the kernel room for its write-back in flight.
    assert share >= min(limit, RECOVERY_SHARE, window // 2)
    if window >= 4 * RECOVERY_SHARE and window // 4 <= limit:
        assert share == window // 4


def test_a_small_window_after_a_slow_spell_gives_the_kernel_half_of_it() -> None:
    """16 MiB is the adaptive window's floor: a quarter (4 MiB) left the writer paced at the
    kernel's stale speed estimate once the target recovered; half keeps it at speed."""
    assert kernel_share(16 * MiB, 32 * MiB) == 8 * MiB
    assert kernel_share(40 * MiB, 32 * MiB) == RECOVERY_SHARE
    assert kernel_share(256 * MiB, 32 * MiB) == 32 * MiB
    cache = KernelCache(enabled=True, limit=32 * MiB)
    cache.share = kernel_share(16 * MiB, 32 * MiB)
    assert cache.ledger_window(16 * MiB) == 8 * MiB


def test_no_limit_means_no_kernel_share() -> None:
    assert kernel_share(256 * MiB, 0) == 0


@pytest.fixture
def bdi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for /sys/class/bdi/<dev>/ (the real one is exercised by the mount tests)."""
    (tmp_path / "0:99").mkdir()
    (tmp_path / "0:99" / "max_bytes").write_text("49846108\n")
    monkeypatch.setattr(kernel_cache, "bdi_dir", lambda device: str(tmp_path / device))
    return tmp_path / "0:99" / "max_bytes"


def test_the_share_follows_the_window_but_only_when_it_moves_a_lot(bdi: Path) -> None:
    cache = KernelCache(enabled=True, limit=32 * MiB)
    cache.attach("0:99", 256 * MiB)
    assert int(bdi.read_text()) == 32 * MiB
    # The gate admits to the target what the kernel's share leaves of the window.
    assert cache.ledger_window(256 * MiB) == 224 * MiB
    cache.update(64 * MiB)
    assert int(bdi.read_text()) == 16 * MiB
    bdi.write_text("untouched")
    cache.update(72 * MiB)  # 18 MiB: within a quarter of 16 MiB, not rewritten
    assert bdi.read_text() == "untouched"
    assert cache.statistics().limit_bytes == 16 * MiB and cache.statistics().enforced


def test_a_kernel_without_max_bytes_keeps_its_own_limit_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(kernel_cache, "bdi_dir", lambda device: str(tmp_path / device))
    (tmp_path / "0:98").mkdir()  # a bdi without max_bytes: Linux before 6.2
    cache = KernelCache(enabled=True, limit=32 * MiB)
    with caplog.at_level(logging.WARNING):
        cache.attach("0:98", 256 * MiB)
    assert "cannot bound the kernel's cache" in caplog.text
    assert not cache.statistics().enforced
    assert cache.ledger_window(256 * MiB) == 256 * MiB  # nothing known to subtract


def test_a_mount_already_gone_is_no_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A mount unmounted before the daemon got to set its limits (a very short one)."""
    monkeypatch.setattr(kernel_cache, "bdi_dir", lambda device: str(tmp_path / device))
    with caplog.at_level(logging.WARNING):
        KernelCache(enabled=True, limit=32 * MiB, read_ahead=4 * MiB).attach("0:97", 256 * MiB)
    assert caplog.text == ""


def test_a_mount_gone_while_its_limit_is_written_is_no_warning(
    bdi: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Unmounted just as the daemon opened its bdi's file: sysfs answers the write ENODEV."""

    class Removed(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))

    monkeypatch.setattr(kernel_cache, "open", lambda *args, **kw: Removed(), raising=False)
    cache = KernelCache(enabled=True, limit=32 * MiB, read_ahead=4 * MiB)
    with caplog.at_level(logging.INFO):
        cache.attach("0:99", 256 * MiB)
        cache.update(16 * MiB)
    assert caplog.text == ""
    assert not cache.statistics().enforced


def test_disabled_leaves_the_window_to_the_target(bdi: Path) -> None:
    cache = KernelCache(enabled=False, limit=32 * MiB)
    cache.attach("0:99", 256 * MiB)
    assert bdi.read_text() == "49846108\n"
    assert cache.ledger_window(256 * MiB) == 256 * MiB
    assert cache.statistics().limit_bytes == 0


def test_read_ahead_is_set_even_without_the_writeback_cache(bdi: Path) -> None:
    (bdi.parent / "read_ahead_kb").write_text("128\n")
    KernelCache(enabled=False, limit=0, read_ahead=4 * MiB).attach("0:99", 256 * MiB)
    assert (bdi.parent / "read_ahead_kb").read_text() == "4096"


def test_kernel_cache_zero_leaves_the_kernels_own_limit(bdi: Path) -> None:
    """0 must never reach max_bytes: with strict_limit the writer would wait forever."""
    cache = KernelCache(enabled=True, limit=0)
    cache.attach("0:99", 256 * MiB)
    cache.update(1 << 30, force=True)
    assert bdi.read_text() == "49846108\n"
    assert cache.statistics().limit_bytes == 49846108 and not cache.statistics().enforced


@pytest.mark.mount
def test_a_real_mount_keeps_the_read_ahead_it_was_given(make_mount) -> None:  # type: ignore[no-untyped-def]
    """read_ahead= must hold on the mount itself: the kernel lowers the read-ahead to its
    default when FUSE_INIT is answered, so a daemon that set it before that answer leaves a
    restore reading 128 KiB at a time (the engine did)."""
    ft = make_mount(options=["read_ahead=2M"])
    device = f"{os.major(ft.mountpoint.stat().st_dev)}:{os.minor(ft.mountpoint.stat().st_dev)}"
    read_ahead = Path("/sys/class/bdi") / device / "read_ahead_kb"
    assert wait_for(lambda: read_ahead.read_text().strip() == "2048", 30), read_ahead.read_text()
