"""A model target and a discrete-event driver for window controllers.

Why: the controller's claims (it settles near the target's capacity, it does not oscillate, it
recovers from a stall, several hosts sharing one server end up with fair shares) are about
dynamics over minutes of target time. A pure model lets tests and ``bench/simulate.py`` check them
exactly and deterministically in well under a second, with no clock, no threads and no FUSE.

The model, and how it mirrors the real daemon:

- :class:`ModelTarget` commits data at ``capacity`` bytes/s and answers each fsync ``latency``
  seconds after its last byte was committed. Both change over time in :class:`Phase` steps;
  capacity 0 is a stall. Data reaches the target when the fsync for it starts (the NFS client
  holds dirty pages until asked), so an fsync of *S* bytes on an idle target takes
  ``S / capacity + latency``.
- Several mounts share one target. ``sharing="fifo"`` serves whole requests in arrival order
  (a host's share is proportional to how much it queues: the hard case for fairness, because the
  controllers alone must make it fair); ``"fair"`` splits capacity evenly between the requests in
  service (processor sharing).
- Each :class:`MountSpec` is one daemon: a writer that always has data (a backup) writing one file
  at ``writer_rate`` while the un-synced bytes are below the window; a flusher that, like
  ``fusethrottle.flusher``, runs one fsync per file at a time, covering all of the file's dirty
  bytes, started when they reach ``batch`` or when the window is full; and a controller that gets
  ``on_sample(now, nbytes, seconds, in_flight)`` after every fsync, ``in_flight`` being the
  un-synced bytes left once the synced ones are gone (as ``ledger.unsynced`` is).

The driver advances from event to event (a writer filling its batch or window, a request finishing
at the target, an fsync answer arriving, a phase change), moving everything linearly in between,
so results do not depend on a step size.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

MiB = 1024 * 1024
_EPS = 1e-9


class WindowController(Protocol):
    """What the driver needs from a controller (both controllers in controller.py fit)."""

    @property
    def window(self) -> int: ...

    def on_sample(self, now: float, nbytes: int, seconds: float, in_flight: int) -> int: ...


@dataclass(frozen=True)
class Phase:
    """From ``start`` (seconds) on, the target commits ``capacity`` bytes/s, plus ``latency``."""

    start: float
    capacity: float
    latency: float = 0.02


class ModelTarget:
    """Capacity and base latency as step functions of time."""

    def __init__(self, phases: Sequence[Phase], *, sharing: str = "fifo") -> None:
        if not phases:
            raise ValueError("a target needs at least one phase")
        if sharing not in ("fifo", "fair"):
            raise ValueError("sharing must be 'fifo' or 'fair'")
        self.phases = tuple(sorted(phases, key=lambda p: p.start))
        if self.phases[0].start > 0:
            raise ValueError("the first phase must start at time 0")
        if any(p.capacity < 0 or p.latency < 0 for p in self.phases):
            raise ValueError("capacity and latency must not be negative")
        self.sharing = sharing

    @classmethod
    def steps(
        cls, *steps: tuple[float, float], latency: float = 0.02, sharing: str = "fifo"
    ) -> ModelTarget:
        """``steps((0, 100 * MiB), (120, 25 * MiB))``: capacity changes at those times."""
        return cls([Phase(t, c, latency) for t, c in steps], sharing=sharing)

    def phase_at(self, t: float) -> Phase:
        current = self.phases[0]
        for phase in self.phases:
            if phase.start <= t + _EPS:
                current = phase
            else:
                break
        return current

    def capacity_at(self, t: float) -> float:
        return self.phase_at(t).capacity

    def next_change(self, t: float) -> float:
        for phase in self.phases:
            if phase.start > t + _EPS:
                return phase.start
        return math.inf


@dataclass
class MountSpec:
    """One simulated daemon: a controller plus its workload."""

    controller: WindowController
    batch: int = 64 * MiB
    writer_rate: float = 400 * MiB
    start: float = 0.0
    name: str = ""


@dataclass(frozen=True)
class Sample:
    """One completed fsync as the controller saw it, and the window it answered with."""

    time: float
    nbytes: int
    seconds: float
    in_flight: int
    window: int


@dataclass
class MountTrace:
    """Everything recorded about one mount; times in seconds, sizes in bytes."""

    name: str
    times: list[float] = field(default_factory=list)
    windows: list[int] = field(default_factory=list)
    unsynced: list[int] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    committed: list[tuple[float, float]] = field(default_factory=list)  # (time, cumulative)
    max_overshoot: int = 0  # worst un-synced bytes above the window at an admission

    def window_at(self, t: float) -> int:
        """The window in force at time *t* (step function)."""
        value = self.windows[0] if self.windows else 0
        for time, window in zip(self.times, self.windows, strict=True):
            if time > t:
                break
            value = window
        return value

    def committed_at(self, t: float) -> float:
        """Bytes the target had committed for this mount by time *t* (interpolated)."""
        prev_t, prev_v = 0.0, 0.0
        for time, value in self.committed:
            if time >= t:
                if time == prev_t:
                    return value
                return prev_v + (value - prev_v) * (t - prev_t) / (time - prev_t)
            prev_t, prev_v = time, value
        return prev_v

    def throughput(self, start: float, end: float) -> float:
        """Average committed bytes/s in ``[start, end]``."""
        return (self.committed_at(end) - self.committed_at(start)) / (end - start)

    def samples_between(self, start: float, end: float) -> list[Sample]:
        return [s for s in self.samples if start <= s.time < end]


@dataclass
class SimResult:
    duration: float
    mounts: list[MountTrace]


@dataclass
class _Request:
    mount: int
    nbytes: int
    issued: float
    remaining: float


@dataclass
class _Mount:
    spec: MountSpec
    trace: MountTrace
    window: int
    dirty: float = 0.0
    syncing: int = 0
    active: bool = False
    served: float = 0.0

    @property
    def unsynced(self) -> float:
        return self.dirty + self.syncing

    def writing(self) -> bool:
        return self.active and self.unsynced < self.window - _EPS


def simulate(
    target: ModelTarget,
    mounts: Sequence[MountSpec],
    duration: float,
    *,
    on_event: Callable[[float], None] | None = None,
) -> SimResult:
    """Run *mounts* against *target* for *duration* seconds of model time."""
    state = [
        _Mount(spec, MountTrace(spec.name or f"mount{i}"), spec.controller.window)
        for i, spec in enumerate(mounts)
    ]
    queue: list[_Request] = []  # requests being committed, in arrival order
    answers: list[tuple[float, int, int, _Request]] = []  # (time, seq, mount, request)
    seq = 0
    t = 0.0

    def record(i: int) -> None:
        m = state[i]
        tr = m.trace
        if tr.times and tr.times[-1] == t:
            tr.windows[-1], tr.unsynced[-1] = m.window, int(m.unsynced)
        else:
            tr.times.append(t)
            tr.windows.append(m.window)
            tr.unsynced.append(int(m.unsynced))
        tr.committed.append((t, m.served))

    def maybe_start_fsync(i: int) -> None:
        m = state[i]
        if m.syncing or m.dirty <= _EPS:
            return
        full = m.unsynced >= m.window - _EPS
        if m.dirty >= m.spec.batch - _EPS or full:
            nbytes = round(m.dirty)
            m.dirty = 0.0
            m.syncing = nbytes
            queue.append(_Request(i, nbytes, t, float(nbytes)))

    while t < duration:
        for i, m in enumerate(state):
            if not m.active and m.spec.start <= t + _EPS:
                m.active = True
                record(i)
        # When does something next happen?
        capacity = target.capacity_at(t)
        nxt = min(duration, target.next_change(t))
        for i, m in enumerate(state):
            if not m.active:
                nxt = min(nxt, m.spec.start)
                continue
            if m.writing():
                nxt = min(nxt, t + (m.window - m.unsynced) / m.spec.writer_rate)
                if not m.syncing and m.dirty < m.spec.batch:
                    nxt = min(nxt, t + (m.spec.batch - m.dirty) / m.spec.writer_rate)
        in_service = _in_service(queue, target.sharing)
        if capacity > 0 and in_service:
            share = capacity / len(in_service)
            nxt = min(nxt, t + min(r.remaining for r in in_service) / share)
        if answers:
            nxt = min(nxt, answers[0][0])
        dt = max(nxt - t, 0.0)
        # Move everything linearly to the next event.
        for m in state:
            if m.writing():
                m.dirty += min(m.spec.writer_rate * dt, m.window - m.unsynced)
        if capacity > 0 and in_service:
            share = capacity / len(in_service)
            for r in in_service:
                done = min(r.remaining, share * dt)
                r.remaining -= done
                state[r.mount].served += done
        t = nxt
        # Requests whose last byte is committed: the answer comes after the base latency.
        latency = target.phase_at(t).latency
        for r in [r for r in queue if r.remaining <= 1e-6]:
            queue.remove(r)
            state[r.mount].served += r.remaining
            r.remaining = 0.0
            seq += 1
            heapq.heappush(answers, (t + latency, seq, r.mount, r))
        while answers and answers[0][0] <= t + _EPS:
            when, _, i, r = heapq.heappop(answers)
            m = state[i]
            m.syncing = 0
            window = m.spec.controller.on_sample(when, r.nbytes, when - r.issued, int(m.unsynced))
            m.window = window
            m.trace.samples.append(Sample(when, r.nbytes, when - r.issued, int(m.unsynced), window))
            record(i)
        for i, m in enumerate(state):
            if m.active:
                maybe_start_fsync(i)
                m.trace.max_overshoot = max(m.trace.max_overshoot, int(m.unsynced - m.window))
                record(i)
        if on_event is not None:
            on_event(t)
    return SimResult(duration, [m.trace for m in state])


def _in_service(queue: list[_Request], sharing: str) -> list[_Request]:
    if not queue:
        return []
    return queue[:1] if sharing == "fifo" else list(queue)


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index: 1.0 when all equal, 1/n when one value takes everything."""
    total = sum(values)
    squares = sum(v * v for v in values)
    if squares == 0:
        return 1.0
    return total * total / (len(values) * squares)
