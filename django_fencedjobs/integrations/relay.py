"""The outbox of tasks handed over after the commit (docs/tasks.md: delivery guarantees).

A task for a backend that does not write to the lease database is recorded ``pending`` in
the run's fenced transaction, with its call. Right after the commit the run's process
hands the records over (``integrations.tasks.hand_over``); those still pending
``TASK_HANDOVER_GRACE`` later (the backend was down, the process died) are handed over by a
runner's relay (``integrations.tasks.relay_pending``), with backoff, up to
:data:`MAX_HANDOVERS` times, then recorded failed: never silently pending. Each hand-over
is claimed first (:func:`claim`), so two processes never hand one record over at once;
delivery is at least once, and the worker side makes the writes at most once.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import connections
from django.db.models import Case, CharField, F, Q, TextField, Value, When
from django.db.models.functions import Cast, Concat

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
#: At most this many tasks per look (handed over together, as a run's are).
RELAY_BATCH = 1000
#: At most this many records in one statement of the outbox (each is one parameter of it:
#: SQLite takes at most 32,766).
CLAIM_CHUNK = 5000


def backoff(handovers: int) -> timedelta:
    """The wait before hand-over ``handovers + 1``."""
    return BACKOFF * (1 << min(max(handovers - 1, 0), 16))


def claim(records: Sequence[RunTask]) -> list[RunTask]:
    """Claim the next hand-over of each of ``records`` that no other process has claimed:
    the records claimed, their ``handovers`` counted up. One ``UPDATE ... RETURNING`` per
    chunk of records with the same count.

    This compare-and-set keeps two hand-overs of one task apart: a record moves from
    ``handovers = n`` to ``n + 1`` in exactly one statement (on PostgreSQL a second one
    waits for the row lock, re-reads ``handovers`` and skips the row; SQLite has one writer
    at a time). It also moves the next hand-over ``TASK_HANDOVER_GRACE`` ahead, so no relay
    tries the record while this hand-over is under way."""
    if not records:
        return []
    connection = connections[db.lease_db()]
    table = connection.ops.quote_name(RunTask._meta.db_table)
    after = connection.ops.adapt_datetimefield_value(
        clock.now() + get_settings().TASK_HANDOVER_GRACE
    )
    won: set[int] = set()
    for count, group in _by_count(records).items():
        for chunk in _chunks(group, CLAIM_CHUNK):
            ids = ", ".join(["%s"] * len(chunk))
            with connection.cursor() as cursor:
                cursor.execute(
                    f"UPDATE {table} SET handovers = handovers + 1, handover_after = %s"
                    f" WHERE status = %s AND handovers = %s AND id IN ({ids}) RETURNING id",
                    [after, TaskStatus.PENDING.value, count, *(record.pk for record in chunk)],
                )
                won.update(row[0] for row in cursor.fetchall())
    claimed = [record for record in records if record.pk in won]
    for record in claimed:
        record.handovers += 1
    return claimed


def _by_count(records: Sequence[RunTask]) -> dict[int, list[RunTask]]:
    by_count: dict[int, list[RunTask]] = defaultdict(list)
    for record in records:
        by_count[record.handovers].append(record)
    return by_count


def _chunks(items: Sequence[RunTask], size: int) -> Iterator[Sequence[RunTask]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def will_deliver(records: Sequence[RunTask], prefix: str) -> None:
    """Record, before handing them over, the ids the backend will know ``records``' tasks
    by (``prefix`` and each record's id), so that a worker starting one at once finds its
    record. An id whose hand-over then fails stays, harmless, until retention."""
    now = clock.now()
    TaskDelivery.objects.using(db.lease_db()).bulk_create(
        TaskDelivery(
            task_id=record.pk,
            backend=record.backend,
            result_id=f"{prefix}{record.pk}",
            delivered_at=now,
        )
        for record in records
    )


def delivered(records: Sequence[RunTask], prefix: str) -> None:
    """Record that the backend took ``records``' tasks under the ids :func:`will_deliver`
    gave them, in one statement: each record's id, ``ready`` (forward only: a worker's
    report that landed meanwhile is kept)."""
    not_started = Q(status=TaskStatus.PENDING)
    rows, now = RunTask.objects.using(db.lease_db()), clock.now()
    for chunk in _chunks(records, CLAIM_CHUNK):
        rows.filter(pk__in=[record.pk for record in chunk]).update(
            result_id=Concat(Value(prefix), Cast("pk", output_field=CharField())),
            enqueued_at=now,
            # A failed hand-over's reason goes; a worker's report of the task is kept.
            error=Case(
                When(not_started, then=Value("")), default=F("error"), output_field=TextField()
            ),
            status=Case(When(not_started, then=Value(TaskStatus.READY.value)), default=F("status")),
        )


def refused(records: Sequence[RunTask], exc: BaseException) -> None:
    """Record that the backend did not take ``records``' tasks (their hand-over claimed):
    each is tried again after its backoff, or recorded failed after :data:`MAX_HANDOVERS`.
    One log line per count of hand-overs, however many tasks."""
    rows = RunTask.objects.using(db.lease_db()).filter(status=TaskStatus.PENDING)
    now = clock.now()
    for count, group in _by_count(records).items():
        first, failed, after = group[0], count >= MAX_HANDOVERS, now + backoff(count)
        why = f"the backend {first.backend!r} did not take the task: {type(exc).__name__}: "
        why += one_line(exc)
        if failed:
            error = f"Not enqueued after {count} hand-overs: {why}"
            changes: dict[str, Any] = {"status": TaskStatus.FAILED, "finished_at": now}
        else:
            error, changes = f"Hand-over {count}: {why}", {"handover_after": after}
        for chunk in _chunks(group, CLAIM_CHUNK):
            rows.filter(pk__in=[record.pk for record in chunk]).update(
                error=bounded(error, 2000), **changes
            )
        extra = {"job": first.job, "tasks": len(group)}
        if failed:
            logger.error(
                "%s not enqueued after %d hand-overs, recorded failed: %s",
                _which(group),
                count,
                why,
                extra={"event": "task_not_enqueued", **extra},
            )
        else:
            logger.warning(
                "%s: hand-over %d failed, next at %s: %s",
                _which(group),
                count,
                after.isoformat(timespec="seconds"),
                why,
                extra={"event": "task_handover_failed", **extra},
            )


def _which(records: Sequence[RunTask]) -> str:
    first = records[0]
    if len(records) == 1:
        return f"task {first.task_path} of {first.job}"
    return f"{len(records)} tasks ({first.task_path} of {first.job} first)"


def pending(now: datetime) -> list[RunTask]:
    """The tasks due for a hand-over: pending, their next hand-over time passed."""
    return list(
        RunTask.objects.using(db.lease_db())
        .filter(status=TaskStatus.PENDING, handover_after__lte=now)
        .order_by("handover_after")[:RELAY_BATCH]
    )
