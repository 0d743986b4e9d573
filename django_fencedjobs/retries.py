"""Retries: a failed run's slot is tried again, through the lease, before the next slot.

A failed or timed-out run asks for its next attempt (:func:`next_attempt`) and the
statement that releases its lease schedules it (:func:`django_fencedjobs.lease.end`), only
if the end plus the backoff is before the row's next slot: a retry never runs at or past
it. Attempt ``n`` waits ``retry_backoff * 2 ** (n - 1)`` (30 s, 1 min, 2 min... by
default); a retried failure does not count towards ``consecutive_failures``. A retry
redoes exactly its attempt's data interval (:func:`attempt_before`). One that would redo
work its attempt committed before timing out is recorded, not run (:func:`redoes`).
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Max

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


def attempt_before(job: Job, slot: datetime, attempt: int) -> tuple[str, datetime | None] | None:
    """The outcome of ``job``'s attempt before ``attempt`` at ``slot`` (``excluded``: the
    slot was deferred), and where its data interval started, which a retry redoes (None:
    the slot before). None when its record is gone."""
    found: tuple[str, datetime | None] | None = (
        JobRun.objects.using(lease_db())
        .filter(job=job.name, scheduled_for=slot, attempt=attempt - 1)
        .values_list("outcome", "interval_start")
        .first()
    )
    return found


def latest_recorded(job: Job, slot: datetime) -> datetime:
    """The latest slot of ``job``'s schedule recorded at or after ``slot`` (run, or skipped
    by an operator): what a pending retry of ``slot`` comes after."""
    latest: datetime | None = (
        JobRun.objects.using(lease_db())
        .filter(job=job.name, kind=RunKind.SCHEDULED, scheduled_for__gte=slot)
        .aggregate(latest=Max("scheduled_for"))["latest"]
    )
    return latest or slot


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
    "attempt_before",
    "latest_recorded",
    "next_attempt",
    "redoes",
]
