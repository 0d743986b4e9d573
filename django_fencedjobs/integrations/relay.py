"""The relay: tasks recorded in a run's transaction are handed to their backend until it
takes them.

A task for a backend that does not write to the lease database (RQ, Celery, Redis, or
django-tasks-db on another database) is recorded ``pending`` in the run's fenced
transaction, with its call (:attr:`RunTask.call <django_fencedjobs.models.RunTask.call>`):
the records are an outbox. Right after that transaction commits, the run's process hands
them over (:func:`deliver`). If that fails (the backend is down) or the process dies before
it, the record stays ``pending``, and any runner's relay hands it over later
(``integrations.tasks.relay_pending``, a runner's chore: after each pass, at most once per
:data:`RELAY_EVERY`, for a task pending ``FENCEDJOBS["TASK_HANDOVER_GRACE"]`` after its
commit), with backoff, up
to :data:`MAX_HANDOVERS` times; then the task is recorded failed with the reason, and the
job reads failing. Never silently pending.

Each hand-over is claimed first, by a compare-and-set on the record's count of hand-overs:
two processes never hand the same record over at once. A hand-over that reached the
backend but died before its id was recorded is handed over again when the relay finds it
(``TASK_HANDOVER_GRACE`` after it began): the backend then holds two deliveries of one task. That is
what makes delivery *at least once*; the worker side makes the writes *at most once*: the
first execution of the task whose fenced block commits claims the record
(:attr:`RunTask.executor <django_fencedjobs.models.RunTask.executor>`, in that block's
transaction), and every other delivery's ``fenced_atomic()`` raises
:class:`~django_fencedjobs.exceptions.DuplicateDelivery` before writing
(:mod:`django_fencedjobs.integrations.tasks`). Together: effectively once.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any

from django.db.models import F

from django_fencedjobs import clock, db
from django_fencedjobs.conf import get_settings
from django_fencedjobs.models import RunTask, TaskDelivery, TaskStatus
from django_fencedjobs.text import bounded, one_line

logger = logging.getLogger("django_fencedjobs")

#: After this many failed hand-overs the task is recorded failed.
MAX_HANDOVERS = 8
#: The wait after the first failed hand-over; it doubles after each.
BACKOFF = timedelta(seconds=5)
#: How often a runner looks for tasks to relay, at most (seconds of real time).
RELAY_EVERY = 5.0
#: At most this many tasks per look.
RELAY_BATCH = 100


def backoff(handovers: int) -> timedelta:
    """The wait before hand-over ``handovers + 1``."""
    doublings = min(max(handovers - 1, 0), 16)
    return BACKOFF * (1 << doublings)


def deliver(record: RunTask, task: Any, context: AbstractContextManager[Any]) -> Any | None:
    """Hand ``record``'s task over once, if no other process is, inside ``context`` (what
    a backend that runs the task at once needs of its run): the backend's result, or None
    when another process claimed this hand-over or the backend refused it (then the record
    says why, and when it is tried again, or that it failed for good)."""
    alias = db.lease_db()
    rows = RunTask.objects.using(alias).filter(pk=record.pk)
    now = clock.now()
    claimed = rows.filter(status=TaskStatus.PENDING, handovers=record.handovers).update(
        # A hand-over in progress is not tried by another process before this.
        handovers=F("handovers") + 1,
        handover_after=now + get_settings().TASK_HANDOVER_GRACE,
    )
    if not claimed:
        return None
    record.handovers += 1
    call = record.call or {}
    try:
        with context:
            result = task.enqueue(*call.get("args", ()), **call.get("kwargs", {}))
    except Exception as exc:
        refused(record, exc)
        return None
    TaskDelivery.objects.using(alias).create(
        task_id=record.pk,
        backend=record.backend,
        result_id=str(result.id),
        delivered_at=clock.now(),
    )
    return result


def refused(record: RunTask, exc: Exception) -> None:
    rows = RunTask.objects.using(db.lease_db()).filter(pk=record.pk, status=TaskStatus.PENDING)
    why = f"the backend {record.backend!r} did not take the task: {type(exc).__name__}: "
    why += one_line(exc)
    if record.handovers >= MAX_HANDOVERS:
        rows.update(
            status=TaskStatus.FAILED,
            finished_at=clock.now(),
            error=bounded(f"Not enqueued after {record.handovers} hand-overs: {why}", 2000),
        )
        logger.error(
            "task %s of %s not enqueued after %d hand-overs, recorded failed: %s",
            record.task_path,
            record.job,
            record.handovers,
            why,
            extra={"event": "task_not_enqueued", "job": record.job},
        )
        return
    after = clock.now() + backoff(record.handovers)
    rows.update(handover_after=after, error=bounded(f"Hand-over {record.handovers}: {why}", 2000))
    logger.warning(
        "task %s of %s: hand-over %d failed, next at %s: %s",
        record.task_path,
        record.job,
        record.handovers,
        after.isoformat(),
        why,
        extra={"event": "task_handover_failed", "job": record.job},
    )


def pending(now: datetime, limit: int = RELAY_BATCH) -> list[RunTask]:
    """The tasks due for a hand-over: pending, their next hand-over time passed."""
    return list(
        RunTask.objects.using(db.lease_db())
        .filter(status=TaskStatus.PENDING, handover_after__lte=now)
        .order_by("handover_after")[:limit]
    )
