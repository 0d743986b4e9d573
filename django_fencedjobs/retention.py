"""Run retention: the runner deletes old runs itself, a little at a time.

A run goes when it is older than ``RUN_RETENTION`` (by ``scheduled_for``), is not among the
newest ``RUNS_KEPT_PER_JOB`` of its job, and is not running. Deleting is bounded: at most
:data:`MAX_BATCHES` statements of :data:`BATCH_SIZE` ids per call, each its own short
transaction, never one statement over the table (it would hold locks and bloat the WAL). A
runner purges as a chore (:class:`Retention`), on monotonic time (a fake clock's jumps do
not trigger purges), each turn for at most :data:`TURN_BUDGET`: chores run between passes,
so a turn is time due runs wait. Racing runners are harmless: an id deleted twice is
deleted once. Done one-shot rows and their backfills are pruned alike (:func:`purge_oneshots`).
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Exists, OuterRef, Subquery

from django_fencedjobs.conf import get_settings
from django_fencedjobs.db import lease_db
from django_fencedjobs.models import (
    Backfill,
    JobLease,
    JobNotice,
    JobRun,
    Outcome,
    RunKind,
    RunTask,
    TaskDelivery,
    Watermark,
)

logger = logging.getLogger("django_fencedjobs")

#: Ids per DELETE statement.
BATCH_SIZE = 1000
#: DELETE statements per call.
MAX_BATCHES = 10
#: A runner's loop purges at most once per this much (monotonic) time...
INTERVAL = timedelta(minutes=10)
#: ... but every this many seconds while a turn left expired runs behind.
BEHIND_EVERY = 2.0
#: A runner's turn deletes for at most this many seconds (the batch under way finishes).
TURN_BUDGET = 0.25


class Retention:
    """A runner's retention chore: :meth:`turn` every :data:`INTERVAL`, or every
    :data:`BEHIND_EVERY` while the last turn left expired runs behind (a backlog drains a
    quarter of a second at a time: benchmark P14)."""

    def __init__(self) -> None:
        self.behind = False

    def every(self) -> float:
        return BEHIND_EVERY if self.behind else INTERVAL.total_seconds()

    def turn(self, now: datetime) -> None:
        """Old runs, then done one-shot rows and their backfills."""
        _, self.behind = _purge_runs(now, BATCH_SIZE, MAX_BATCHES, TURN_BUDGET)
        purge_oneshots(now)


def purge_runs(
    now: datetime, *, batch_size: int = BATCH_SIZE, max_batches: int = MAX_BATCHES
) -> int:
    """Delete expired runs, at most ``batch_size * max_batches`` of them; return how many."""
    return _purge_runs(now, batch_size, max_batches, budget=None)[0]


def _purge_runs(
    now: datetime, batch_size: int, max_batches: int, budget: float | None
) -> tuple[int, bool]:
    """Delete expired runs, at most ``batch_size * max_batches`` of them and for at most
    ``budget`` seconds (if given): how many, and whether expired runs are left behind."""
    began = time.monotonic()
    settings = get_settings()
    alias = lease_db()
    cutoff = now - settings.RUN_RETENTION
    kept = settings.RUNS_KEPT_PER_JOB
    expired = (
        JobRun.objects.using(alias)
        .filter(scheduled_for__lt=cutoff)
        .exclude(outcome=Outcome.RUNNING)
    )
    if kept > 0:
        # The scheduled_for of the job's kept-th newest run: older runs are past the keep
        # window. NULL when the job has fewer runs, and "< NULL" matches nothing.
        kth_newest = (
            JobRun.objects.using(alias)
            .filter(job=OuterRef("job"))
            .order_by("-scheduled_for")
            .values("scheduled_for")[kept - 1 : kept]
        )
        expired = expired.filter(scheduled_for__lt=Subquery(kth_newest))
    deleted, behind = 0, False
    for _ in range(max_batches):
        ids = list(expired.order_by("scheduled_for").values_list("pk", flat=True)[:batch_size])
        if not ids:
            break
        # The runs' task records (RunTask) go with them, and those records' deliveries
        # (TaskDelivery, by id); only the runs are counted.
        tasks = RunTask.objects.using(alias).filter(run_id__in=ids).values("pk")
        TaskDelivery.objects.using(alias).filter(task_id__in=tasks).delete()
        _, by_model = JobRun.objects.using(alias).filter(pk__in=ids).delete()
        deleted += by_model.get(JobRun._meta.label, 0)
        if len(ids) < batch_size:
            break
        if budget is not None and time.monotonic() - began >= budget:
            behind = True  # out of time, at least one batch done
            break
    else:
        behind = True  # every batch full: more may have expired
    if deleted:
        logger.info(
            "deleted %d run(s) older than %s",
            deleted,
            settings.RUN_RETENTION,
            extra={"event": "runs_purged", "deleted": deleted, "cutoff": cutoff.isoformat()},
        )
    return deleted, behind


def purge_oneshots(
    now: datetime, *, batch_size: int = BATCH_SIZE, max_batches: int = MAX_BATCHES
) -> int:
    """Delete done backfill slots' and one-offs' rows older than ``RUN_RETENTION`` (with
    their watermarks and notices), at most ``batch_size * max_batches`` of them, then the
    backfills left without rows; return how many rows were deleted. A pending row is never
    deleted, however old its slot; nor one last due within the period (a slot of last year
    backfilled yesterday keeps its row, and its fence, for the period)."""
    settings = get_settings()
    alias = lease_db()
    cutoff = now - settings.RUN_RETENTION
    # Done (paused) one-shot rows only: a pending one runs whatever its slot's age. Its
    # next_run_at is when it was last due: its last run started about then.
    expired = JobLease.objects.using(alias).filter(
        kind__in=[RunKind.BACKFILL, RunKind.ONCE],
        paused=True,
        run_slot__lt=cutoff,
        next_run_at__lt=cutoff,
    )
    deleted = 0
    for _ in range(max_batches):
        batch = list(expired.order_by("run_slot").values_list("pk", "name")[:batch_size])
        if not batch:
            break
        names = [name for _, name in batch]
        with transaction.atomic(using=alias):
            Watermark.objects.using(alias).filter(job__in=names).delete()
            JobNotice.objects.using(alias).filter(job__in=names).delete()
            # Still done when deleted: a row re-armed meanwhile (backfilled again) stays.
            deleted += (
                JobLease.objects.using(alias)
                .filter(pk__in=[pk for pk, _ in batch], paused=True)
                .delete()[1]
                .get(JobLease._meta.label, 0)
            )
        if len(batch) < batch_size:
            break
    emptied = (
        Backfill.objects.using(alias)
        .filter(created_at__lt=cutoff)
        .filter(~Exists(JobLease.objects.filter(backfill=OuterRef("pk"))))
    )
    backfills = 0
    for _ in range(max_batches):
        ids = list(emptied.order_by("created_at").values_list("pk", flat=True)[:batch_size])
        if not ids:
            break
        # Without rows: deleting one cascades to nothing (a row queued meanwhile keeps it).
        backfills += emptied.filter(pk__in=ids).delete()[1].get(Backfill._meta.label, 0)
        if len(ids) < batch_size:
            break
    if deleted or backfills:
        logger.info(
            "deleted %d done backfill slot(s) and one-off(s), and %d backfill(s), older than %s",
            deleted,
            backfills,
            settings.RUN_RETENTION,
            extra={
                "event": "oneshots_purged",
                "deleted": deleted,
                "backfills": backfills,
                "cutoff": cutoff.isoformat(),
            },
        )
    return deleted
