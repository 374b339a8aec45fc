"""How big a piece an injected sync writes back at a time.

Pure: no clock, no I/O, so tests feed made-up timings. A piece is about ``PIECE_SECONDS`` of the
target's commit rate: a page then waits in the target's queue behind at most two pieces (two are
in flight), which bounds how long memory-cgroup reclaim that meets it can wait.

The first piece of a sync is sized from the controller's commit rate, which describes the last few
fsyncs. Within a sync the size then follows what each piece itself took, so a target that came
back from 1 MiB/s to 20 MiB/s is not fed 128 KiB pieces for a whole batch (the degrade bench:
4-15 MiB in the first 2 s at 20 MiB/s, against 36-42 for the kernel's own writeback).
"""

from __future__ import annotations

#: A writeback piece is this many seconds of the target's commit rate ...
PIECE_SECONDS = 0.1
#: ... but at least this (a smaller piece only adds system calls) ...
PIECE_MIN = 128 << 10
#: ... and until the rate is known, this.
PIECE_UNKNOWN_RATE = 1 << 20

#: A piece delivered faster than this was (mostly) clean already: written back by the kernel or
#: by the previous sync's run past its range. Its timing says nothing about the target.
PIECE_NO_EVIDENCE_S = 0.002

_PAGE = 4096


def _whole_pages(nbytes: float, largest: int) -> int:
    piece = max(PIECE_MIN, min(int(nbytes), largest))
    return max(PIECE_MIN, piece - piece % _PAGE)


def writeback_piece(commit_rate: float | None, largest: int) -> int:
    """The first piece of a sync: whole pages, never above *largest* (the most one sync has to
    write), never below ``PIECE_MIN``."""
    want = PIECE_UNKNOWN_RATE if commit_rate is None else commit_rate * PIECE_SECONDS
    return _whole_pages(want, largest)


def next_piece(piece: int, nbytes: int, seconds: float, largest: int) -> int:
    """The piece after one of *nbytes* was delivered in *seconds* (from the previous piece's
    completion, so two in flight are not charged twice).

    Done in under ``PIECE_NO_EVIDENCE_S``: keep (it was clean; growing on it would start a huge
    piece once the dirty data begins). Done in under half of ``PIECE_SECONDS``: double (slow
    start; a short piece's time is mostly round trip, so its rate understates the target). Over
    twice ``PIECE_SECONDS``: shrink at once to what the measured rate delivers in
    ``PIECE_SECONDS``. In between: keep.
    """
    if nbytes <= 0 or seconds < PIECE_NO_EVIDENCE_S:
        return _whole_pages(piece, largest)
    if seconds < PIECE_SECONDS / 2:
        return _whole_pages(2 * piece, largest)
    if seconds > 2 * PIECE_SECONDS:
        return _whole_pages(nbytes / seconds * PIECE_SECONDS, largest)
    return _whole_pages(piece, largest)
