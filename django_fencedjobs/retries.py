"""Retries: a failed run's slot is tried again, through the lease, before the next slot.

A run that failed or timed out asks for its next attempt when its end is recorded
(:func:`next_attempt`); the same statement that releases the lease schedules it
(:func:`django_fencedjobs.lease.end`): the row's ``next_run_at`` moves to the end plus
the backoff and ``run_slot`` to the failed slot, *only if that is before the row's next
slot*. So a retry never runs at or past the next slot: when the backoff would reach it,
there is no retry and the next slot runs as scheduled. The retry is acquired like any
run (a new fence, a new record with the next attempt number); if the runners are down
until the next slot is due, that slot runs instead (:func:`django_fencedjobs.slots.plan`).

Attempt ``n`` waits ``retry_backoff * 2 ** (n - 1)`` after attempt ``n``'s end: 30 s,
1 min, 2 min... by default. A failed attempt that is retried does not count towards
``consecutive_failures``: the slot is judged by its last attempt.

A retry redoes exactly the data interval of the attempt it retries
(:func:`interval_start`): when that attempt coalesced missed slots, so does its retry
(the slots are counted once, in the first attempt's ``missed_slots``).
"""

from __future__ import annotations

from datetime import datetime

from django_fencedjobs.db import lease_db
from django_fencedjobs.lease import Retry
from django_fencedjobs.models import FAILURE_OUTCOMES, JobRun, RunKind
from django_fencedjobs.registry import Job

#: Backoff doubles at most this many times.
MAX_DOUBLINGS = 20


def next_attempt(job: Job, record: JobRun, outcome: str) -> Retry | None:
    """The retry a run of ``job`` that ended ``outcome`` asks for, or None."""
    if outcome not in FAILURE_OUTCOMES or job.retries < 1:
        return None
    tried = record.attempt if record.kind == RunKind.SCHEDULED else _tried(record)
    if tried > job.retries:
        return None
    backoff = job.retry_backoff * 2 ** min(tried - 1, MAX_DOUBLINGS)
    return Retry(backoff=backoff, slot=record.scheduled_for, attempt=record.attempt + 1)


def interval_start(job: Job, slot: datetime, attempt: int) -> datetime | None:
    """Where the data interval of ``job``'s retry ``attempt`` of ``slot`` starts: where
    the attempt it retries (the one before) started, read from that attempt's record. None,
    as for any run, when it is the slot before (or the record is gone)."""
    return (
        JobRun.objects.using(lease_db())
        .filter(job=job.name, scheduled_for=slot, attempt=attempt - 1)
        .values_list("interval_start", flat=True)
        .first()
    )


def _tried(record: JobRun) -> int:
    """The attempts a backfill slot or one-off made, this one included: its failed runs
    before it (its attempt numbers start after the slot's earlier runs)."""
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

__all__ = ["FINAL_OUTCOMES", "MAX_DOUBLINGS", "interval_start", "next_attempt"]
