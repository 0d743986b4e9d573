"""Operating a job by hand: run it now (``manage.py runjobs --now NAME`` and
:func:`django_fencedjobs.testing.run_job_now`), pause it, resume it, skip its next slot
(``manage.py jobctl``, and the admin's actions).

A run now takes the real path: the job is made due now, and its lease is taken with the
same compare-and-set as a scheduled run's, so it never overlaps a run of the same job in
another process; it is recorded (a ``JobRun``), logged and signalled like any other, and
its writes are fenced. The schedule goes on as before: like every run, it moves the job's
next slot to the first one after now.

An instance (``job[key]``) is operated on as a job is; its pause is its own flag
(``JobInstance.paused``), which its lease row follows (:func:`operations.set_instance_paused`),
so that a pause and the instance's *enabled* never undo each other. :func:`every_instance`
and :func:`operate_each` operate on every instance of a job (``job[*]``).

Pause, resume and skip change the job's lease row with the admin's bounded wait
(:data:`~django_fencedjobs.db.LOCK_WAIT`): a row a run keeps locked inside a fenced
transaction for longer raises :class:`JobBusy`, and nothing is changed.

Every slot an operator skips (a skip, a resume from now) is recorded, in the transaction
that moves the row past it: a run of outcome ``skipped`` for the latest of them, its
``missed_slots`` counting the others, its ``owner`` naming who skipped them
(:func:`_record_skipped`). So every slot of the schedule has a run that ran it, counted
it, or says who skipped it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db import IntegrityError, transaction

from django_fencedjobs import clock, db, declared, instances, lease, operations, runner, slots
from django_fencedjobs.exceptions import FencedJobsError
from django_fencedjobs.instants import format_instant, format_wait, format_with_utc
from django_fencedjobs.lease import LeaseRow
from django_fencedjobs.models import JobInstance, JobLease, JobRun, Outcome
from django_fencedjobs.operations import Change
from django_fencedjobs.registry import Job

logger = logging.getLogger("django_fencedjobs")

#: How many times :func:`skip_next_slot` reads the row again when a run took the job
#: between its read and its change.
SKIP_ATTEMPTS = 3

#: Who skipped a slot, when the caller does not say (``manage.py jobctl`` and the admin do).
OPERATOR = "jobctl"


class JobBusy(FencedJobsError):
    """A run is inside a fenced transaction on the job's lease row, which stayed locked past
    the bounded wait: nothing was changed. Try again in a moment."""


@dataclass(frozen=True)
class Operated:
    """What :func:`pause`, :func:`resume` or :func:`skip_next_slot` did to one job."""

    job: str
    #: False when there was nothing to change (already paused, not paused).
    changed: bool
    #: One line for the operator: what happened, and what happens next.
    line: str


def run_now(job: Job, *, stop: threading.Event | None = None) -> JobRun:
    """Run ``job`` once, now, in this thread; return its recorded run (whatever its outcome).
    Setting ``stop`` stops the run between batches (``runjobs --now`` sets it on SIGTERM).

    Raises :class:`FencedJobsError`, saying why in one line, when the run cannot start: the
    job is paused, or another run holds its lease. Then nothing is changed: the job is not
    made due, so no run is left queued behind the one that holds the lease.
    """
    now = clock.now()
    declared.sync([job], now)  # a job no runner has seen yet gets its row here
    _refuse_if_busy(job, now)
    operations.make_due(job.name, now)
    record = runner.run_named(job, stop=stop)
    if record is None:  # another runner took the lease between the check and now
        _refuse_if_busy(job, clock.now())
        raise FencedJobsError(
            f"job {job.name!r} could not be run now: another runner took its lease first"
        )
    return record


def _refuse_if_busy(job: Job, now: datetime) -> None:
    paused, owner, until = (
        JobLease.objects.using(db.lease_db())
        .filter(name=job.name)
        .values_list("paused", "owner", "lease_until")
        .get()
    )
    if paused and job.parent is not None and _instance_paused(job):
        raise FencedJobsError(
            f"instance {job.name!r} is paused: resume it (`manage.py jobctl resume "
            f"'{job.name}'`) to run it"
        )
    if paused and job.parent is not None:
        raise FencedJobsError(
            f"instance {job.name!r} is disabled or invalid: enable it (in the admin, or "
            f"with .instances.set_enabled) to run it"
        )
    if paused:
        raise FencedJobsError(
            f"job {job.name!r} is paused: resume it (`manage.py jobctl resume {job.name}`, or "
            "in the admin) to run it"
        )
    if until >= now:
        raise FencedJobsError(
            f"job {job.name!r} is running elsewhere: its lease is held by "
            f"{owner or 'another runner'} until {format_instant(until, UTC)}"
        )


def pause(job: Job) -> Operated:
    """Pause ``job``: no run of it starts until it is resumed. A run in progress goes on to
    its end."""
    now = _seen(job)
    change = _set_paused(job, True)
    _refuse_if_locked(job, change)
    if not change:
        return Operated(job.name, False, f"{job.name} is already paused: nothing changed")
    _, owner, until, _ = _row(job)
    running = (
        f"; the run in progress on {owner} goes on to its end" if owner and until >= now else ""
    )
    return _done(
        job, "job_paused", f"paused {job.name}: no run starts until it is resumed{running}"
    )


def resume(job: Job, *, from_now: bool = False, by: str = OPERATOR) -> Operated:
    """Resume ``job``: it runs from its next slot, or at a runner's next pass when slots
    fell due while it was paused: they catch up by the job's ``catchup`` policy (one run
    for them all, by default). ``from_now``: those slots are skipped instead, recorded as
    one skipped run by ``by`` (the latest of them, counting the others), and the job runs
    from its next slot after now."""
    now = _seen(job)
    before = _row(job)[3]
    skipped: list[int] = []
    if from_now:
        upcoming = job.valid_schedule.next_after(now)

        def record() -> None:
            why = "the job was resumed from now"
            skipped.append(_record_skipped(job, before, upcoming, now, by=by, why=why))

        if job.parent is None:
            change = operations.resume_from_now(
                job.name, now, upcoming, then=record if before <= now else None
            )
        else:  # the instance's flag, then its row moved past the due slots

            def skip_due() -> None:
                if operations.skip_due(job.name, now, upcoming, then=record) is Change.BUSY:
                    _refuse_if_locked(job, Change.BUSY)

            change = _set_paused(job, False, then=skip_due if before <= now else None)
    else:
        change = _set_paused(job, False)
    _refuse_if_locked(job, change)
    if not change:
        return Operated(job.name, False, f"{job.name} is not paused: nothing changed")
    if job.parent is not None and _row(job)[0]:  # still paused: disabled (or invalid)
        return _done(
            job,
            "job_resumed",
            f"resumed {job.name}{_from_now(skipped)}: it is disabled, so no run starts until "
            "it is enabled",
        )
    if sum(skipped):
        return _done(
            job,
            "job_resumed",
            f"resumed {job.name} from now: {sum(skipped)} slot(s) due while it was paused skipped "
            f"(recorded skipped); next run {format_with_utc(upcoming, job.valid_schedule.tz)}",
        )
    _, _, _, next_run_at = _row(job)
    when = format_with_utc(next_run_at, job.valid_schedule.tz)
    if next_run_at <= now:
        then = f"due since {when}: a runner's next pass runs it"
    else:
        then = f"next run {when} (in {format_wait(next_run_at - now)})"
    return _done(job, "job_resumed", f"resumed {job.name}: {then}")


def _from_now(skipped: list[int]) -> str:
    if not sum(skipped):
        return ""
    return f" from now: {sum(skipped)} slot(s) due while it was paused skipped (recorded skipped)"


def _set_paused(job: Job, paused: bool, *, then: operations.Then = None) -> Change:
    """Pause or resume ``job``: its lease row, or an instance's own flag (its lease row
    follows, :func:`operations.set_instance_paused`)."""
    if job.parent is None or job.key is None:
        return operations.set_paused(job.name, paused)
    return operations.set_instance_paused(job.parent, job.key, paused, then=then)


def _instance_paused(job: Job) -> bool:
    """The instance ``job`` is paused by an operator (and enabled)."""
    return (
        JobInstance.objects.using(db.lease_db())
        .filter(job=job.parent, key=job.key, enabled=True, paused=True)
        .exists()
    )


def _record_skipped(
    job: Job, first: datetime, until: datetime, now: datetime, *, by: str, why: str
) -> int:
    """Record the slots from ``first`` to ``until`` (excluded) that ``by`` skipped: one run
    of outcome ``skipped`` for the latest, its ``missed_slots`` counting the others. In
    the transaction that moved the row past them. Returns how many."""
    later = job.valid_schedule.fire_times(first, until, limit=slots.MAX_COUNTED_SLOTS)
    due = [slot for slot in (first, *later) if slot < until]
    if not due:
        return 0
    error = f"skipped by {by}: {why} ({len(due)} slot(s))"
    _skipped_run(job, due[-1], 1, now, by, error, counted=len(due) - 1)
    return len(due)


def _skipped_run(
    job: Job, slot: datetime, attempt: int, now: datetime, by: str, error: str, counted: int = 0
) -> None:
    """One run of outcome ``skipped``: ``attempt`` of ``slot``, counting ``counted`` earlier
    slots; nothing when that attempt is recorded already."""
    with contextlib.suppress(IntegrityError), transaction.atomic(using=db.lease_db()):
        JobRun.objects.using(db.lease_db()).create(
            job=job.name,
            scheduled_for=slot,
            attempt=attempt,
            finished_at=now,
            outcome=Outcome.SKIPPED,
            owner=by[:200],
            missed_slots=counted,
            error=error,
        )


def _skip(job: Job, row: LeaseRow, target: datetime, now: datetime, by: str) -> operations.Change:
    """Move ``row`` past its next slot to ``target`` and record what that skipped, in one
    transaction: a pending retry (its attempt, skipped), and the slots from the next one
    up to ``target``."""

    def record() -> None:
        first = row.next_run_at
        if row.run_slot is not None:  # a failed slot's retry was next: that attempt is skipped
            error = f"skipped by {by}: the retry of a failed attempt was next"
            _skipped_run(job, row.run_slot, row.attempt, now, by, error)
            first = job.valid_schedule.next_after(row.run_slot)
        _record_skipped(job, first, target, now, by=by, why="its next run was skipped")

    return operations.skip_slot(row, next_run_at=target, then=record)


def skip_next_slot(job: Job, *, by: str = OPERATOR) -> Operated:
    """Skip ``job``'s next run: its next slot moves to the first fire time after that slot,
    or, when the job is due (slots it did not run yet, a paused job's included), after now.
    A run in progress goes on; the slot skipped is the one after it. A pending retry of a
    failed slot is skipped the same way. What was skipped is recorded, by ``by``
    (:func:`_record_skipped`)."""
    schedule = job.valid_schedule
    _seen(job)
    for _ in range(SKIP_ATTEMPTS):
        now = clock.now()
        row = lease.read([job.name])[job.name]
        target = schedule.next_after(max(row.next_run_at, now))
        change = _skip(job, row, target, now, by)
        _refuse_if_locked(job, change)
        if change:
            slot = format_with_utc(row.next_run_at, schedule.tz)
            skipped = f"the run due since {slot}" if row.next_run_at <= now else f"the slot {slot}"
            paused = "; it is paused: it runs then only if resumed" if row.paused else ""
            return _done(
                job,
                "next_slot_skipped",
                f"skipped {skipped} of {job.name}: next run {format_with_utc(target, schedule.tz)} "
                f"(in {format_wait(target - now)}){paused}",
            )
    # A run took the job between each read and its change (or its slot kept moving).
    raise JobBusy(
        f"job {job.name!r} is busy: its next slot moved on {SKIP_ATTEMPTS} times while "
        "skipping it (runs are starting); nothing changed, try again"
    )


#: The key of ``job[*]``: every instance of the job.
EVERY_INSTANCE = "*"


@dataclass
class Tally:
    """What one operation did to every instance of a job (``jobctl pause 'job[*]'``)."""

    job: str
    changed: int = 0
    unchanged: int = 0
    #: Invalid instances: not operated on (they do not run; fix them first).
    invalid: int = 0
    #: The instances whose lease row stayed locked: nothing changed for them.
    busy: list[str] = field(default_factory=list)

    def line(self, verb: str, already: str) -> str:
        total = self.changed + self.unchanged + self.invalid + len(self.busy)
        if not total:
            return f"{self.job} has no instances: nothing changed"
        parts = [f"{self.unchanged} {already}"] if self.unchanged else []
        if self.invalid:
            parts.append(f"{self.invalid} invalid, not changed")
        if self.busy:
            parts.append(f"{len(self.busy)} busy, not changed")
        rest = f" ({'; '.join(parts)})" if parts else ""
        return f"{verb} {self.changed} of {total} instance(s) of {self.job}{rest}"


def every_instance(name: str) -> Iterator[Job] | None:
    """Every instance of the job ``job[*]`` names, as the jobs they run as, in key order;
    None when ``name`` is not of that form (:class:`UnknownJob` when the job is not declared
    with ``instances=True``). Read in chunks: any number of instances."""
    parsed = instances.parse_name(name)
    if parsed is None or parsed[1] != EVERY_INSTANCE:
        return None
    base = instances.declared(parsed[0])
    rows = instances.Instances(base.name).all().order_by("key").iterator(chunk_size=1000)
    return (instances.instance_job(base, row) for row in rows)


def operate_each(jobs: Iterable[Job], operate: Callable[[Job], Operated], job: str) -> Tally:
    """``operate`` on each of ``jobs`` (every instance of ``job``), each in its own
    transaction: an instance whose lease row stays locked is counted busy, and the others
    are operated on all the same."""
    tally = Tally(job)
    for each in jobs:
        if each.schedule is None:
            tally.invalid += 1
            continue
        try:
            done = operate(each)
        except JobBusy:
            tally.busy.append(each.name)
            continue
        if done.changed:
            tally.changed += 1
        else:
            tally.unchanged += 1
    return tally


def _done(job: Job, event: str, line: str) -> Operated:
    """A change made: logged (``event``, ``job``), and said in ``line``."""
    logger.info("%s", line, extra={"event": event, "job": job.name})
    return Operated(job.name, True, line)


def _seen(job: Job) -> datetime:
    """Now; and the job's lease row, created if no runner has seen the job yet."""
    now = clock.now()
    declared.sync([job], now)
    return now


def _row(job: Job) -> tuple[bool, str, datetime, datetime]:
    """The job's paused flag, lease owner, lease expiry and next slot."""
    found: tuple[bool, str, datetime, datetime] = (
        JobLease.objects.using(db.lease_db())
        .filter(name=job.name)
        .values_list("paused", "owner", "lease_until", "next_run_at")
        .get()
    )
    return found


def _refuse_if_locked(job: Job, change: operations.Change) -> None:
    if change is operations.Change.BUSY:
        raise JobBusy(
            f"job {job.name!r} is busy: a run is inside a fenced transaction on its lease row, "
            f"which stayed locked for {db.LOCK_WAIT:g}s; nothing changed, try again"
        )


__all__ = [
    "JobBusy",
    "Operated",
    "Tally",
    "every_instance",
    "operate_each",
    "pause",
    "resume",
    "run_now",
    "skip_next_slot",
]
