"""Retries: a failed run's slot is tried again, through the lease, before the next slot.

A failed or timed-out run asks for its next attempt (:func:`next_attempt`) and the
statement that releases its lease schedules it (:func:`django_fencedjobs.lease.end`), only
if the end plus the backoff is before the row's next slot: a retry never runs at or past
it. Attempt ``n`` waits ``retry_backoff * 2 ** (n - 1)`` (30 s, 1 min, 2 min... by
default); a retried failure does not count towards ``consecutive_failures``. A retry
redoes exactly its attempt's data interval (:func:`pending`). One that would redo
work its attempt committed before timing out is recorded, not run (:func:`redoes`).
"""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from django.db.models import Max, Q

from django_fencedjobs.db import lease_db
from django_fencedjobs.lease import LeaseRow, Retry
from django_fencedjobs.models import FAILURE_OUTCOMES, JobRun, Outcome, RunKind
from django_fencedjobs.registry import Job

#: Backoff doubles at most this many times.
MAX_DOUBLINGS = 20


def next_attempt(job: Job, record: JobRun, outcome: str) -> Retry | None:
    """The retry a run of ``job`` that ended ``outcome`` asks for, or None."""
    if outcome not in FAILURE_OUTCOMES or job.retries < 1:
        return None
    tried = _tried(record)
    if tried > job.retries:
        return None
    backoff = job.retry_backoff * 2 ** min(tried - 1, MAX_DOUBLINGS)
    return Retry(backoff=backoff, slot=record.scheduled_for, attempt=record.attempt + 1)


class Pending(NamedTuple):
    """What the records of a slot say of its pending attempt (a retry, or an excluded
    slot's deferred run): :func:`pending`."""

    #: The outcome of the attempt before it (``excluded``: the slot was deferred), None
    #: when its record is gone.
    before: str | None
    #: Where that attempt's data interval started, which a retry redoes (None: the slot
    #: before).
    interval_start: datetime | None
    #: The latest slot of the schedule recorded at or after this one (run, or skipped by an
    #: operator): what the pending attempt comes after.
    latest: datetime

    @property
    def deferred(self) -> bool:
        return self.before == Outcome.EXCLUDED


def pending(job: Job, slot: datetime, attempt: int) -> Pending:
    """The records of ``job`` from ``slot`` on, read for its pending ``attempt`` at ``slot``
    in one query. Each aggregate over the attempt before it reads one row: ``(job,
    scheduled_for, attempt)`` is unique."""
    before = Q(scheduled_for=slot, attempt=attempt - 1)
    found = (
        JobRun.objects.using(lease_db())
        .filter(job=job.name, scheduled_for__gte=slot)
        .aggregate(
            before=Max("outcome", filter=before),
            start=Max("interval_start", filter=before),
            latest=Max("scheduled_for", filter=Q(kind=RunKind.SCHEDULED)),
        )
    )
    return Pending(found["before"], found["start"], found["latest"] or slot)


#: The ends a handler chose, after which running its slot again is what it asked for: it
#: raised (``retries=`` tries again), or it stopped between batches when asked (its batches
#: resume). After any other end its committed work stands, and is not redone by accident.
_ASKED_AGAIN = frozenset({Outcome.FAILED, Outcome.INTERRUPTED})


def redoes(job: Job, row: LeaseRow) -> str | None:
    """Whether running the slot of ``row`` (a retry, a backfill slot's or one-off's next
    attempt) would redo fenced work that an attempt at it committed: that attempt's outcome
    (``running``: its runner died before recording its end), or None to run it. The row's
    ``committed_fence`` names the attempt whose work committed last
    (:func:`~django_fencedjobs.lease.lock_fence`); an end it chose (:data:`_ASKED_AGAIN`)
    asks for the slot again."""
    if row.committed_fence is None or row.run_slot is None:
        return None
    outcome: str | None = (
        JobRun.objects.using(lease_db())
        .filter(job=job.name, kind=row.kind, scheduled_for=row.run_slot, fence=row.committed_fence)
        .values_list("outcome", flat=True)
        .first()
    )
    return None if outcome is None or outcome in _ASKED_AGAIN else outcome


def _tried(record: JobRun) -> int:
    """The tries of the run's slot of its kind, this one included: its failed runs before
    it (attempt numbers count more: a deferred slot's first attempt was recorded excluded,
    a backfill's start after the slot's earlier runs)."""
    earlier = (
        JobRun.objects.using(record._state.db)
        .filter(
            job=record.job,
            scheduled_for=record.scheduled_for,
            kind=record.kind,
            outcome__in=FAILURE_OUTCOMES,
        )
        .exclude(pk=record.pk)
        .count()
    )
    return earlier + 1


#: The outcomes that end a backfill slot or one-off (unless a retry follows): it is done.
#: An interrupted run (the runner was stopping) or one that lost its lease is not.
FINAL_OUTCOMES = frozenset({"succeeded", "failed", "timed_out", "missed"})

__all__ = [
    "FINAL_OUTCOMES",
    "MAX_DOUBLINGS",
    "Pending",
    "next_attempt",
    "pending",
    "redoes",
]
