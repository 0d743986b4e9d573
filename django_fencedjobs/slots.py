"""Which slot a due lease row runs for, and where the row moves when it is taken: one
function, :func:`plan`, for every way a row becomes due (docs/time.md tells them at length).

* **the schedule**: the fire times passed since ``next_run_at``, run by the job's
  ``catchup`` policy (``"coalesce"``: one run for the latest, its interval covering them
  all; ``"each"``: a run per slot, oldest first, the latest ``catchup_limit`` of them;
  ``"latest"``: the latest alone). Slots are :meth:`Schedule.fire_times
  <django_fencedjobs.schedule.Schedule.fire_times>`, so DST is what the schedule says.
* **a retry** (``run_slot`` set on a scheduled row, :mod:`django_fencedjobs.retries`): the
  failed slot again over the same interval, unless a later slot is due by now: that slot
  runs instead and the retry is dropped (a retry never runs at or past the next slot).
* **a backfill slot or one-off** (:mod:`django_fencedjobs.oneshots`): its ``run_slot``, as
  its next attempt; the row stays due while its run holds it, so a run whose runner died
  is run again once its lease expires.

Neither a retry nor a one-shot's next attempt runs when it would redo fenced work that the
attempt before it committed and did not ask to redo (it timed out, or its runner died
before recording its end), unless a watermark says where that work stopped: the attempt is
recorded skipped instead (:attr:`Slot.not_run`, docs/time.md). Nor does a slot that a
calendar of the job excludes (:mod:`django_fencedjobs.calendars`): it is recorded excluded,
and with ``defer_excluded`` its run is due at the next time the calendars allow, as the
slot's next attempt: the row holds it as it holds a retry (``run_slot``), so it is claimed,
superseded and fenced like one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime

from django_fencedjobs import calendars, outcomes, retries
from django_fencedjobs.db import lease_db
from django_fencedjobs.lease import LeaseRow
from django_fencedjobs.models import FAILURE_OUTCOMES, JobRun, Outcome, RunKind
from django_fencedjobs.registry import Job
from django_fencedjobs.schedule import Schedule

#: Missed slots are counted up to this many; past it the count says "at least".
MAX_COUNTED_SLOTS = 10_000


@dataclass(frozen=True)
class Slot:
    """A run's slot, and what taking its lease writes on the row."""

    scheduled_for: datetime
    #: Earlier due slots coalesced into this run, or skipped (a retry's: 0, its first
    #: attempt counted them).
    missed: int
    #: The data interval's start, when it is not the slot before (a coalesced run's).
    interval_start: datetime | None
    attempt: int
    kind: str
    #: The row's ``next_run_at``, ``run_slot`` and ``attempt`` once taken.
    next_run_at: datetime
    run_slot: datetime | None
    next_attempt: int
    #: A later slot supersedes a pending retry: the failed attempt, not counted while its
    #: retry was pending, is counted towards ``consecutive_failures`` when the row is taken.
    dropped_retry: bool = False
    #: The attempt is recorded, not run: its outcome and why. ``skipped``: it would redo
    #: the committed work of the attempt before it (:func:`~django_fencedjobs.retries.redoes`);
    #: ``excluded``: a calendar of the job excludes its slot (:mod:`.calendars`);
    #: ``failed``: a calendar it names does not exist.
    not_run: tuple[str, str] | None = None
    #: When the run was due, from which ``starting_deadline`` counts (None: its slot): a
    #: retry's backoff's end, the instant an excluded slot was deferred to.
    due: datetime | None = None


def plan(job: Job, row: LeaseRow, now: datetime, *, resumable: bool = False) -> Slot:
    """The slot ``row`` (due at ``now``) runs for, by the job's catch-up policy.
    ``resumable``: the row keeps a watermark, from which a second attempt resumes."""
    slot = _plan(job, row, now, resumable)
    if job.exclude and slot.not_run is None and slot.attempt == 1 and row.kind != RunKind.ONCE:
        # A slot of the schedule (a backfill's too), not a retry of one that was allowed.
        book, scheduled = calendars.load(job.exclude), row.kind == RunKind.SCHEDULED
        verdict = calendars.judge(book, job, slot.scheduled_for, now=now, defer=scheduled)
        if verdict is None:
            return slot
        slot = dataclasses.replace(slot, not_run=(verdict.outcome, verdict.why))
        if verdict.deferred_to is not None:
            # Its run is due at the deferred instant, as the slot's next attempt.
            return dataclasses.replace(
                slot, next_run_at=verdict.deferred_to, run_slot=slot.scheduled_for, next_attempt=2
            )
    return slot


