"""The outbox of tasks handed over after the commit: which hand-over of which record is
whose, and what became of it.

A task for a backend that does not write to the lease database (RQ, Celery, Redis, or
django-tasks-db on another database) is recorded ``pending`` in the run's fenced
transaction, with its call (:attr:`RunTask.call <django_fencedjobs.models.RunTask.call>`):
the records are an outbox. Right after that transaction commits, the run's process hands
them over, all of them together (``integrations.tasks.hand_over``). If that fails (the
backend is down) or the process dies before it, the records stay ``pending``, and any
runner's relay hands them over later (``integrations.tasks.relay_pending``, a runner's
chore, at most once per :data:`RELAY_EVERY`, for the tasks pending
``FENCEDJOBS["TASK_HANDOVER_GRACE"]`` after their commit, :data:`RELAY_BATCH` at a time),
with backoff, up to :data:`MAX_HANDOVERS` times; then the task is recorded failed with the
reason, and the job reads failing. Never silently pending.

Each hand-over is claimed first (:func:`claim`), by a compare-and-set on the record's count
of hand-overs, for a whole batch in one statement: two processes (two runners' relays, or
a relay and the run's own process) never hand the same record over at once. A hand-over
that reached the backend but died before it was recorded is handed over again when the
relay finds it (``TASK_HANDOVER_GRACE`` after it began): the backend then holds two
deliveries of one task. That is what makes delivery *at least once*; the worker side makes
the writes *at most once*: the first execution of the task whose fenced block commits
claims the record (:attr:`RunTask.executor <django_fencedjobs.models.RunTask.executor>`, in
that block's transaction), and every other delivery's ``fenced_atomic()`` raises
:class:`~django_fencedjobs.exceptions.DuplicateDelivery` before writing
(:mod:`django_fencedjobs.integrations.tasks`). Together: effectively once.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta

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
    doublings = min(max(handovers - 1, 0), 16)
    return BACKOFF * (1 << doublings)


def claim(records: Sequence[RunTask]) -> list[RunTask]:
    """Claim the next hand-over of each of ``records`` that no other process has claimed:
    the records claimed, their ``handovers`` counted up. One ``UPDATE ... RETURNING`` per
    chunk of records with the same count (one, for a run's own tasks).

    This compare-and-set is what keeps two hand-overs of one task apart: a record moves from
    ``handovers = n`` to ``n + 1`` in exactly one statement, whichever process's it is (on
    PostgreSQL the second statement waits for the first's row lock, then re-reads
    ``handovers`` and skips the row; SQLite has one writer at a time). The claim also moves
    the record's next hand-over ``TASK_HANDOVER_GRACE`` ahead, so no relay tries it while
    this hand-over is under way."""
    if not records:
        return []
    connection = connections[db.lease_db()]
    table = connection.ops.quote_name(RunTask._meta.db_table)
    after = connection.ops.adapt_datetimefield_value(
        clock.now() + get_settings().TASK_HANDOVER_GRACE
    )
    by_count: dict[int, list[RunTask]] = defaultdict(list)
    for record in records:
        by_count[record.handovers].append(record)
    won: set[int] = set()
    for count, group in by_count.items():
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


def _chunks(items: list[RunTask], size: int) -> Iterator[list[RunTask]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def will_deliver(records: Sequence[RunTask], prefix: str) -> None:
    """Record, before handing them over, the ids the backend will know ``records``' tasks
    by (``prefix`` and each record's id): a worker that starts one before
    :func:`delivered` finds its record by that id at once. An id whose hand-over then
    fails is never started by anyone; it stays, harmless, until retention."""
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
    for chunk in _chunks(list(records), CLAIM_CHUNK):  # (SQLite's bound on parameters)
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
    by_count: dict[int, list[RunTask]] = defaultdict(list)
    for record in records:
        by_count[record.handovers].append(record)
    now = clock.now()
    for count, group in by_count.items():
        first = group[0]
        backend = first.backend
        why = f"the backend {backend!r} did not take the task: {type(exc).__name__}: "
        why += one_line(exc)
        chunks = [[record.pk for record in chunk] for chunk in _chunks(group, CLAIM_CHUNK)]
        which = _which(group)
        if count >= MAX_HANDOVERS:
            for ids in chunks:
                rows.filter(pk__in=ids).update(
                    status=TaskStatus.FAILED,
                    finished_at=now,
                    error=bounded(f"Not enqueued after {count} hand-overs: {why}", 2000),
                )
            logger.error(
                "%s not enqueued after %d hand-overs, recorded failed: %s",
                which,
                count,
                why,
                extra={"event": "task_not_enqueued", "job": first.job, "tasks": len(group)},
            )
            continue
        after = now + backoff(count)
        for ids in chunks:
            rows.filter(pk__in=ids).update(
                handover_after=after, error=bounded(f"Hand-over {count}: {why}", 2000)
            )
        logger.warning(
            "%s: hand-over %d failed, next at %s: %s",
            which,
            count,
            after.isoformat(timespec="seconds"),
            why,
            extra={"event": "task_handover_failed", "job": first.job, "tasks": len(group)},
        )


def _which(records: Sequence[RunTask]) -> str:
    first = records[0]
    if len(records) == 1:
        return f"task {first.task_path} of {first.job}"
    return f"{len(records)} tasks ({first.task_path} of {first.job} first)"


def pending(now: datetime, limit: int = RELAY_BATCH) -> list[RunTask]:
    """The tasks due for a hand-over: pending, their next hand-over time passed."""
    return list(
        RunTask.objects.using(db.lease_db())
        .filter(status=TaskStatus.PENDING, handover_after__lte=now)
        .order_by("handover_after")[:limit]
    )
