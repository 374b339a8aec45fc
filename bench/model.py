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
  ``S / capacity + latency``. ``jitter`` makes each fsync cost a seeded random +-fraction more
  or less, so "does not oscillate" is tested against a noisy target.
- Several mounts share one target. ``sharing="fifo"`` serves whole requests in arrival order:
  a host's share follows how much it queues, which is the hard case for fairness because the
  controllers alone must make it fair. ``"fair"`` splits capacity evenly between the requests
  in service (processor sharing).
- Each :class:`MountSpec` is one daemon. A writer that always has data (a backup) writes one file
  at ``writer_rate`` while the un-synced bytes are below the window. A flusher, like the
  engine's (engine/src/flusher.cc), runs one fsync per file at a time, covering all of the file's
  dirty bytes, started when they reach ``batch``, half the window (``half_window``, on by default as
  in the engine's ``sync_trigger``, engine/src/window.h) or a full window. A controller gets
  ``on_sample(now, nbytes, seconds, in_flight)`` after every fsync, where ``in_flight`` is the
  un-synced bytes left once the synced ones are gone (as the engine's ledger counts them).
- Not modelled, so not claimed from it: the gate's pacing (engine/src/window.cc), the slow start
  of a fresh mount (controller.effective_window), writeback in pieces and page-cache drops
  (engine/src/flusher.cc, kernel_pages.cc), the kernel's own cache. Those are measured on a
  real target by ``python -m bench``.

The driver advances from event to event: a writer filling its batch or window, a request finishing
at the target, an fsync answer arriving, a phase change. Everything moves linearly in between,
so results do not depend on a step size.

``run_step``, ``run_stall`` and ``run_shared`` build the scenarios. ``settling_samples``,
``oscillation``, ``recovery_time`` and ``jain_index`` measure them.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fusethrottle.window.controller import Controller

MiB = 1024 * 1024
_EPS = 1e-9  # seconds
_BYTE = 1.0  # sizes closer than a byte are equal


@dataclass(frozen=True)
class Phase:
    """From ``start`` (seconds) on, the target commits ``capacity`` bytes/s, plus ``latency``."""

    start: float
    capacity: float
    latency: float = 0.02


class ModelTarget:
    """Capacity and base latency as step functions of time."""

    def __init__(
        self, phases: Sequence[Phase], *, sharing: str = "fifo", jitter: float = 0.0, seed: int = 1
    ) -> None:
        if not phases:
            raise ValueError("a target needs at least one phase")
        if sharing not in ("fifo", "fair"):
            raise ValueError("sharing must be 'fifo' or 'fair'")
        self.phases = tuple(sorted(phases, key=lambda p: p.start))
        if self.phases[0].start > 0:
            raise ValueError("the first phase must start at time 0")
        if any(p.capacity < 0 or p.latency < 0 for p in self.phases):
            raise ValueError("capacity and latency must not be negative")
        if not 0.0 <= jitter < 1.0:
            raise ValueError("jitter must be in [0, 1)")
        self.sharing = sharing
        self.jitter = jitter
        self._random = random.Random(seed)

    @classmethod
    def steps(
        cls,
        *steps: tuple[float, float],
        latency: float = 0.02,
        sharing: str = "fifo",
        jitter: float = 0.0,
        seed: int = 1,
    ) -> ModelTarget:
        """``steps((0, 100 * MiB), (120, 25 * MiB))``: capacity changes at those times."""
        phases = [Phase(t, c, latency) for t, c in steps]
        return cls(phases, sharing=sharing, jitter=jitter, seed=seed)

    def work(self, nbytes: int) -> float:
        """How many bytes of capacity a request of *nbytes* costs (random within +-jitter)."""
        if not self.jitter:
            return float(nbytes)
        return nbytes * self._random.uniform(1.0 - self.jitter, 1.0 + self.jitter)

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

    controller: Controller
    batch: int = 64 * MiB
    writer_rate: float = 400 * MiB
    start: float = 0.0
    name: str = ""
    #: Also start a file's fsync once its dirty bytes reach half the window (double buffering);
    #: False mirrors fusethrottle.window.flusher, which waits for ``batch`` or a full window.
    half_window: bool = True


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
    committed: list[float] = field(default_factory=list)  # cumulative bytes, at ``times``

    def window_at(self, t: float) -> int:
        """The window in force at time *t* (a step function of the recorded changes)."""
        i = bisect.bisect_right(self.times, t) - 1
        return self.windows[max(i, 0)] if self.windows else 0

    def unsynced_between(self, start: float, end: float) -> int:
        """The most un-synced bytes recorded in ``[start, end)`` (0 if none)."""
        lo, hi = bisect.bisect_left(self.times, start), bisect.bisect_left(self.times, end)
        return max(self.unsynced[lo:hi], default=0)

    def committed_at(self, t: float) -> float:
        """Bytes the target had committed for this mount by time *t* (interpolated)."""
        i = bisect.bisect_left(self.times, t)
        if not self.times:
            return 0.0
        if i >= len(self.times):
            return self.committed[-1]
        if i == 0 or self.times[i] == t:
            return self.committed[i]
        t0, t1 = self.times[i - 1], self.times[i]
        v0, v1 = self.committed[i - 1], self.committed[i]
        return v0 + (v1 - v0) * (t - t0) / (t1 - t0)

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
    remaining: float  # bytes of capacity still needed (jitter makes this differ from nbytes)
    scale: float = 1.0  # data bytes per byte of capacity


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
        return self.active and self.unsynced < self.window - _BYTE

    def snap(self) -> None:
        """Round float drift so that a batch or window filled to within a byte counts as full."""
        if abs(self.window - self.unsynced) < _BYTE and self.dirty > 0:
            self.dirty = max(self.window - self.syncing, 0.0)
        for trigger in (self.spec.batch, self.window / 2):
            if abs(trigger - self.dirty) < _BYTE:
                self.dirty = float(trigger)


def simulate(
    target: ModelTarget,
    mounts: Sequence[MountSpec],
    duration: float,
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
    stuck = 0

    def record(i: int) -> None:
        m = state[i]
        tr = m.trace
        if tr.times and tr.times[-1] == t:
            tr.windows[-1], tr.unsynced[-1] = m.window, int(m.unsynced)
            tr.committed[-1] = m.served
        else:
            tr.times.append(t)
            tr.windows.append(m.window)
            tr.unsynced.append(int(m.unsynced))
            tr.committed.append(m.served)

    def maybe_start_fsync(i: int) -> None:
        m = state[i]
        if m.syncing or m.dirty < _BYTE:
            return
        full = m.unsynced >= m.window - _BYTE
        half = m.spec.half_window and m.dirty >= m.window / 2 - _BYTE
        if m.dirty >= m.spec.batch or full or half:
            nbytes = round(m.dirty)
            m.dirty = 0.0
            m.syncing = nbytes
            work = target.work(nbytes)
            queue.append(_Request(i, nbytes, t, work, nbytes / work if work else 1.0))

    while t < duration:
        for i, m in enumerate(state):
            if not m.active and m.spec.start <= t + _EPS:
                m.active = True
                record(i)
        # When does something next happen?
        capacity = target.capacity_at(t)
        nxt = min(duration, target.next_change(t))
        for m in state:
            if not m.active:
                nxt = min(nxt, m.spec.start)
                continue
            if m.writing():
                nxt = min(nxt, t + (m.window - m.unsynced) / m.spec.writer_rate)
                if not m.syncing:
                    trigger: float = m.spec.batch
                    if m.spec.half_window:
                        trigger = min(trigger, m.window / 2)
                    if m.dirty < trigger:
                        nxt = min(nxt, t + (trigger - m.dirty) / m.spec.writer_rate)
        in_service = _in_service(queue, target.sharing)
        if capacity > 0 and in_service:
            share = capacity / len(in_service)
            nxt = min(nxt, t + min(r.remaining for r in in_service) / share)
        if answers:
            nxt = min(nxt, answers[0][0])
        dt = max(nxt - t, 0.0)
        stuck = stuck + 1 if dt <= _EPS else 0
        if stuck > 10_000:
            raise RuntimeError(f"simulation stopped making progress at t={t}")
        # Move everything linearly to the next event.
        for m in state:
            if m.writing():
                m.dirty += min(m.spec.writer_rate * dt, m.window - m.unsynced)
                m.snap()
        if capacity > 0 and in_service:
            share = capacity / len(in_service)
            for r in in_service:
                done = min(r.remaining, share * dt)
                r.remaining -= done
                state[r.mount].served += done * r.scale
        t = nxt
        # Requests whose last byte is committed: the answer comes after the base latency.
        latency = target.phase_at(t).latency
        for r in [r for r in queue if r.remaining < _BYTE]:
            queue.remove(r)
            state[r.mount].served += r.remaining * r.scale
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
                record(i)
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


# --- scenarios -------------------------------------------------------------------------------
#: Builds mount *i*'s controller; a fresh one per run, because controllers keep state.
ControllerFactory = Callable[[int], Controller]


def run_step(
    factory: ControllerFactory,
    *,
    before: float,
    after: float,
    at: float,
    duration: float,
    latency: float = 0.02,
    jitter: float = 0.1,
    seed: int = 1,
    batch: int = 64 * MiB,
    writer_rate: float = 400 * MiB,
) -> SimResult:
    """One mount; the target's capacity steps from *before* to *after* bytes/s at *at*."""
    target = ModelTarget.steps(
        (0.0, before), (at, after), latency=latency, jitter=jitter, seed=seed
    )
    spec = MountSpec(factory(0), batch=batch, writer_rate=writer_rate)
    return simulate(target, [spec], duration)


def run_stall(
    factory: ControllerFactory,
    *,
    capacity: float,
    at: float,
    length: float,
    duration: float,
    latency: float = 0.02,
    jitter: float = 0.1,
    seed: int = 1,
    batch: int = 64 * MiB,
    writer_rate: float = 400 * MiB,
) -> SimResult:
    """One mount; the target commits nothing from *at* for *length* seconds."""
    phases = [Phase(0.0, capacity, latency), Phase(at, 0.0, latency)]
    phases.append(Phase(at + length, capacity, latency))
    target = ModelTarget(phases, jitter=jitter, seed=seed)
    spec = MountSpec(factory(0), batch=batch, writer_rate=writer_rate)
    return simulate(target, [spec], duration)


def run_shared(
    factory: ControllerFactory,
    count: int,
    *,
    capacity: float,
    duration: float,
    stagger: float = 0.0,
    sharing: str = "fifo",
    latency: float = 0.02,
    jitter: float = 0.1,
    seed: int = 1,
    batch: int = 64 * MiB,
    writer_rate: float = 400 * MiB,
) -> SimResult:
    """*count* mounts on one target; mount *i* starts at ``i * stagger`` seconds."""
    target = ModelTarget.steps(
        (0.0, capacity), latency=latency, jitter=jitter, seed=seed, sharing=sharing
    )
    specs = [
        MountSpec(factory(i), batch=batch, writer_rate=writer_rate, start=i * stagger)
        for i in range(count)
    ]
    return simulate(target, specs, duration)


# --- measures --------------------------------------------------------------------------------
def settling_samples(
    trace: MountTrace, since: float, until: float, expected: float, band: float = 0.2
) -> int | None:
    """How many fsync samples after *since* until the window is within ``expected +- band`` and
    stays there up to *until*; None if it never settles."""
    samples = trace.samples_between(since, until)
    lo, hi = expected * (1 - band), expected * (1 + band)
    last_outside = -1
    for i, sample in enumerate(samples):
        if not lo <= sample.window <= hi:
            last_outside = i
    if not samples or last_outside == len(samples) - 1:
        return None
    return last_outside + 1


def oscillation(trace: MountTrace, start: float, end: float) -> float:
    """Largest relative distance of the window from its mean over the samples in a period."""
    windows = [s.window for s in trace.samples_between(start, end)]
    if not windows:
        return 0.0
    mean = sum(windows) / len(windows)
    return max(abs(w / mean - 1.0) for w in windows)


def recovery_time(
    trace: MountTrace, since: float, capacity: float, fraction: float = 0.9, span: float = 5.0
) -> float | None:
    """Seconds after *since* until throughput over the next *span* s reaches *fraction* of
    *capacity*; None if it never does."""
    t = since
    end = trace.times[-1] if trace.times else since
    while t + span <= end:
        if trace.throughput(t, t + span) >= fraction * capacity:
            return t - since
        t += 0.5
    return None
