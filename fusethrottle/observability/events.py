"""What the data path reports as it happens (counters and histograms feed on this).

The data path calls these hooks; it never reads metrics back. ``NullEvents`` is used in tests and
when metrics are off, so the hot path costs one method call either way.
"""

from __future__ import annotations

from typing import Protocol


class Events(Protocol):
    def operation(self, op: str) -> None: ...
    def target_error(self, op: str, errno: int) -> None: ...
    def fsync(self, reason: str, seconds: float, nbytes: int, error: int | None) -> None: ...
    def admission_wait(self, seconds: float) -> None: ...
    def bytes_written(self, nbytes: int) -> None: ...
    def bytes_read(self, nbytes: int) -> None: ...


class NullEvents:
    """Reports nothing."""

    def operation(self, op: str) -> None:
        pass

    def target_error(self, op: str, errno: int) -> None:
        pass

    def fsync(self, reason: str, seconds: float, nbytes: int, error: int | None) -> None:
        pass

    def admission_wait(self, seconds: float) -> None:
        pass

    def bytes_written(self, nbytes: int) -> None:
        pass

    def bytes_read(self, nbytes: int) -> None:
        pass
