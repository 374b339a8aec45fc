"""The dirty ledger against a simple model: every byte written is accounted for until synced."""

from __future__ import annotations

import errno

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from fusethrottle.window.ledger import Ledger

FILES = st.integers(min_value=2, max_value=5)
SIZES = st.integers(min_value=0, max_value=1 << 20)


class LedgerModel(RuleBasedStateMachine):
    tickets = Bundle("tickets")

    def __init__(self) -> None:
        super().__init__()
        self.ledger = Ledger()
        self.now = 0.0
        self.dirty: dict[int, int] = {}
        self.syncing: dict[int, int] = {}
        self.error: dict[int, int] = {}
        self.reserved = 0

    def _tick(self) -> float:
        self.now += 1.0
        return self.now

    @rule(node=FILES, size=SIZES, short=st.integers(min_value=0, max_value=100))
    def write(self, node: int, size: int, short: int) -> None:
        accepted = max(0, size - short)
        self.ledger.reserve(size)
        self.ledger.written(node, size, accepted, self._tick())
        self.dirty[node] = self.dirty.get(node, 0) + accepted

    @rule(size=SIZES)
    def write_admitted_then_never_sent(self, size: int) -> None:
        self.ledger.reserve(size)
        assert self.ledger.unsynced >= size
        self.ledger.unreserve(size)

    @rule(node=FILES, size=st.integers(min_value=1, max_value=1 << 20))
    def write_sent_then_failed(self, node: int, size: int) -> None:
        self.ledger.reserve(size)
        self.ledger.sending(node, size)
        state = self.ledger.file(node)
        # Until the call ends, the file is named as holding data not yet on the target.
        assert state is not None and state.unsynced >= size
        self.ledger.unsent(node, size)

    @rule(node=FILES, size=SIZES)
    def write_sent_then_landed(self, node: int, size: int) -> None:
        self.ledger.reserve(size)
        self.ledger.sending(node, size)
        self.ledger.written(node, size, size, self._tick())
        self.dirty[node] = self.dirty.get(node, 0) + size

    @rule(target=tickets, node=FILES)
    def begin_sync(self, node: int):
        ticket = self.ledger.begin_sync(node)
        assert ticket.nbytes == self.dirty.get(node, 0)
        self.syncing[node] = self.syncing.get(node, 0) + self.dirty.pop(node, 0)
        return ticket

    @rule(ticket=consumes(tickets), outcome=st.sampled_from(["ok", "eio", "reported"]))
    def end_sync(self, ticket, outcome: str) -> None:
        node = ticket.nodeid
        error = None if outcome == "ok" else errno.EIO
        self.ledger.end_sync(ticket, error, self._tick(), reported=outcome == "reported")
        self.syncing[node] -= ticket.nbytes
        if outcome == "eio":
            self.dirty[node] = self.dirty.get(node, 0) + ticket.nbytes
            self.error[node] = errno.EIO

    @rule(node=FILES)
    def unlink_or_truncate(self, node: int) -> None:
        self.ledger.discard(node)
        self.dirty.pop(node, None)

    @rule(node=FILES)
    def application_sees_error_once(self, node: int) -> None:
        assert self.ledger.take_error(node) == self.error.pop(node, None)
        assert self.ledger.take_error(node) is None

    @rule(node=FILES)
    def close(self, node: int) -> None:
        assert self.ledger.released(node) == (self.dirty.get(node, 0) > 0)

    @invariant()
    def totals_match(self) -> None:
        expected = sum(self.dirty.values()) + sum(self.syncing.values())
        assert self.ledger.unsynced == self.reserved + expected
        for node in range(2, 6):
            state = self.ledger.file(node)
            dirty = state.dirty if state else 0
            syncing = state.syncing if state else 0
            assert state is None or state.sending == 0
            assert (dirty, syncing) == (self.dirty.get(node, 0), self.syncing.get(node, 0))

    @invariant()
    def due_files_really_hold_dirty_data(self) -> None:
        for node, _reason in self.ledger.due(
            self.now, batch=1 << 19, window=1 << 21, max_age=5.0, pressure=True
        ):
            assert self.dirty.get(node, 0) > 0


TestLedgerModel = LedgerModel.TestCase


def test_batch_trigger_and_largest_first() -> None:
    ledger = Ledger()
    for node, size in ((2, 10), (3, 64), (4, 70)):
        ledger.reserve(size)
        ledger.written(node, size, size, now=0.0)
    due = ledger.due(1.0, batch=64, window=1000, max_age=30.0, pressure=False)
    assert due == [(4, "batch"), (3, "batch")]


def test_age_trigger() -> None:
    ledger = Ledger()
    ledger.reserve(5)
    ledger.written(2, 5, 5, now=0.0)
    assert ledger.due(29.0, batch=64, window=1000, max_age=30.0, pressure=False) == []
    assert ledger.due(30.0, batch=64, window=1000, max_age=30.0, pressure=False) == [(2, "age")]
    assert ledger.next_deadline(30.0) == 30.0


def test_window_pressure_flushes_the_largest_file_below_batch() -> None:
    ledger = Ledger()
    for node, size in ((2, 10), (3, 20)):
        ledger.reserve(size)
        ledger.written(node, size, size, now=0.0)
    assert ledger.due(1.0, batch=64, window=1000, max_age=30.0, pressure=True) == [(3, "window")]


def test_one_sync_per_file_at_a_time() -> None:
    ledger = Ledger()
    ledger.reserve(100)
    ledger.written(2, 100, 100, now=0.0)
    ticket = ledger.begin_sync(2)
    ledger.reserve(100)
    ledger.written(2, 100, 100, now=1.0)
    assert ledger.due(2.0, batch=64, window=1000, max_age=30.0, pressure=False) == []
    ledger.end_sync(ticket, None, 3.0)
    assert ledger.due(3.0, batch=64, window=1000, max_age=30.0, pressure=False) == [(2, "batch")]
    assert ledger.unsynced == 100


def test_failed_sync_keeps_bytes_and_backs_off() -> None:
    ledger = Ledger()
    ledger.reserve(100)
    ledger.written(2, 100, 100, now=0.0)
    ticket = ledger.begin_sync(2)
    ledger.end_sync(ticket, errno.EIO, now=1.0)
    assert ledger.unsynced == 100
    # no immediate retry storm
    assert ledger.due(1.0, batch=64, window=1000, max_age=30.0, pressure=False) == []
    assert ledger.due(100.0, batch=64, window=1000, max_age=30.0, pressure=False) == [(2, "batch")]
    assert ledger.snapshot(1.0).failed_syncs == 1


def test_a_file_the_target_failed_to_store_stays_lost_until_its_data_stops_mattering() -> None:
    """A failed fsync leaves the file incomplete on the target even once a retry succeeds (the
    pages it could not write are gone); unlink or truncation to zero ends that. A bad request
    (EINVAL) is not data the target lost."""
    ledger = Ledger()
    ledger.reserve(100)
    ledger.written(2, 100, 100, now=0.0)
    ledger.end_sync(ledger.begin_sync(2), errno.ENOSPC, now=1.0)
    ledger.end_sync(ledger.begin_sync(2), None, now=2.0)
    assert ledger.lost == {2: errno.ENOSPC}
    ledger.lost_data(3, errno.EINVAL)
    ledger.lost_data(3, errno.EDQUOT)
    ledger.lost_data(3, errno.EIO)
    assert ledger.lost == {2: errno.ENOSPC, 3: errno.EDQUOT}  # the first failure names it
    ledger.discard(2)
    assert ledger.lost == {3: errno.EDQUOT}