def _plan(job: Job, row: LeaseRow, now: datetime, resumable: bool) -> Slot:
    schedule = job.valid_schedule
    redoes = None if resumable else retries.redoes(job, row)
    not_run = None if redoes is None else (Outcome.SKIPPED, outcomes.not_run_again(redoes))
    if row.kind != RunKind.SCHEDULED:
        if row.run_slot is None:  # written with its slot, always: a row made by hand
            raise ValueError(f"{row.name}: a {row.kind} row without its run_slot")
        return Slot(
            row.run_slot,
            0,
            None,
            row.attempt,
            row.kind,
            next_run_at=row.next_run_at,
            run_slot=row.run_slot,
            next_attempt=row.attempt + 1,
            dropped_retry=redoes in FAILURE_OUTCOMES,
            not_run=not_run,
        )
    after = schedule.next_after(now)
    first = row.next_run_at
    dropped = False
    if row.run_slot is not None:
        # A retry, or an excluded slot's deferred run (its first attempt, recorded excluded).
        pending = retries.pending(job, row.run_slot, row.attempt)
        # The slots after the latest one recorded: an operator may have skipped some while
        # the attempt ran (the retry's statement then moved the row back to the retry).
        later = schedule.fire_times(pending.latest, now, limit=1)
        if not later or pending.deferred:
            # Nothing later due yet: it runs, over the same interval. A deferred run runs
            # even when the runners come to it late, the slots due since it after it: its
            # slot has no other account.
            start, nxt = pending.interval_start, later[0] if later else after
            slot = row.run_slot, 0, start, row.attempt, RunKind.SCHEDULED, nxt, None, 1
            due = row.next_run_at  # its backoff's end, or the instant it was deferred to
            return Slot(*slot, dropped_retry=redoes is not None, not_run=not_run, due=due)
        first, dropped = later[0], True  # a later slot supersedes the retry
    count, tail = _due(schedule, first, now, keep=job.catchup_limit if job.catchup == "each" else 1)
    if job.catchup == "each":
        nxt = tail[1] if len(tail) > 1 else after
        oldest = Slot(tail[0], count - len(tail), None, 1, RunKind.SCHEDULED, nxt, None, 1, dropped)
        return _skipped_if_overlapping(job, oldest)
    coalesced = count > 1 and job.catchup == "coalesce"
    start = schedule.previous_before(first) if coalesced else None
    latest = Slot(tail[-1], count - 1, start, 1, RunKind.SCHEDULED, after, None, 1, dropped)
    return _skipped_if_overlapping(job, latest)


def _skipped_if_overlapping(job: Job, slot: Slot) -> Slot:
    """``overlap="skip"``: a slot that came while a run of the job was going (one that ran
    to an end: a dead one's slot is not lost) is recorded skipped, naming that run."""
    if job.overlap != "skip":
        return slot
    during = (
        JobRun.objects.using(lease_db())
        .filter(job=job.name, kind=RunKind.SCHEDULED, started_at__lt=slot.scheduled_for)
        .filter(finished_at__gte=slot.scheduled_for)
        .exclude(outcome=Outcome.ABANDONED)
        .values_list("scheduled_for", flat=True)
        .first()
    )
    if during is None:
        return slot
    why = f"Not run: the run of {during.isoformat()} was still going (overlap='skip')."
    return dataclasses.replace(slot, not_run=(Outcome.SKIPPED, why))


def _due(
    schedule: Schedule, first: datetime, now: datetime, *, keep: int
) -> tuple[int, list[datetime]]:
    """How many slots are due from ``first`` (itself due) to ``now``, and the latest
    ``keep`` of them, oldest first. Counted up to :data:`MAX_COUNTED_SLOTS`."""
    later = schedule.fire_times(first, now, limit=MAX_COUNTED_SLOTS)
    if len(later) < MAX_COUNTED_SLOTS:
        due = [first, *later]
        return len(due), due[-keep:]
    # A very long outage: find the latest slots by widening a window back from now.
    span = schedule.min_interval() * keep
    while True:
        recent = schedule.fire_times(max(now - span, first), now)
        if len(recent) >= keep or now - span <= first:
            return MAX_COUNTED_SLOTS, recent[-keep:]
        span *= 2


__all__ = ["MAX_COUNTED_SLOTS", "Slot", "plan"]
