"""Run retention: the runner deletes old runs itself, a little at a time.

A run is deleted when it is older than ``FENCEDJOBS["RUN_RETENTION"]`` (by
``scheduled_for``) *and* is not among the newest ``RUNS_KEPT_PER_JOB`` runs of its job,
and is not still running. So a job that runs once a month keeps its history, and a job
that runs every minute keeps a month of it.

Deleting is bounded: at most :data:`MAX_BATCHES` statements of at most :data:`BATCH_SIZE`
ids each per call, each in its own short transaction, never one statement over the whole
table (which would hold locks and bloat the WAL for as long as it ran). A backlog (a first
deployment over years of history) drains over successive calls.

The runner calls :func:`purge_runs` after a tick (``signals.tick_finished``), at most once
per :data:`INTERVAL` per process (of real, monotonic time: a fake clock jumping in tests
does not trigger a purge per jump). Processes racing to purge are harmless: deleting an id
twice deletes it once.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta
from typing import Any

from django.db.models import OuterRef, Subquery
from django.dispatch import receiver

from django_fencedjobs import signals
from django_fencedjobs.conf import get_settings
from django_fencedjobs.db import lease_db
from django_fencedjobs.models import JobRun, Outcome

logger = logging.getLogger("django_fencedjobs")

#: Ids per DELETE statement.
BATCH_SIZE = 1000
#: DELETE statements per call.
MAX_BATCHES = 10
#: A process purges at most once per this much (monotonic) time.
INTERVAL = timedelta(minutes=10)

_lock = threading.Lock()
_last_purge: float | None = None


def purge_runs(
    now: datetime, *, batch_size: int = BATCH_SIZE, max_batches: int = MAX_BATCHES
) -> int:
    """Delete expired runs, at most ``batch_size * max_batches`` of them; return how many."""
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
    deleted = 0
    for _ in range(max_batches):
        ids = list(expired.order_by("scheduled_for").values_list("pk", flat=True)[:batch_size])
        if not ids:
            break
        # The runs' task records (RunTask) go with them; only the runs are counted.
        _, by_model = JobRun.objects.using(alias).filter(pk__in=ids).delete()
        deleted += by_model.get(JobRun._meta.label, 0)
        if len(ids) < batch_size:
            break
    if deleted:
        logger.info(
            "deleted %d run(s) older than %s",
            deleted,
            settings.RUN_RETENTION,
            extra={"event": "runs_purged", "deleted": deleted, "cutoff": cutoff.isoformat()},
        )
    return deleted


def reset_throttle() -> None:
    """Forget when this process last purged, so the next tick purges (tests)."""
    global _last_purge
    with _lock:
        _last_purge = None


def _due() -> bool:
    global _last_purge
    with _lock:
        current = time.monotonic()
        if _last_purge is not None and current - _last_purge < INTERVAL.total_seconds():
            return False
        _last_purge = current
        return True


@receiver(signals.tick_finished, dispatch_uid="django_fencedjobs.retention")
def purge_after_tick(*, now: datetime, **kwargs: Any) -> None:
    if _due():
        purge_runs(now)
