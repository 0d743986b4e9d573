"""Operating a job by hand: run it now (``runjobs --now``, ``testing.run_job_now``), pause,
resume, skip its next slot (``manage.py jobctl``, the admin's actions).

A run now takes the real path: made due now, its lease taken by the same compare-and-set as
a scheduled run's (never overlapping another process's run), recorded, fenced. An
instance's pause is its own flag (``JobInstance.paused``), which its lease row follows, so
that a pause and *enabled* never undo each other. Pause, resume and skip wait for the lease
row at most :data:`~django_fencedjobs.db.LOCK_WAIT`: a run holding it longer inside a
fenced transaction raises :class:`JobBusy`, and nothing is changed. Every slot an operator
skips is recorded in the transaction that skips it (:func:`_record_skipped`).
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

#: How many times :func:`skip_next_slot` reads the row, when runs keep taking the job.
SKIP_ATTEMPTS = 3
#: Who skipped a slot, when the caller does not say (``manage.py jobctl`` and the admin do).
OPERATOR = "jobctl"


class JobBusy(FencedJobsError):
    """A run's fenced transaction kept the job's lease row locked past the bounded wait:
    nothing was changed. Try again in a moment."""


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
    Raises :class:`FencedJobsError`, saying why, when the job is paused or another run holds
    its lease; then it is not made due, so no run is left queued behind that one."""
    now = _seen(job)
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
    paused, owner, until, _ = _row(job)
    if paused and job.parent is None:
        raise FencedJobsError(
            f"job {job.name!r} is paused: resume it (`manage.py jobctl resume {job.name}`, or "
            "in the admin) to run it"
        )
    if paused and _instance_paused(job):
        raise FencedJobsError(
            f"instance {job.name!r} is paused: resume it (`manage.py jobctl resume "
            f"'{job.name}'`) to run it"
        )
    if paused:
        raise FencedJobsError(
            f"instance {job.name!r} is disabled or invalid: enable it (in the admin, or "
            f"with .instances.set_enabled) to run it"
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
    line = f"paused {job.name}: no run starts until it is resumed"
    if owner and until >= now:
        line += f"; the run in progress on {owner} goes on to its end"
    return _done(job, "job_paused", line)


def resume(job: Job, *, from_now: bool = False, by: str = OPERATOR) -> Operated:
    """Resume ``job``: slots that fell due while it was paused catch up by its ``catchup``
    policy at a runner's next pass; ``from_now``, they are skipped instead (recorded as
    skipped by ``by``) and it runs from its next slot after now."""
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
    count = sum(skipped)
    done = f"resumed {job.name}"
    if count:
        done += f" from now: {count} slot(s) due while it was paused skipped (recorded skipped)"
    paused, _, _, next_run_at = _row(job)
    if job.parent is not None and paused:  # still paused: disabled (or invalid)
        done += ": it is disabled, so no run starts until it is enabled"
    elif count:
        done += f"; next run {format_with_utc(upcoming, job.valid_schedule.tz)}"
    elif next_run_at <= now:
        when = format_with_utc(next_run_at, job.valid_schedule.tz)
        done += f": due since {when}: a runner's next pass runs it"
    else:
        when = format_with_utc(next_run_at, job.valid_schedule.tz)
        done += f": next run {when} (in {format_wait(next_run_at - now)})"
    return _done(job, "job_resumed", done)


def _set_paused(job: Job, paused: bool, *, then: operations.Then = None) -> Change:
    """Pause or resume ``job``'s lease row, or an instance's own flag (its row follows)."""
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
    """Record the slots in ``[first, until)`` that ``by`` skipped, in the transaction that
    moved the row past them: one ``skipped`` run for the latest, its ``missed_slots``
    counting the others. So every slot has a run that ran it, counted it, or says who
    skipped it. Returns how many."""
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
    """Move ``row`` to ``target`` and record, in that transaction, what it skipped: a pending
    retry's attempt, and the slots up to ``target``."""

    def record() -> None:
        first = row.next_run_at
        if row.run_slot is not None:  # a failed slot's retry was next: that attempt is skipped
            error = f"skipped by {by}: the retry of a failed attempt was next"
            _skipped_run(job, row.run_slot, row.attempt, now, by, error)
            first = job.valid_schedule.next_after(row.run_slot)
        _record_skipped(job, first, target, now, by=by, why="its next run was skipped")

    return operations.skip_slot(row, next_run_at=target, then=record)


def skip_next_slot(job: Job, *, by: str = OPERATOR) -> Operated:
    """Skip ``job``'s next run (a pending retry of a failed slot included): its next slot
    moves to the first fire time after that slot, or after now when it is due. A run in
    progress goes on. What was skipped is recorded as skipped by ``by``."""
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
    """The jobs every instance of ``job[*]`` runs as, in key order, read in chunks; None when
    ``name`` is not of that form (:class:`UnknownJob`: not declared with instances)."""
    parsed = instances.parse_name(name)
    if parsed is None or parsed[1] != EVERY_INSTANCE:
        return None
    base = instances.declared(parsed[0])
    rows = instances.Instances(base.name).all().order_by("key").iterator(chunk_size=1000)
    return (instances.instance_job(base, row) for row in rows)


def operate_each(jobs: Iterable[Job], operate: Callable[[Job], Operated], job: str) -> Tally:
    """``operate`` on each of ``jobs`` (the instances of ``job``), each in its own
    transaction: one whose lease row stays locked is counted busy, the others go on."""
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
    logger.info("%s", line, extra={"event": event, "job": job.name})
    return Operated(job.name, True, line)


def _seen(job: Job) -> datetime:
    """Now; and the job's lease row, created if no runner has seen the job yet."""
    now = clock.now()
    declared.sync([job], now)
    return now


def _row(job: Job) -> tuple[bool, str, datetime, datetime]:
    """The job's paused flag, lease owner, lease expiry and next slot."""
    return (
        JobLease.objects.using(db.lease_db())
        .filter(name=job.name)
        .values_list("paused", "owner", "lease_until", "next_run_at")
        .get()
    )


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
