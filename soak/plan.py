"""The fault schedule: a pure function of the seed and the duration.

Nothing here looks at the clock or the processes: :func:`make_plan` draws every fault
(when, what, against which runner, how long a stop lasts and how it ends), every launch
of the cron-like driver and every batch of new items from ``random.Random(seed)``. The
same seed and duration give the same plan, byte for byte (:attr:`Plan.digest`), so a
failing seed replays the same schedule. Where a fault then lands (inside a transaction or
not, on which run) depends on timing, which no seed fixes; the driver records it.

Fault kinds:

``stop``
    SIGSTOP a runner for ``hold`` seconds (short ones within the lease, long ones well
    past it), then SIGCONT it, or SIGKILL it while stopped. Half the stops hit the
    planned runner at a random moment (mostly idle between runs); the other half
    (``aim="run"``) wait (at most :data:`AIM_WAIT` s) for a runner to be inside a
    handler, holding a lease, and hit that one.
``stop_inside``
    Wait (at most :data:`AIM_WAIT` s) for a runner to be sleeping inside a fenced
    transaction, and SIGSTOP it there: it holds the lease row's lock while stopped.
    Released like ``stop``.
``kill``
    SIGKILL a running runner (the driver restarts the loops); aimed like ``stop``.
``term``
    SIGTERM a runner: it finishes its batch, records the run interrupted, exits 0 (and
    the driver restarts a loop); aimed like ``stop``.
``pg_restart``
    ``pg_ctl restart -m fast`` of the server: every connection is cut.

Operations (:class:`Op`), drawn from the same generator, at their own moments during the
fault phase: what an operator and an application do to the jobs while the faults go on.

``upsert``
    ``soak.inst.instances.upsert(key, every=..., kwargs={"gen": n})``: creates the instance,
    or edits its schedule and arguments, or creates it again after a ``delete``.
``disable`` / ``enable``
    ``Instances.set_enabled([key], ...)``.
``delete``
    ``Instances.delete(key)``: its lease row goes with it.
``recreate``
    ``delete`` then ``upsert`` of the same key at once: a new lease row under the old name,
    whose fences must not repeat the old row's.
``backfill``
    ``backfill()`` of the last ``span`` seconds of ``soak.windows`` or ``soak.retrying``
    (slots ``all`` or ``missing``), at most ``concurrency`` at once.
``once``
    ``run_once()`` of ``soak.retrying`` or an instance, ``delay`` seconds from now.
``skip``
    ``skip_next_slot()`` of ``soak.retrying`` (``jobctl skip``).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, replace

KINDS = ("stop", "stop_inside", "kill", "term", "pg_restart")
WEIGHTS = (0.36, 0.26, 0.20, 0.06, 0.12)
#: The runners: ``A`` the loop over every job, ``B`` the loop over some jobs (``--job``),
#: ``C`` the youngest running ``runjobs --once`` of the cron-like driver.
TARGETS = ("A", "B", "C")
TARGET_WEIGHTS = (0.4, 0.35, 0.25)
#: Mean seconds between two faults.
MEAN_GAP = 2.5
#: How long an aimed fault waits for a runner to be in a run (or inside a transaction).
AIM_WAIT = 4.0
#: The cron-like driver starts ``runjobs --once`` every 2 to 5 seconds.
CRON_GAP = (2.0, 5.0)
#: New items: a batch of 0 to 5 every 0.5 to 1.5 seconds.
PRODUCE_GAP = (0.5, 1.5)
PRODUCE_COUNT = (0, 5)
#: Items present before the runners start.
INITIAL_ITEMS = 40
OP_KINDS = ("upsert", "disable", "enable", "delete", "recreate", "backfill", "once", "skip")
OP_WEIGHTS = (0.26, 0.08, 0.08, 0.08, 0.1, 0.14, 0.14, 0.12)
#: Mean seconds between two operations.
OP_GAP = 2.0
#: The instances' schedules: every 3 to 5 s (their timeout is 2 s).
INSTANCE_EVERY = (3, 4, 5)


@dataclass(frozen=True)
class Fault:
    #: Seconds from the start of the fault phase.
    at: float
    kind: str
    #: ``A``, ``B`` or ``C`` (``stop``, ``kill``; ``term``: ``A`` or ``B``), else "".
    target: str = ""
    #: ``stop``/``stop_inside``: seconds stopped before the release.
    hold: float = 0.0
    #: ``stop``/``stop_inside``: ``cont`` or ``kill``.
    release: str = ""
    #: ``stop``/``kill``/``term``: ``run`` to hit a runner inside a handler, else "" (a
    #: random moment).
    aim: str = ""

    def describe(self) -> str:
        what = self.kind + (f" {self.target}" if self.target else "")
        what += " (in a run)" if self.aim else ""
        if self.kind in ("stop", "stop_inside"):
            what += f" for {self.hold:.2f}s then {self.release}"
        return f"{self.at:8.2f}s  {what}"


@dataclass(frozen=True)
class Op:
    """An operation: at ``at`` seconds from the start of the fault phase."""

    at: float
    kind: str
    #: An instance's key (upsert, disable, enable, delete, recreate; once of an instance),
    #: or the job (backfill, skip, once of a declared job).
    target: str
    #: upsert, recreate: the schedule's interval (s).
    every: int = 0
    #: backfill: how many seconds back it starts; once: seconds from now.
    span: float = 0.0
    #: backfill: ``all`` or ``missing``, and how many slots at once.
    selection: str = ""
    concurrency: int = 0

    def describe(self) -> str:
        what = f"{self.kind} {self.target}"
        if self.every:
            what += f" every {self.every}s"
        if self.kind == "backfill":
            what += f" last {self.span:.1f}s, {self.selection}, {self.concurrency} at once"
        elif self.kind == "once":
            what += f" in {self.span:.1f}s"
        return f"{self.at:8.2f}s  op {what}"


@dataclass(frozen=True)
class Plan:
    seed: int
    #: The fault phase; the quiet period follows it (no faults, runners and cron go on).
    seconds: float
    quiet: float
    faults: tuple[Fault, ...]
    #: Seconds (from the start, through the quiet period) at which the cron-like driver
    #: starts ``runjobs --once``.
    cron: tuple[float, ...]
    #: ``(at, count)``: new items.
    produce: tuple[tuple[float, int], ...]
    #: Delays before restarting a killed or exited loop runner, used in turn.
    restart_delays: tuple[float, ...]
    #: The operations, during the fault phase.
    ops: tuple[Op, ...] = ()

    @property
    def digest(self) -> str:
        return hashlib.sha256(repr(self).encode()).hexdigest()[:12]

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(KINDS, 0)
        for fault in self.faults:
            counts[fault.kind] += 1
        return counts

    def op_counts(self) -> dict[str, int]:
        counts = dict.fromkeys(OP_KINDS, 0)
        for op in self.ops:
            counts[op.kind] += 1
        return counts


def _round(value: float) -> float:
    return round(value, 3)


def _fault(rng: random.Random, at: float, kind: str) -> Fault:
    if kind == "pg_restart" or kind == "stop_inside":
        target = ""
    elif kind == "term":
        target = rng.choice(("A", "B"))
    else:
        target = rng.choices(TARGETS, TARGET_WEIGHTS)[0]
    hold, release, aim = 0.0, "", ""
    if kind in ("stop", "stop_inside"):
        # Half within a lease (1 to 3 s), half well past it: takeovers.
        hold = rng.uniform(0.2, 1.5) if rng.random() < 0.5 else rng.uniform(1.5, 8.0)
        release = "kill" if rng.random() < 0.2 else "cont"
    if kind in ("stop", "kill", "term") and rng.random() < 0.5:
        aim = "run"
    return Fault(_round(at), kind, target, _round(hold), release, aim)


def make_plan(seed: int, seconds: float, quiet: float) -> Plan:
    """The whole schedule: faults during ``seconds``, cron launches and new items during
    ``seconds + quiet``. Every kind of fault appears at least once when the fault phase
    is long enough to hold one of each (about 15 s)."""
    seconds, quiet = float(seconds), float(quiet)  # 600 and 600.0: one plan, one digest
    rng = random.Random(seed)
    faults: list[Fault] = []
    at = rng.uniform(1.0, 3.0)
    while at < seconds - 1.0:
        faults.append(_fault(rng, at, rng.choices(KINDS, WEIGHTS)[0]))
        at += min(max(rng.expovariate(1 / MEAN_GAP), 0.3), 8.0)
    # A short phase may have drawn no fault of some kind: give it one, at a drawn place.
    for kind in KINDS:
        if faults and len(faults) >= len(KINDS) and not any(f.kind == kind for f in faults):
            counts = {k: sum(f.kind == k for f in faults) for k in KINDS}
            spare = [i for i, f in enumerate(faults) if counts[f.kind] > 1]
            if spare:
                index = rng.choice(spare)
                faults[index] = _fault(rng, faults[index].at, kind)
    end = seconds + quiet
    cron: list[float] = []
    at = rng.uniform(0.5, 2.0)
    while at < end:
        cron.append(_round(at))
        at += rng.uniform(*CRON_GAP)
    produce: list[tuple[float, int]] = []
    at = rng.uniform(*PRODUCE_GAP)
    while at < end:
        produce.append((_round(at), rng.randint(*PRODUCE_COUNT)))
        at += rng.uniform(*PRODUCE_GAP)
    delays = tuple(_round(rng.uniform(0.3, 3.0)) for _ in range(1000))
    ops = _ops(random.Random(f"{seed}:ops"), seconds)
    return Plan(seed, seconds, quiet, tuple(faults), tuple(cron), tuple(produce), delays, ops)


def _op(rng: random.Random, at: float, kind: str) -> Op:
    from soak.specs import INSTANCE_KEYS, INSTANCES, RETRYING, WINDOWS

    key = rng.choice(INSTANCE_KEYS)
    if kind in ("upsert", "recreate"):
        return Op(_round(at), kind, key, every=rng.choice(INSTANCE_EVERY))
    if kind == "backfill":
        target = rng.choice((WINDOWS, RETRYING))
        selection = rng.choice(("all", "missing"))
        return Op(
            _round(at),
            kind,
            target,
            span=_round(rng.uniform(6, 20)),
            selection=selection,
            concurrency=rng.randint(1, 2),
        )
    if kind == "once":
        target = RETRYING if rng.random() < 0.6 else f"{INSTANCES}[{key}]"
        return Op(_round(at), kind, target, span=_round(rng.uniform(0, 5)))
    if kind == "skip":
        return Op(_round(at), kind, RETRYING)
    return Op(_round(at), kind, key)


def _ops(rng: random.Random, seconds: float) -> tuple[Op, ...]:
    """The operations: the instances created first (every key, at the start), then one
    about every :data:`OP_GAP` s; every kind at least once when the phase holds one of
    each (about 20 s)."""
    from soak.specs import INSTANCE_KEYS

    ops = [
        Op(_round(0.2 * i), "upsert", key, every=rng.choice(INSTANCE_EVERY))
        for i, key in enumerate(INSTANCE_KEYS)
    ]
    at = 1.0 + rng.uniform(0, OP_GAP)
    while at < seconds - 1.0:
        ops.append(_op(rng, at, rng.choices(OP_KINDS, OP_WEIGHTS)[0]))
        at += min(max(rng.expovariate(1 / OP_GAP), 0.2), 8.0)
    drawn = ops[len(INSTANCE_KEYS) :]
    for kind in OP_KINDS:
        if len(drawn) >= 2 * len(OP_KINDS) and not any(op.kind == kind for op in drawn):
            counts = {k: sum(op.kind == k for op in drawn) for k in OP_KINDS}
            spare = [i for i, op in enumerate(drawn) if counts[op.kind] > 1]
            index = rng.choice(spare)
            drawn[index] = _op(rng, drawn[index].at, kind)
    _widest_backfill_of_all(drawn)
    return (*ops[: len(INSTANCE_KEYS)], *drawn)


def _widest_backfill_of_all(drawn: list[Op]) -> None:
    """The backfill with the widest window (its span, cut short where the previous
    backfill of its job ended: backfills never overlap) selects ``all`` slots. A backfill
    of only the ``missing`` slots of a job that missed none queues nothing, and a plan
    whose every backfill did so would run no backfill at all."""
    ended: dict[str, float] = {}
    widest: tuple[float, int] | None = None
    for index, op in enumerate(drawn):  # in the order of their times
        if op.kind != "backfill":
            continue
        window = min(op.span, op.at - ended.get(op.target, 0.0))
        ended[op.target] = op.at
        if widest is None or window > widest[0]:
            widest = (window, index)
    if widest is not None:
        drawn[widest[1]] = replace(drawn[widest[1]], selection="all")
