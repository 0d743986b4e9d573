"""Every statement that decides exclusion, in one place.

A job's lease is its :class:`~django_fencedjobs.models.JobLease` row. The *fence* is a
counter on that row: taking the lease increments it, and so does revoking a run that
overran its timeout. A run remembers the fence it was given; every statement it makes
later is conditional on the row still carrying that number, and the number never goes
down. So a run that was paused (GC, VM suspend, SIGSTOP) while its lease expired and a
successor took over can no longer change anything: its fence is stale, and every
statement below matches zero rows for it.

Time-based expiry (``lease_until``) only decides *when a successor may take over*. It is
never what keeps two runs from writing at once: :func:`lock_fence`, run inside the very
transaction that writes, is.

Each function says why its statement is safe. Statements use the ORM where it can say
them and the connection's cursor where it cannot (or where an ORM round of model
instantiation would dominate the cost of a small transaction).
"""

from __future__ import annotations

import functools
import hashlib
import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connections, models, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Case, Count, Exists, F, Max, Min, OuterRef, Q, Value, When
from django.db.models.functions import Greatest

from django_fencedjobs import clock, outcomes
from django_fencedjobs.db import bounded_rows, bounded_wait, first_statement, lease_db
from django_fencedjobs.models import (
    ENDABLE_OUTCOMES,
    FAILURE_OUTCOMES,
    LEASE_FREE,
    Backfill,
    JobInstance,
    JobLease,
    JobRun,
    Outcome,
    RunKind,
    Watermark,
)


@dataclass(frozen=True)
class LeaseRow:
    """A lease row as read by :func:`read`: what :func:`acquire` compares against."""

    name: str
    fence: int
    next_run_at: datetime
    lease_until: datetime
    paused: bool
    schedule_fingerprint: str
    #: A retry's, backfill slot's or one-off's slot, its attempt, and the row's kind
    #: (:mod:`django_fencedjobs.slots`).
    run_slot: datetime | None = None
    attempt: int = 1
    kind: str = RunKind.SCHEDULED

    def is_due(self, now: datetime) -> bool:
        return not self.paused and self.next_run_at <= now and self.lease_until < now

    @property
    def wakeup(self) -> datetime:
        """When this job can next be acquired: its slot, or the end of the lease still
        held on it, whichever is later."""
        return max(self.next_run_at, self.lease_until)


def read(names: list[str]) -> dict[str, LeaseRow]:
    """The lease rows of these jobs: one query, whatever the number of jobs.

    Reading is not deciding: two processes may both see a job as due here. Only
    :func:`acquire` decides, and only one of them wins it.
    """
    rows = JobLease.objects.using(lease_db()).filter(name__in=names).values_list(*_ROW_FIELDS)
    return {row[0]: LeaseRow(*row) for row in rows}


#: The columns of a :class:`LeaseRow`, in its order.
_ROW_FIELDS = (
    "name",
    "fence",
    "next_run_at",
    "lease_until",
    "paused",
    "schedule_fingerprint",
    "run_slot",
    "attempt",
    "kind",
)


@dataclass(frozen=True)
class Scan:
    """What one tick needs of its jobs' lease rows, from :func:`scan`."""

    #: Every existing row's schedule fingerprint, by job name (a missing name: no row yet).
    fingerprints: dict[str, str]
    #: The rows due at ``now``, in full: what :func:`acquire` compares against.
    due: list[LeaseRow]
    #: The earliest :attr:`LeaseRow.wakeup` of the rows that are neither paused nor due:
    #: when the next of the jobs not due now can be acquired (the due ones are in ``due``).
    wakeup: datetime | None


def scan(names: list[str], now: datetime) -> Scan:
    """The tick's read: one query whose cost barely grows with the number of jobs.

    A tick with nothing due must cost the same for 5 jobs as for 200 (bench P3, in
    docs/benchmarks.md). Reading every row in full (:func:`read`) does not: the ORM's
    ``IN (%s, %s, ...)`` list and the parsing of two timestamps per row (Django's
    timestamptz loader is pure Python) grow with the number of jobs. On PostgreSQL the
    names go as one array parameter (joined, which is cheaper than ``= ANY`` for hundreds),
    due-ness is decided by the same comparison as :meth:`LeaseRow.is_due`, in SQL, and
    timestamps come back only for due rows plus the one earliest wakeup. Other backends
    read the rows in full.

    Like :func:`read`, this decides nothing: only :func:`acquire` does.
    """
    connection = connections[lease_db()]
    if connection.vendor != "postgresql":
        rows = read(names)
        wakeups = [row.wakeup for row in rows.values() if not row.paused and not row.is_due(now)]
        return Scan(
            {name: row.schedule_fingerprint for name, row in rows.items()},
            [row for row in rows.values() if row.is_due(now)],
            min(wakeups) if wakeups else None,
        )
    with connection.cursor() as cursor:
        _load_instants_in_c(connection, cursor.cursor)  # most of such a read's cost (bench P7)
        cursor.execute(
            "SELECT name, schedule_fingerprint, due,"
            " CASE WHEN due THEN fence END,"
            " CASE WHEN due THEN next_run_at END,"
            " CASE WHEN due THEN lease_until END,"
            " CASE WHEN row_number() OVER () = 1 THEN min(CASE WHEN NOT paused AND NOT due"
            "  THEN GREATEST(next_run_at, lease_until) END) OVER () END,"
            " CASE WHEN due THEN run_slot END, attempt"
            " FROM (SELECT lease.*,"
            "  (NOT lease.paused AND lease.next_run_at <= %s AND lease.lease_until < %s) AS due"
            f" FROM {_table(connection)} AS lease"
            "  JOIN unnest(%s::text[]) AS job(name) ON lease.name = job.name) AS rows",
            [now, now, _text_array(tuple(names))],
        )
        result = cursor.fetchall()
    return Scan(
        {row[0]: row[1] for row in result},
        [
            LeaseRow(name, fence, nxt, until, False, fp, run_slot, attempt)
            for name, fp, due, fence, nxt, until, _, run_slot, attempt in result
            if due
        ],
        result[0][6] if result else None,
    )


@functools.lru_cache(maxsize=32)
def _text_array(names: tuple[str, ...]) -> str:
    """A PostgreSQL array literal of ``names``. Every tick passes the same names: built
    once, not element by element per tick as psycopg's list adapter would."""
    quoted = (name.replace("\\", "\\\\").replace('"', '\\"') for name in names)
    return "{" + ",".join(f'"{name}"' for name in quoted) + "}"


#: A lease row's fences start at its id times this (:func:`create`).
FENCE_EPOCH = 2**32


def create(rows: list[JobLease], *, ignore_conflicts: bool = True) -> None:
    """Create lease rows, each with its first fence: with ``ignore_conflicts``, a row whose
    name exists already is left as it is (racing creators are harmless: the unique name
    wins once); without, :class:`~django.db.IntegrityError`.

    A fence must never repeat for a name, whatever happened to the rows that carried it
    before: an instance deleted and created again under the same key, a row deleted in the
    admin or by the ORM, or by hand. A run of the old row still holding fence 7 would
    otherwise pass the fence check of the new row's seventh run, and write as it. So a row's
    fences do not start at 0: they start at its id times :data:`FENCE_EPOCH`, set in the
    transaction that inserts the row (nobody sees it before). Ids never repeat (a sequence
    on PostgreSQL, ``AUTOINCREMENT`` on SQLite, even once the highest row is deleted), so a
    row created again under a name starts above every fence the rows before it reached, as
    long as no row is acquired and ended more than 2**32 times (over a century at a run a
    second). Rows written before this rule began start at 0; every row created since has a
    larger id, so it starts above them too.
    """
    alias = lease_db()
    with transaction.atomic(using=alias):
        JobLease.objects.using(alias).bulk_create(rows, ignore_conflicts=ignore_conflicts)
        # fence = 0: only rows never acquired (those just inserted, and rows of an older
        # release never run, which no run holds).
        JobLease.objects.using(alias).filter(name__in=[row.name for row in rows], fence=0).update(
            fence=F("id") * FENCE_EPOCH
        )


def never_taken(pk: int, fence: int) -> bool:
    """Whether the lease row ``pk`` with ``fence`` has never been taken: its fence is still
    the first one :func:`create` gave it (0 for a row of an older release)."""
    return fence in (0, pk * FENCE_EPOCH)


def reschedule(name: str, old_fingerprint: str, fingerprint: str, next_run_at: datetime) -> bool:
    """The job's schedule changed in code: its next slot is recomputed, once (conditional on
    the fingerprint it replaces, so racing processes do not recompute it twice). True when
    this call recomputed it.

    A row locked right now (its run is inside a fenced transaction) is passed over, not
    waited for (``SKIP LOCKED``): the next tick, or the next observer, recomputes it.
    """
    alias = lease_db()
    with transaction.atomic(using=alias):
        locked = list(
            JobLease.objects.using(alias)
            .select_for_update(skip_locked=connections[alias].features.has_select_for_update)
            .filter(name=name, schedule_fingerprint=old_fingerprint)
            .values_list("pk", flat=True)
        )
        if not locked:
            return False
        JobLease.objects.using(alias).filter(pk__in=locked).update(
            schedule_fingerprint=fingerprint, next_run_at=next_run_at
        )
        return True


def acquire(
    seen: LeaseRow,
    *,
    owner: str,
    now: datetime,
    ttl: timedelta,
    next_run_at: datetime,
    run_slot: datetime | None = None,
    attempt: int = 1,
    dropped_retry: bool = False,
) -> int | None:
    """Take the lease; return the new fence, or None when another process took it first or
    holds the row right now. ``dropped_retry``: a later slot superseded the row's pending
    retry, whose failure is counted now (:attr:`django_fencedjobs.slots.Slot.dropped_retry`).

    One conditional UPDATE, a compare-and-set on the row as :func:`read` read it: the
    fence and the slot must be unchanged and the lease must have expired. Two
    acquirers that read the same row race on this statement; the database serialises
    them on the row, the second re-evaluates the WHERE against the first's committed
    row (fence already incremented, ``next_run_at`` already moved past ``now``) and
    updates nothing. The same statement moves ``next_run_at`` to the first slot after
    ``now``, so the job is not due again for this slot even if this run dies (a backfill
    slot's or one-off's row stays due instead, for its next attempt: ``run_slot`` and
    ``attempt`` are what :func:`django_fencedjobs.slots.plan` says the row keeps).

    On PostgreSQL the row is locked first with ``FOR UPDATE SKIP LOCKED``: a row locked by
    anyone else (a holder inside its fenced transaction, paused or not; another acquirer)
    is passed over at once instead of waited for, so one job's stuck holder never holds up
    the jobs behind it in a tick. The job is tried again at the next tick; a paused
    holder's transaction is ended by the server (:func:`lock_fence` bounds its idle time).

    Call inside the transaction that records the run, so that both commit or neither.
    """
    connection = connections[lease_db()]
    if connection.vendor == "postgresql":
        table = _table(connection)
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET fence = fence + 1, owner = %s, lease_until = %s,"
                " next_run_at = %s, run_slot = %s, attempt = %s,"
                " consecutive_failures = consecutive_failures + %s,"
                f" {_aged(failed='TRUE' if dropped_retry else 'FALSE')}"
                f" WHERE name = (SELECT name FROM {table} WHERE name = %s AND fence = %s"
                "  AND next_run_at = %s AND lease_until < %s AND NOT paused"
                "  FOR UPDATE SKIP LOCKED)",
                [
                    owner,
                    now + ttl,
                    next_run_at,
                    run_slot,
                    attempt,
                    int(dropped_retry),
                    seen.name,
                    seen.fence,
                    seen.next_run_at,
                    now,
                ],
            )
            updated = cursor.rowcount
    else:
        updated = (
            JobLease.objects.using(lease_db())
            .filter(
                name=seen.name,
                fence=seen.fence,
                next_run_at=seen.next_run_at,
                lease_until__lt=now,
                paused=False,
            )
            .update(
                fence=F("fence") + 1,
                owner=owner,
                lease_until=now + ttl,
                next_run_at=next_run_at,
                run_slot=run_slot,
                attempt=attempt,
                consecutive_failures=F("consecutive_failures") + int(dropped_retry),
                **(_failure_aged() if dropped_retry else {}),
            )
        )
    return seen.fence + 1 if updated == 1 else None


def _failure_aged() -> dict[str, Any]:
    """The row's failure ages (``JobLease.last_failure_age``) once one more of its slots is
    judged a failure: a failed run's end when no retry follows it, or a retry dropped."""
    return {"last_failure_age": Value(1), "previous_failure_age": F("last_failure_age") + 1}


def _aged(*, failed: str, succeeded: str = "FALSE", row: str = "") -> str:
    """The failure ages (``JobLease.last_failure_age``) in SQL, as SET items: one more slot
    judged, a success when ``succeeded`` holds, a failure (:func:`_failure_aged`) when
    ``failed`` does; else unchanged. An age with no failure before it stays NULL."""
    return (
        f" last_failure_age = CASE WHEN {succeeded} THEN {row}last_failure_age + 1"
        f"  WHEN {failed} THEN 1 ELSE {row}last_failure_age END,"
        f" previous_failure_age = CASE WHEN {succeeded} THEN {row}previous_failure_age + 1"
        f"  WHEN {failed} THEN {row}last_failure_age + 1 ELSE {row}previous_failure_age END"
    )


@dataclass(frozen=True)
class DueRow:
    """A due lease row locked by a claim (:func:`claim_named`, :func:`claim_instances`),
    with its watermarks as committed, by key, and an instance's definition (what its job
    is built from); None for a row claimed by name, whose job the caller has."""

    row: LeaseRow
    instance: JobInstance | None
    watermarks: dict[str, datetime | int]


def claim_named(names: list[str], now: datetime, limit: int) -> list[DueRow]:
    """Lock up to ``limit`` of the rows ``names`` that are due (a job declared with a
    schedule, an instance run by name), earliest next fire time first, for :func:`take`
    in the same transaction.

    The names come from the tick's scan (:func:`scan`), which decides nothing: the claim
    reads them again, locked. ``FOR UPDATE SKIP LOCKED`` (PostgreSQL): a row another runner
    is claiming right now, or that a run holds inside a fenced transaction, is passed over,
    not waited for, so runners that read the same due jobs get disjoint batches; one
    statement, the rows by their unique name and their watermarks with them. Elsewhere
    the rows are read unlocked and :func:`take`'s compare-and-set decides, row by row.
    """
    if limit < 1 or not names:
        return []
    connection = connections[lease_db()]
    if connection.vendor != "postgresql":
        rows = JobLease.objects.using(lease_db()).filter(
            name__in=names, paused=False, next_run_at__lte=now, lease_until__lt=now
        )
        return _with_watermarks(list(rows.order_by("next_run_at")[:limit]), instance=False)
    watermark_table = connection.ops.quote_name(Watermark._meta.db_table)
    with connection.cursor() as cursor:
        _load_instants_in_c(connection, cursor.cursor)
        cursor.execute(
            f"SELECT {', '.join(f'lease.{field}' for field in _ROW_FIELDS)},"
            " (SELECT json_agg(json_build_array(mark.key, mark.position, mark.cursor))"
            f"  FROM {watermark_table} AS mark WHERE mark.job = lease.name)::text"
            f" FROM {_table(connection)} AS lease"
            "  JOIN unnest(%s::text[]) AS job(name) ON lease.name = job.name"
            " WHERE NOT lease.paused AND lease.next_run_at <= %s AND lease.lease_until < %s"
            " ORDER BY lease.next_run_at LIMIT %s"
            " FOR UPDATE OF lease SKIP LOCKED",
            [_text_array(tuple(names)), now, now, limit],
        )
        rows = cursor.fetchall()
    return [
        DueRow(LeaseRow(*fields), None, _watermarks_from_json(marks)) for *fields, marks in rows
    ]


def claim_instances(parents: list[str], now: datetime, limit: int) -> list[DueRow]:
    """Lock up to ``limit`` due instances of the jobs ``parents``, for :func:`take` in the
    same transaction: the earliest next fire time first within each job, the jobs in the
    order given (the dispatcher gives the job whose instance is due earliest first).

    The tick's read of instances, by the partial index on ``(parent, next_run_at)`` of
    unpaused instance rows: a job's earliest due rows are the first entries of its part of
    the index, so the cost is that of ``limit`` rows however many instances it and the
    other jobs have (bench P10). ``FOR UPDATE SKIP LOCKED`` (PostgreSQL): rows another
    runner is claiming right now, or that a run holds inside a fenced transaction, are
    passed over, not waited for, and two runners claiming at once get disjoint batches.
    Elsewhere the rows are read unlocked and :func:`take`'s compare-and-set decides, row
    by row, as :func:`acquire` does.

    On PostgreSQL one statement per job reads the rows, their instances and their
    watermarks (one statement in all for a runner of one job with instances).
    """
    claimed: list[DueRow] = []
    for parent in parents:
        if len(claimed) >= limit:
            break
        claimed += _claim_of(parent, now, limit - len(claimed))
    return claimed


def _claim_of(parent: str, now: datetime, limit: int) -> list[DueRow]:
    connection = connections[lease_db()]
    if connection.vendor != "postgresql":
        return _claim_instances_elsewhere(parent, now, limit)
    instance_table = connection.ops.quote_name(JobInstance._meta.db_table)
    watermark_table = connection.ops.quote_name(Watermark._meta.db_table)
    with connection.cursor() as cursor:
        _load_instants_in_c(connection, cursor.cursor)
        cursor.execute(
            "SELECT lease.name, lease.fence, lease.next_run_at, lease.lease_until,"
            " lease.schedule_fingerprint, lease.run_slot, lease.attempt,"
            " instance.id, instance.job, instance.key,"
            " instance.cron, instance.every, instance.timezone, instance.jitter,"
            " instance.enabled, instance.kwargs::text, instance.timeout, instance.grace,"
            " (SELECT json_agg(json_build_array(mark.key, mark.position, mark.cursor))"
            f"  FROM {watermark_table} AS mark WHERE mark.job = lease.name)::text"
            f" FROM {_table(connection)} AS lease"
            f" JOIN {instance_table} AS instance ON instance.id = lease.instance_id"
            " WHERE lease.parent = %s AND lease.instance_id IS NOT NULL AND NOT lease.paused"
            "  AND lease.next_run_at <= %s AND lease.lease_until < %s"
            " ORDER BY lease.next_run_at LIMIT %s"
            " FOR UPDATE OF lease SKIP LOCKED",
            [parent, now, now, limit],
        )
        rows = cursor.fetchall()
    return [
        DueRow(
            LeaseRow(name, fence, next_run_at, lease_until, False, fingerprint, run_slot, attempt),
            JobInstance(
                id=pk,
                job=job,
                key=key,
                cron=cron,
                every=every,
                timezone=timezone,
                jitter=jitter,
                enabled=enabled,
                kwargs=json.loads(kwargs),
                timeout=timeout,
                grace=grace,
            ),
            _watermarks_from_json(marks),
        )
        for (
            name,
            fence,
            next_run_at,
            lease_until,
            fingerprint,
            run_slot,
            attempt,
            pk,
            job,
            key,
            cron,
            every,
            timezone,
            jitter,
            enabled,
            kwargs,
            timeout,
            grace,
            marks,
        ) in rows
    ]


def _watermarks_from_json(text: str | None) -> dict[str, datetime | int]:
    found: dict[str, datetime | int] = {}
    for key, position, cursor in json.loads(text) if text else ():
        if position is not None:
            found[key] = datetime.fromisoformat(position)
        elif cursor is not None:
            found[key] = int(cursor)
    return found


def _claim_instances_elsewhere(parent: str, now: datetime, limit: int) -> list[DueRow]:
    rows = (
        JobLease.objects.using(lease_db())
        .filter(
            parent=parent,
            instance__isnull=False,
            paused=False,
            next_run_at__lte=now,
            lease_until__lt=now,
        )
        .select_related("instance")
        .order_by("next_run_at")
    )
    return _with_watermarks(list(rows[:limit]), instance=True)


def _with_watermarks(rows: list[JobLease], *, instance: bool) -> list[DueRow]:
    """The claim of ``rows`` (read unlocked: elsewhere than on PostgreSQL), with their
    watermarks (one query) and, for ``instance``, their instances."""
    marks: dict[str, dict[str, datetime | int]] = {}
    for job, key, position, cursor in (
        Watermark.objects.using(lease_db())
        .filter(job__in=[row.name for row in rows])
        .values_list("job", "key", "position", "cursor")
    ):
        value = position if position is not None else cursor
        if value is not None:
            marks.setdefault(job, {})[key] = value
    return [
        DueRow(
            LeaseRow(*(getattr(row, field) for field in _ROW_FIELDS)),
            row.instance if instance else None,
            marks.get(row.name, {}),
        )
        for row in rows
    ]


def instances_wakeups(parents: list[str]) -> dict[str, datetime]:
    """The earliest next fire time of each job's unpaused instances (a job without any is
    left out), by the index :func:`claim_instances` reads: one index entry per job. One
    statement on PostgreSQL. Decides nothing."""
    connection = connections[lease_db()]
    if connection.vendor != "postgresql":
        found = {}
        for parent in parents:
            earliest = (
                JobLease.objects.using(lease_db())
                .filter(parent=parent, instance__isnull=False, paused=False)
                .order_by("next_run_at")
                .values_list("next_run_at", flat=True)
                .first()
            )
            if earliest is not None:
                found[parent] = earliest
        return found
    with connection.cursor() as cursor:
        _load_instants_in_c(connection, cursor.cursor)
        cursor.execute(
            "SELECT job.parent, earliest.next_run_at FROM unnest(%s::text[]) AS job(parent)"
            " CROSS JOIN LATERAL (SELECT next_run_at"
            f"  FROM {_table(connection)} AS lease WHERE lease.parent = job.parent"
            "  AND lease.instance_id IS NOT NULL AND NOT lease.paused"
            "  ORDER BY lease.next_run_at LIMIT 1) AS earliest",
            [list(parents)],
        )
        return dict(cursor.fetchall())


@dataclass(frozen=True)
class DueOneShot:
    """A due backfill slot's or one-off's lease row locked by :func:`claim_oneshots`, with
    the one-off's arguments."""

    row: LeaseRow
    kwargs: dict[str, Any] | None
    #: The row's last run committed fenced work and never recorded its end
    #: (:func:`note_commit`): the runner died after the commit.
    committed: bool = False


def claim_oneshots(parents: list[str], now: datetime, limit: int) -> list[DueOneShot]:
    """Lock up to ``limit`` due backfill slots and one-offs of the jobs ``parents``, the
    earliest first, keeping each backfill to its ``concurrency``: for :func:`acquire` in
    the same transaction.

    By the partial index on ``(parent, next_run_at)`` of unpaused one-shot rows, ``FOR
    UPDATE SKIP LOCKED`` as :func:`claim_instances`. A backfill's bound is decided under
    a lock on its :class:`~django_fencedjobs.models.Backfill` row, taken after the
    candidates are locked, ``SKIP LOCKED`` too: of two runners claiming slots of the same
    backfill at once, one counts the rows held (by a lease not expired) and claims, the
    other claims none of that backfill's slots at this pass, so together they never exceed
    it, and neither waits.
    """
    alias = lease_db()
    features = connections[alias].features
    rows = list(
        JobLease.objects.using(alias)
        .select_for_update(skip_locked=features.has_select_for_update_skip_locked)
        .filter(parent__in=parents, paused=False, next_run_at__lte=now, lease_until__lt=now)
        .exclude(kind=RunKind.SCHEDULED)
        .order_by("next_run_at")
        .values_list(*_ROW_FIELDS, "kwargs", "committed_fence", "backfill_id")[:limit]
    )
    room = _backfill_room(sorted({row[-1] for row in rows if row[-1] is not None}), now)
    claimed = []
    for *fields, kwargs, committed_fence, backfill_id in rows:
        if backfill_id is not None:
            if room.get(backfill_id, 0) < 1:
                continue
            room[backfill_id] -= 1
        row = LeaseRow(*fields)
        claimed.append(DueOneShot(row, kwargs, committed=committed_fence == row.fence))
    return claimed


def _backfill_room(ids: list[int], now: datetime) -> dict[int, int]:
    """How many more slots each backfill may start now: its concurrency less its rows
    held, under a lock on each backfill's row. ``FOR NO KEY UPDATE SKIP LOCKED``
    (PostgreSQL): a backfill whose row another session holds (a runner claiming its slots,
    retention deleting it) has no room at this pass, and none of its slots is claimed; the
    dispatcher never waits for that lock, and looks again in a moment. (``NO KEY``: rows
    queued for the backfill, whose foreign key shares its row, are no reason to skip it.)"""
    if not ids:
        return {}
    alias = lease_db()
    features = connections[alias].features
    bounds = dict(
        Backfill.objects.using(alias)
        .select_for_update(
            skip_locked=features.has_select_for_update_skip_locked,
            no_key=features.has_select_for_no_key_update,
        )
        .filter(id__in=ids)
        .order_by("id")
        .values_list("id", "concurrency")
    )
    held = dict(
        JobLease.objects.using(alias)
        .filter(backfill_id__in=ids, paused=False, lease_until__gte=now)
        .values("backfill_id")
        .annotate(n=Count("id"))
        .values_list("backfill_id", "n")
    )
    return {pk: bound - held.get(pk, 0) for pk, bound in bounds.items()}


def oneshot_wakeups(parents: list[str]) -> dict[str, datetime]:
    """The earliest ``next_run_at`` of each job's unpaused backfill slots and one-offs (a
    job without any is left out). Decides nothing.

    Every tick reads this, so it reads the pending one-shot rows of *every* job (their
    partial index holds only those, usually none or a few) and keeps this runner's jobs in
    Python: its cost is that of the pending rows, not of a list of thousands of names.
    """
    wanted = set(parents)
    pending = (
        JobLease.objects.using(lease_db())
        .filter(paused=False)
        .exclude(kind=RunKind.SCHEDULED)
        .values("parent")
        .annotate(earliest=Min("next_run_at"))
        .values_list("parent", "earliest")
    )
    return {parent: earliest for parent, earliest in pending if parent in wanted}


def mark_oneshot_abandoned(
    job: str, kind: str, slot: datetime, fence: int, now: datetime, error: str = outcomes.ABANDONED
) -> None:
    """:func:`mark_abandoned` for a backfill slot or one-off: its earlier attempts still
    marked running are recorded abandoned (they are recorded as the target ``job``, whose
    own runs have fences of another row)."""
    JobRun.objects.using(lease_db()).filter(
        job=job, kind=kind, scheduled_for=slot, outcome=Outcome.RUNNING, fence__lt=fence
    ).update(outcome=Outcome.ABANDONED, finished_at=now, error=error)


def end_orphans(now: datetime) -> int:
    """Record abandoned the runs still marked running that no acquisition will ever find:
    how many. A run left running by a dead runner is normally recorded abandoned by the
    next run of its job, which takes its lease (:func:`mark_abandoned`); but a job or an
    instance that is not run again leaves it running for good:

    * its lease row is gone (an instance deleted), or carries a later fence: nobody can
      end it, and it can write nothing (its fence check finds no row);
    * its lease row is paused (a job paused, an instance disabled) with the run's fence,
      its lease expired: the row's fence is moved on first (as an acquisition would), so
      that a holder that was only paused writes nothing when it resumes.

    Runs of the job's own rows only (kind ``scheduled``: a backfill slot's or one-off's run
    is ended by its row, which stays due). Runs whose lease still holds are never touched.
    """
    alias = lease_db()
    running = JobRun.objects.using(alias).filter(outcome=Outcome.RUNNING, kind=RunKind.SCHEDULED)
    gone = running.filter(
        ~Exists(JobLease.objects.filter(name=OuterRef("job"), fence__lte=OuterRef("fence")))
    )
    ended = gone.update(outcome=Outcome.ABANDONED, finished_at=now, error=outcomes.ABANDONED_ORPHAN)
    stuck = running.filter(
        Exists(
            JobLease.objects.filter(
                name=OuterRef("job"), fence=OuterRef("fence"), paused=True, lease_until__lt=now
            )
        )
    ).values_list("job", "fence")
    for name, fence in list(stuck):
        revoked = (
            JobLease.objects.using(alias)
            .filter(name=name, fence=fence, paused=True, lease_until__lt=now)
            .update(fence=F("fence") + 1, owner="", lease_until=LEASE_FREE)
        )
        if revoked:
            ended += running.filter(job=name, fence=fence).update(
                outcome=Outcome.ABANDONED, finished_at=now, error=outcomes.ABANDONED_ORPHAN
            )
    return ended


def note_commit(connection: BaseDatabaseWrapper, name: str, fence: int) -> None:
    """In a backfill slot's or one-off's fenced transaction, just before it commits: the
    row says that the run holding ``fence`` committed work, in the same transaction as the
    work (so it is true exactly when the work committed). The row is locked already by
    the block's fence check; a stale fence matches nothing.

    A one-shot row stays due while its run holds it, so that a run whose runner died is
    run again: the next claim reads this to tell a run that died before committing
    anything from one that committed and died before its end was recorded
    (:attr:`DueOneShot.committed`), whose slot must not be run again by accident."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {_table(connection)} SET committed_fence = fence"
            " WHERE name = %s AND fence = %s",
            [name, fence],
        )


@dataclass(frozen=True)
class Take:
    """One lease of a batch for :func:`take`: the row as :func:`claim_instances` locked it,
    the next fire time to move it to, and the run's record to insert (not saved yet; its
    fence is the row's + 1)."""

    row: LeaseRow
    next_run_at: datetime
    lease_until: datetime
    record: JobRun
    #: What the row keeps for its next acquisition (:class:`django_fencedjobs.slots.Slot`).
    run_slot: datetime | None = None
    attempt: int = 1
    dropped_retry: bool = False


def take(batch: list[Take], now: datetime) -> tuple[list[Take], list[Take]]:
    """Take the leases of a batch of rows locked by :func:`claim_instances` and record their
    runs: ``(taken and recorded, taken but their slot was recorded already)``. The records
    of the first list have their primary key.

    Each run is inserted unless its slot is recorded already (a run now landed on it), and
    only the rows whose run was inserted are taken, by the compare-and-set of
    :func:`acquire` (fence and slot unchanged, lease expired, not paused: the rows are
    locked by this transaction, so none changes meanwhile); the runs of older fences still
    marked running are marked abandoned (as :func:`mark_abandoned` does). A row whose slot
    was recorded already is moved past it, as :func:`operations.skip_slot
    <django_fencedjobs.operations.skip_slot>` does, its fence unchanged: every fence a row
    hands out is a recorded run's. On PostgreSQL all of it is one statement, whatever the
    size of the batch; elsewhere row by row.
    """
    if not batch:
        return [], []
    connection = connections[lease_db()]
    if connection.vendor != "postgresql":
        return _take_elsewhere(batch, now)
    run_table = connection.ops.quote_name(JobRun._meta.db_table)
    columns = ", ".join(_RECORD_COLUMNS)
    # A retry (attempt 2 on) is the slot's next attempt, as insert_as_next_attempt
    # numbers it: a backfill or one-off of the slot may have taken its number since it was
    # queued, and a retry is never dropped for that. (The batch's rows are distinct jobs:
    # no two of its runs share a slot.) A first attempt whose slot is recorded is skipped.
    values = ", ".join(
        f"CASE WHEN run.attempt > 1 THEN GREATEST(run.attempt, 1 + (SELECT"
        f" COALESCE(MAX(done.attempt), 0) FROM {run_table} AS done WHERE"
        " done.job = run.job AND done.scheduled_for = run.scheduled_for))"
        " ELSE run.attempt END"
        if column == "attempt"
        else f"run.{column}"
        for column in _RECORD_COLUMNS
    )
    # A row whose last run did not end its lease (killed, or given up on) may have runs
    # still marked running; a batch of rows all freed by their runs' ends has none, and
    # its statement does without that part.
    abandoned = any(item.row.lease_until != LEASE_FREE for item in batch)
    marking: list[Any] = [
        Outcome.ABANDONED,
        now,
        outcomes.ABANDONED,
        Outcome.RUNNING,
        RunKind.SCHEDULED,
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            # The batch is one JSON parameter, its rows unpacked by the server: quoting
            # a value at a time on the client costs more than the statement. Each LIMIT
            # tells the planner how many rows the JSON holds (it guesses 100 for any
            # set-returning function, and would scan every lease row to join them).
            "WITH claimed AS (SELECT * FROM json_to_recordset(%s::json)"
            "  AS claimed(name text, fence bigint, slot timestamptz, next_run_at timestamptz,"
            "  lease_until timestamptz, run_slot timestamptz, attempt integer,"
            "  dropped integer) LIMIT %s),"
            # The rows the batch may take, checked as the grant below checks them (they
            # are locked by this transaction: nothing changes them before it).
            " takeable AS ("
            f" SELECT lease.name FROM {_table(connection)} AS lease JOIN claimed"
            "  ON lease.name = claimed.name WHERE lease.fence = claimed.fence"
            "  AND lease.next_run_at = claimed.slot AND lease.lease_until < %s"
            "  AND NOT lease.paused),"
            # The runs first: a row is taken only when its run is recorded, so that no
            # fence is handed out without a run (a first attempt whose slot is recorded
            # already inserts nothing).
            " inserted AS ("
            f" INSERT INTO {run_table} ({columns})"
            f"  SELECT {values} FROM (SELECT * FROM json_populate_recordset("
            f"  NULL::{run_table}, %s::json) LIMIT %s) AS run"
            "  WHERE job IN (SELECT name FROM takeable)"
            "  ON CONFLICT ON CONSTRAINT fencedjobs_run_once DO NOTHING"
            "  RETURNING id, job, attempt),"
            " granted AS ("
            f" UPDATE {_table(connection)} AS lease SET fence = lease.fence + 1,"
            "  owner = %s, lease_until = claimed.lease_until,"
            "  next_run_at = claimed.next_run_at, run_slot = claimed.run_slot,"
            "  attempt = claimed.attempt,"
            "  consecutive_failures = lease.consecutive_failures + claimed.dropped,"
            + _aged(failed="claimed.dropped = 1", row="lease.")
            + "  FROM claimed WHERE lease.name = claimed.name"
            "  AND lease.name IN (SELECT job FROM inserted) RETURNING lease.name),"
            # Past a slot recorded already, its fence unchanged (operations.skip_slot).
            " passed AS ("
            f" UPDATE {_table(connection)} AS lease SET next_run_at = claimed.next_run_at,"
            "  run_slot = NULL, attempt = 1"
            "  FROM claimed WHERE lease.name = claimed.name"
            "  AND lease.name IN (SELECT name FROM takeable)"
            "  AND lease.name NOT IN (SELECT job FROM inserted) RETURNING lease.name)"
            + (
                ", abandoned AS ("
                # Every run of these jobs still marked running has an older fence: this
                # statement's own inserts are not visible to it. (Rows of kind
                # "scheduled" only: a backfill slot's runs are recorded under their
                # job's name.)
                f" UPDATE {run_table} SET outcome = %s, finished_at = %s, error = %s"
                "  WHERE outcome = %s AND kind = %s AND job IN (SELECT name FROM granted))"
                if abandoned
                else ""
            )
            + " SELECT granted.name, inserted.id, inserted.attempt FROM granted"
            " JOIN inserted ON inserted.job = granted.name"
            " UNION ALL SELECT passed.name, NULL, NULL FROM passed",
            [
                _json(
                    {
                        "name": item.row.name,
                        "fence": item.row.fence,
                        "slot": item.row.next_run_at,
                        "next_run_at": item.next_run_at,
                        "lease_until": item.lease_until,
                        "run_slot": item.run_slot,
                        "attempt": item.attempt,
                        "dropped": int(item.dropped_retry),
                    }
                    for item in batch
                ),
                len(batch),
                now,
                _json(
                    {column: getattr(item.record, column) for column in _RECORD_COLUMNS}
                    for item in batch
                ),
                len(batch),
                batch[0].record.owner,
                *(marking if abandoned else []),
            ],
        )
        result = {name: (pk, attempt) for name, pk, attempt in cursor.fetchall()}
    recorded, skipped = [], []
    for item in batch:
        if item.row.name not in result:
            continue
        pk, attempt = result[item.row.name]
        if pk is None:
            skipped.append(item)
        else:
            item.record.pk, item.record.attempt = pk, attempt
            item.record._state.adding = False
            item.record._state.db = connection.alias
            recorded.append(item)
    return recorded, skipped


#: The columns of a run's row that :func:`take` inserts.
_RECORD_COLUMNS = (
    "job",
    "scheduled_for",
    "started_at",
    "finished_at",
    "outcome",
    "capped",
    "items",
    "batches",
    "fence",
    "owner",
    "missed_slots",
    "watermark_before",
    "watermark_after",
    "error",
    "attempt",
    "kind",
    "interval_start",
)


def _json(rows: Iterable[dict[str, Any]]) -> str:
    """``rows`` as one JSON array, instants in ISO 8601 (what ``timestamptz`` reads)."""
    return json.dumps(list(rows), default=_iso)


def _iso(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def insert_as_next_attempt(record: JobRun) -> None:
    """Insert a retry's, backfill slot's or one-off's run as its slot's next attempt.

    Its attempt number was read when its row was queued or last ended, but the slot's
    history may have grown since: a retry of the job's own run of that slot, a backfill
    or one-off of it. Their number taken, this run is the one after the slot's latest: it
    is never dropped for it (its lease is taken, and its slot must run). (A first attempt
    of a scheduled slot that finds the slot recorded is skipped instead.) :func:`take`
    numbers a batch's retries by the same rule, in its one statement."""
    alias = lease_db()
    for tries_left in range(4, -1, -1):
        try:
            with transaction.atomic(using=alias):
                record.save(using=alias, force_insert=True)
            return
        except IntegrityError:
            if not tries_left:  # not a taken number: another constraint refused the row
                raise
            latest = (
                JobRun.objects.using(alias)
                .filter(job=record.job, scheduled_for=record.scheduled_for)
                .aggregate(latest=Max("attempt"))["latest"]
            )
            record.attempt = (latest or 0) + 1
            record.pk = None
            record._state.adding = True


def _take_elsewhere(batch: list[Take], now: datetime) -> tuple[list[Take], list[Take]]:
    alias = lease_db()
    recorded, skipped = [], []
    for item in batch:
        try:
            with transaction.atomic(using=alias):  # the row is taken with its run, or not
                fence = acquire(
                    item.row,
                    owner=item.record.owner,
                    now=now,
                    ttl=item.lease_until - now,
                    next_run_at=item.next_run_at,
                    run_slot=item.run_slot,
                    attempt=item.attempt,
                    dropped_retry=item.dropped_retry,
                )
                if fence is None:
                    continue
                if item.row.lease_until != LEASE_FREE:
                    mark_abandoned(item.row.name, fence, now)
                if item.record.attempt > 1:  # a retry: never dropped
                    insert_as_next_attempt(item.record)
                else:
                    item.record.save(using=alias, force_insert=True)
            recorded.append(item)
        except IntegrityError:  # its slot is recorded already: past it, fence unchanged
            JobLease.objects.using(alias).filter(
                name=item.row.name, fence=item.row.fence, next_run_at=item.row.next_run_at
            ).update(next_run_at=item.next_run_at, run_slot=None, attempt=1)
            item.record.pk = None
            skipped.append(item)
    return recorded, skipped


def _load_instants_in_c(connection: BaseDatabaseWrapper, cursor: Any) -> None:
    """On psycopg's ``cursor``: read timestamptz values with psycopg's own loader, in C,
    for the same instants in the same zone: Django's is a Python subclass of it, some 3 µs
    a value, and a fleet draining a stampede reads thousands of rows every few tenths of
    a second."""
    if connection.timezone is not None:
        from psycopg.types.datetime import TimestamptzLoader

        cursor.adapters.register_loader("timestamptz", TimestamptzLoader)


def pause_invalid(name: str, fence: int) -> None:
    """Pause an instance found invalid when claimed (its row was changed without
    :func:`~django_fencedjobs.instances.save`): conditional on the fence as claimed. Saving
    the instance valid again resumes it."""
    JobLease.objects.using(lease_db()).filter(name=name, fence=fence).update(paused=True)


def mark_abandoned(name: str, fence: int, now: datetime) -> None:
    """Runs of this job still marked running under an older fence belong to a holder whose
    lease expired (dead, or paused and since superseded): record them as abandoned.
    Called in the acquiring transaction, so only the new fence holder does it."""
    JobRun.objects.using(lease_db()).filter(
        job=name, kind=RunKind.SCHEDULED, outcome=Outcome.RUNNING, fence__lt=fence
    ).update(
        outcome=Outcome.ABANDONED,
        finished_at=now,
        error=outcomes.ABANDONED,
    )


def _table(connection: BaseDatabaseWrapper) -> str:
    return connection.ops.quote_name(JobLease._meta.db_table)


def lock_fence(
    connection: BaseDatabaseWrapper, name: str, fence: int, idle_limit: timedelta | None = None
) -> HeldTransaction | None:
    """The fence check of ``fenced_atomic``: the transaction that now holds the lease row,
    while ``fence`` is still current; None when it is not.

    It must run inside the transaction that makes the run's writes, and it must *lock*
    the lease row, not merely read it: a plain SELECT is check-then-act, and a
    successor could take the lease between the check and the commit.

    * With row locks (PostgreSQL), ``SELECT ... FOR UPDATE`` filtered on the fence. An
      acquirer's UPDATE of the same row waits until this transaction ends, and then
      sees the unchanged fence only after these writes are committed: the old holder's
      writes are ordered strictly before the takeover. If the takeover won the row first,
      this statement waits for it, re-reads the row, finds a newer fence and returns no
      row.
    * Without row locks (SQLite), a no-op conditional UPDATE filtered on the fence: the
      UPDATE takes the database's write lock, which is held until this transaction ends,
      so no acquisition can commit in between.

    On PostgreSQL the same statement bounds the transaction it locks in: with
    ``idle_limit`` (the job's ``lease_ttl``), the server ends *this transaction* if it sits
    idle longer than that (:func:`_limit_idle`), and it says which server transaction it is
    (:class:`HeldTransaction`), so that a supervisor can end it and nothing else
    (:func:`end_transaction`).

    No model instantiation: this runs in every fenced transaction, and its cost is the
    fence's whole price. On PostgreSQL it costs no round trip of its own either when it is
    the first statement of its transaction (as it is in a fenced block of its own): psycopg
    sends a transaction's ``BEGIN`` as a round trip of its own before the first statement,
    so here ``BEGIN`` and the check go together instead
    (:func:`~django_fencedjobs.db.first_statement`), and a fenced one-row transaction takes
    as many round trips as a plain one. The lock is the same.
    """
    if connection.features.has_select_for_update:
        sql = (
            f"SELECT {_IDENTIFY}, {_limit_idle(idle_limit)}"
            f" FROM {_table(connection)} WHERE name = %s AND fence = %s FOR UPDATE"
        )
        return _held(connection, first_statement(connection, sql, [name, fence]))
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {_table(connection)} SET fence = fence WHERE name = %s AND fence = %s",
            [name, fence],
        )
        updated: int = cursor.rowcount
    return _held(connection, ()) if updated == 1 else None


def lock_task_fence(
    connection: BaseDatabaseWrapper, name: str, fence: int, *, ttl: timedelta
) -> bool:
    """The fence check of ``fenced_atomic`` inside a ``django.tasks`` task that a run of
    ``name`` enqueued with ``fence``: True while no later run of the job has been granted the
    lease.

    A run's tasks usually run after it ended, and its end moves the fence on by one
    (:func:`end`), leaving the lease free. So the task may write while the row still shows
    its run holding (``fence``), or ended and not granted since (``fence + 1``, free); any
    acquisition after that (the next slot, or a takeover of a run paused past its lease)
    makes the task's writes fail. Locked as :func:`lock_fence` locks, for the same reason,
    but *shared* on PostgreSQL: the tasks of one run run side by side on many workers, and
    they must not queue on each other, only keep an acquisition (which skips the locked
    row and retries) from landing between their check and their commit.

    A task is not supervised as a run is, so the same statement limits how long *this
    transaction* may sit idle to ``ttl`` (the job's ``lease_ttl``): a worker paused inside a
    task's fenced block (SIGSTOP, a hung call) is ended by the server like a paused run,
    and its shared lock released, instead of keeping every later run of the job waiting.
    """
    table, free = _table(connection), connection.ops.adapt_datetimefield_value(LEASE_FREE)
    condition = "name = %s AND (fence = %s OR (fence = %s AND lease_until = %s))"
    params: list[Any] = [name, fence, fence + 1, free]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            limit = f"{max(int(ttl.total_seconds() * 1000), 1)}ms"
            cursor.execute(
                "SELECT set_config('idle_in_transaction_session_timeout', %s, true)"
                f" FROM {table} WHERE {condition} FOR SHARE",
                [limit, *params],
            )
            return cursor.fetchone() is not None
        if connection.features.has_select_for_update:
            cursor.execute(f"SELECT 1 FROM {table} WHERE {condition} FOR SHARE", params)
            return cursor.fetchone() is not None
        cursor.execute(f"UPDATE {table} SET fence = fence WHERE {condition}", params)
        updated: int = cursor.rowcount
        return updated == 1


def guard(
    connection: BaseDatabaseWrapper,
    name: str,
    fence: int,
    exclusion: str,
    idle_limit: timedelta | None = None,
) -> HeldTransaction | None:
    """The check ``fenced_atomic`` makes inside its transaction, by the job's exclusion: the
    fence (:func:`lock_fence`, the default) or the advisory lock
    (:func:`try_advisory_xact_lock`). The transaction that passed it, or None when the
    block may not go on."""
    if exclusion == "advisory":
        return try_advisory_xact_lock(connection, name, idle_limit)
    return lock_fence(connection, name, fence, idle_limit)


def advisory_key(name: str) -> int:
    """A stable signed 64-bit key for ``pg_advisory_xact_lock``, from the job's name."""
    digest = hashlib.blake2b(f"django-fencedjobs:{name}".encode(), digest_size=8).digest()
    value: int = struct.unpack(">q", digest)[0]
    return value


def try_advisory_xact_lock(
    connection: BaseDatabaseWrapper, name: str, idle_limit: timedelta | None = None
) -> HeldTransaction | None:
    """``exclusion="advisory"``: a transaction-scoped advisory lock on the job's key.

    PostgreSQL releases it when the transaction ends, so it is held exactly as long as the
    writes it guards are uncommitted: two transactions of the job never overlap. Being the
    transaction's, not the session's, it holds behind a transaction pooler too. It does
    not stop a stale holder from writing after a successor has finished; see
    docs/fencing.md for when that is acceptable. Bounded and identified as
    :func:`lock_fence` is.
    """
    sql = f"SELECT {_IDENTIFY}, {_limit_idle(idle_limit)} WHERE pg_try_advisory_xact_lock(%s)"
    return _held(connection, first_statement(connection, sql, [advisory_key(name)]))


def renew(name: str, fence: int, until: datetime) -> bool:
    """Extend the lease to ``until``; False when the fence is no longer ours.

    Conditional on the fence, so a superseded run cannot extend its successor's lease.
    ``Greatest`` keeps the lease from moving backwards if renewals arrive out of order.
    Run it in :func:`~django_fencedjobs.db.bounded_wait`: the run's own fenced transaction
    may hold the row.
    """
    return (
        JobLease.objects.using(lease_db())
        .filter(name=name, fence=fence)
        .update(lease_until=Greatest("lease_until", until))
        == 1
    )


@dataclass(frozen=True)
class Retry:
    """A failed run's next attempt, for :func:`end` and :func:`end_run` to schedule: the
    slot again, as attempt ``attempt``, ``backoff`` after the run's end."""

    backoff: timedelta
    slot: datetime
    attempt: int


def end(
    name: str,
    fence: int,
    *,
    succeeded_at: datetime | None,
    failed: bool,
    late_after: datetime | None = None,
    retry: Retry | None = None,
    final: bool = True,
    now: datetime | None = None,
) -> bool:
    """End the run's lease and record its result on the job; False when the fence was lost.

    Conditional on the fence: a superseded run records nothing on its successor's row.
    The fence is incremented: once a run has ended (finished, timed out, or given up on),
    every fenced block of it fails, in whichever thread kept its context, and so does any
    statement of it still on its way. ``lease_until`` goes back to the past so the next
    slot is not held up. A timed-out run ends with ``failed=True``: the revocation.

    ``retry``: the failed run's next attempt, scheduled ``retry.backoff`` after ``now``
    unless that is at or past the row's next slot (:data:`_RETRYING`); a failure counts
    towards ``consecutive_failures`` only when no retry follows it (a slot is judged by
    its last attempt), or once a later slot drops its retry (:func:`acquire`).
    ``final``: the run's outcome ends a backfill slot's or one-off's row (it is paused:
    done) unless a retry follows.
    """
    rows = JobLease.objects.using(lease_db()).filter(name=name, fence=fence)
    changes: dict[str, object] = {
        "fence": F("fence") + 1,
        "lease_until": LEASE_FREE,
        "owner": "",
    }
    one_shot = ~Q(kind=RunKind.SCHEDULED)
    done = one_shot
    if retry is not None:
        if now is None:
            raise ValueError("end(retry=...) needs now, the run's end")
        at = now + retry.backoff
        retrying = one_shot | Q(next_run_at__gt=at)
        instant, number = models.DateTimeField(), models.PositiveIntegerField()
        changes["next_run_at"] = Case(
            When(retrying, then=Value(at)), default=F("next_run_at"), output_field=instant
        )
        changes["run_slot"] = Case(
            When(retrying, then=Value(retry.slot)), default=F("run_slot"), output_field=instant
        )
        changes["attempt"] = Case(
            When(retrying, then=Value(retry.attempt)), default=F("attempt"), output_field=number
        )
        done = one_shot & ~retrying
    if final:
        changes["paused"] = Case(
            When(done, then=Value(True)), default=F("paused"), output_field=models.BooleanField()
        )
    if succeeded_at is not None:
        changes["last_success_at"] = succeeded_at
        changes["consecutive_failures"] = 0
        changes["last_failure_age"] = F("last_failure_age") + 1
        changes["previous_failure_age"] = F("previous_failure_age") + 1
        if late_after is not None:  # an instance's stored deadline moves on
            changes["late_after"] = late_after
    elif failed:
        judged = {"consecutive_failures": F("consecutive_failures") + 1, **_failure_aged()}
        if retry is not None:  # a slot is judged by its last attempt
            number = models.PositiveIntegerField()
            judged = {
                field: Case(When(retrying, then=F(field)), default=value, output_field=number)
                for field, value in judged.items()
            }
        changes.update(judged)
    return rows.update(**changes) == 1


@dataclass(frozen=True)
class Ended:
    """What :func:`end_run` recorded: whether the lease was still the run's (released), and
    what the run's row now says."""

    released: bool
    outcome: str
    error: str
    finished_at: datetime
    items: int
    batches: int
    watermark_after: str
    #: When the failed run's retry is due (None: no retry follows).
    retry_at: datetime | None = None


@dataclass(frozen=True)
class RunEnd:
    """How one run ended, as the runner decided it (:func:`~django_fencedjobs.outcomes.end`),
    for :func:`end_runs` to record: the run's lease (``name``, ``fence``) and row
    (``run_pk``). ``finished_at`` None: the database's clock. ``retry`` and ``final``: as
    :func:`end`'s. ``lost_outcome`` and ``lost_error``: what the run's row says instead
    when its lease was no longer its own (a successor took it over meanwhile)."""

    name: str
    fence: int
    run_pk: int
    outcome: str
    error: str
    capped: bool
    loose_items: int
    succeeded_at: datetime | None
    late_after: datetime | None
    finished_at: datetime | None
    retry: Retry | None = None
    final: bool = True
    lost_outcome: str = ""
    lost_error: str = ""

    @property
    def failed(self) -> bool:
        """The run counts as a failure of its job (unless a retry follows it)."""
        return self.outcome in FAILURE_OUTCOMES

    def recorded(self, released: bool) -> tuple[str, str]:
        """The outcome and error its row says, by whether its lease was still its own."""
        if released or not self.lost_outcome:
            return self.outcome, self.error
        return self.lost_outcome, self.lost_error


def end_run(end: RunEnd, *, lock_wait: float) -> Ended | None:
    """:func:`end_runs` for one run: what its row now says, or None when it was recorded
    already."""
    return end_runs([end], lock_wait=lock_wait).get(end.run_pk)


#: The lease of a run that failed (in :func:`end_runs`'s statement) goes to its retry:
#: always for a backfill slot or one-off, for a scheduled slot only before its next one.
_RETRYING = (
    f"(ending.retry_at IS NOT NULL AND (lease.kind <> '{RunKind.SCHEDULED}'"
    " OR ending.retry_at < lease.next_run_at))"
)
#: :data:`_RETRYING` as ``RETURNING`` reads it, from the row as updated (its
#: ``next_run_at`` is the retry's by then, never before it): the row holds the retry. A
#: scheduled row's ``run_slot`` is set only while a retry of it is pending.
_RETRIED = (
    f"(ending.retry_at IS NOT NULL AND (lease.kind <> '{RunKind.SCHEDULED}'"
    " OR lease.run_slot IS NOT NULL))"
)


def ends_together() -> bool:
    """Whether a loop's runs' ends are best recorded several at a time, a moment after their
    handlers return (:class:`~django_fencedjobs.runner.Unrecorded`): on PostgreSQL, where
    :func:`end_runs` records any number in one statement."""
    return connections[lease_db()].vendor == "postgresql"


def end_runs(ends: list[RunEnd], *, lock_wait: float) -> dict[int, Ended]:
    """Record each of ``ends``: :func:`end` on its lease row, then its run's row, in one
    transaction whose waits for row locks are bounded by ``lock_wait`` seconds. What each
    run's row now says, by its primary key; a run recorded already (by its supervisor, or a
    successor's takeover) is left as it is and missing from the result.

    Every lease row first, then the runs' rows, as every path that locks both (so a
    finishing run and its successor cannot deadlock). A run's row moves from running (or
    abandoned) to its outcome only, never from an outcome already recorded; when its lease
    was no longer its own it says :meth:`RunEnd.recorded`'s. What is recorded is decided
    by the caller; this applies it, in one statement on PostgreSQL
    (:func:`_end_runs_in_one_statement`), through the ORM elsewhere: the two spellings of
    one contract, which tests/test_end_store.py holds both to.
    """
    if not ends:
        return {}
    if connections[lease_db()].vendor == "postgresql":
        return _end_runs_in_one_statement(ends, lock_wait)
    return _end_runs_with_the_orm(ends, lock_wait)


def _end_runs_with_the_orm(ends: list[RunEnd], lock_wait: float) -> dict[int, Ended]:
    alias = lease_db()
    found: dict[int, Ended] = {}
    with bounded_wait(lock_wait):
        now = clock.now()
        released = {}
        for ending in ends:
            finished_at = ending.finished_at or now
            released[ending.run_pk] = end(
                ending.name,
                ending.fence,
                succeeded_at=ending.succeeded_at,
                failed=ending.failed,
                late_after=ending.late_after,
                retry=ending.retry,
                final=ending.final,
                now=finished_at,
            )
        runs = JobRun.objects.using(alias)
        for ending in ends:
            finished_at = ending.finished_at or now
            outcome, error = ending.recorded(released[ending.run_pk])
            if not runs.filter(pk=ending.run_pk, outcome__in=ENDABLE_OUTCOMES).update(
                outcome=outcome,
                error=error,
                finished_at=finished_at,
                capped=ending.capped,
                items=F("items") + ending.loose_items,
            ):
                continue
            items, batches, watermark_after = (
                runs.filter(pk=ending.run_pk)
                .values_list("items", "batches", "watermark_after")
                .get()
            )
            found[ending.run_pk] = Ended(
                released[ending.run_pk],
                outcome,
                error,
                finished_at,
                items,
                batches,
                watermark_after,
                _retried_at(ending, finished_at) if released[ending.run_pk] else None,
            )
    return found


def _retried_at(ending: RunEnd, finished_at: datetime) -> datetime | None:
    """As :data:`_RETRIED` reads it, after :func:`end`: when the row's retry is due, if it
    holds one."""
    if ending.retry is None:
        return None
    row = JobLease.objects.using(lease_db()).filter(name=ending.name).values("kind", "run_slot")
    held = row.first()
    if held is None or (held["kind"] == RunKind.SCHEDULED and held["run_slot"] is None):
        return None
    return finished_at + ending.retry.backoff


def _end_runs_in_one_statement(ends: list[RunEnd], lock_wait: float) -> dict[int, Ended]:
    """:func:`end_runs` on PostgreSQL: one statement, its own transaction when none is open,
    one round trip (:func:`~django_fencedjobs.db.bounded_rows`). ``lease`` aggregates the
    lease rows' UPDATE, so all of it is done (waiting for a lease row if need be) before
    any run's row can be updated, and so locked; a data-modifying CTE nobody reads would
    run after the main statement instead. The values are the caller's, in one JSON
    parameter; the constants of the statement are literals."""
    connection = connections[lease_db()]
    run_table = connection.ops.quote_name(JobRun._meta.db_table)
    retrying = _RETRYING
    scheduled, running, abandoned = (
        f"'{RunKind.SCHEDULED}'",
        f"'{Outcome.RUNNING}'",
        f"'{Outcome.ABANDONED}'",
    )
    sql = (
        "WITH ending AS (SELECT *, COALESCE(finished_at, clock_timestamp()) + backoff"
        "  AS retry_at FROM (SELECT * FROM json_to_recordset(%s::json) AS ending("
        "  name text, fence bigint, run_pk bigint, outcome text, error text, capped boolean,"
        "  loose_items bigint, succeeded_at timestamptz, late_after timestamptz,"
        "  finished_at timestamptz, backoff interval, retry_slot timestamptz,"
        "  retry_attempt integer, final boolean, failed boolean,"
        # LIMIT: how many rows the JSON holds, for the planner (see take).
        "  lost_outcome text, lost_error text) LIMIT %s) AS ending),"
        " released AS ("
        f" UPDATE {_table(connection)} AS lease SET fence = lease.fence + 1,"
        "  lease_until = %s, owner = '',"
        "  last_success_at = COALESCE(ending.succeeded_at, lease.last_success_at),"
        "  consecutive_failures = CASE WHEN ending.succeeded_at IS NOT NULL THEN 0"
        f"   WHEN ending.failed AND NOT {retrying} THEN lease.consecutive_failures + 1"
        "   ELSE lease.consecutive_failures END,"
        + _aged(
            succeeded="ending.succeeded_at IS NOT NULL",
            failed=f"ending.failed AND NOT {retrying}",
            row="lease.",
        )
        + ","
        "  late_after = COALESCE(ending.late_after, lease.late_after),"
        f"  next_run_at = CASE WHEN {retrying} THEN ending.retry_at ELSE lease.next_run_at END,"
        f"  run_slot = CASE WHEN {retrying} THEN ending.retry_slot ELSE lease.run_slot END,"
        f"  attempt = CASE WHEN {retrying} THEN ending.retry_attempt ELSE lease.attempt END,"
        "  paused = lease.paused OR"
        f"   (ending.final AND lease.kind <> {scheduled} AND NOT {retrying})"
        "  FROM ending WHERE lease.name = ending.name AND lease.fence = ending.fence"
        f"  RETURNING lease.name, CASE WHEN {_RETRIED} THEN ending.retry_at END AS retry_at),"
        " lease AS (SELECT COALESCE(array_agg(name), '{}') AS names,"
        "  COALESCE(array_agg(retry_at), '{}') AS retry_at FROM released),"
        " settled AS (SELECT ending.*, array_position(lease.names, ending.name) AS place,"
        "  lease.retry_at AS retries FROM ending, lease)"
        f" UPDATE {run_table} AS run SET"
        "  outcome = CASE WHEN settled.place IS NULL AND settled.lost_outcome <> ''"
        "   THEN settled.lost_outcome ELSE settled.outcome END,"
        "  error = CASE WHEN settled.place IS NULL AND settled.lost_outcome <> ''"
        "   THEN settled.lost_error ELSE settled.error END,"
        "  finished_at = COALESCE(settled.finished_at, clock_timestamp()),"
        "  capped = settled.capped, items = run.items + settled.loose_items"
        f" FROM settled WHERE run.id = settled.run_pk AND run.outcome IN ({running}, {abandoned})"
        " RETURNING run.id, settled.place IS NOT NULL, run.outcome, run.error,"
        "  run.finished_at, run.items, run.batches, run.watermark_after,"
        "  settled.retries[settled.place]"
    )
    payload = _json(
        {
            "name": end.name,
            "fence": end.fence,
            "run_pk": end.run_pk,
            "outcome": end.outcome,
            "error": end.error,
            "capped": end.capped,
            "loose_items": end.loose_items,
            "succeeded_at": end.succeeded_at,
            "late_after": end.late_after,
            "finished_at": end.finished_at,
            # An interval PostgreSQL reads: seconds, with their fraction.
            "backoff": f"{end.retry.backoff.total_seconds()} seconds" if end.retry else None,
            "retry_slot": end.retry.slot if end.retry else None,
            "retry_attempt": end.retry.attempt if end.retry else None,
            "final": end.final,
            "failed": end.failed,
            "lost_outcome": end.lost_outcome,
            "lost_error": end.lost_error,
        }
        for end in ends
    )
    rows = bounded_rows(
        sql,
        [payload, len(ends), LEASE_FREE],
        lock_wait,
        setup=lambda cursor: _load_instants_in_c(connection, cursor),
    )
    return {pk: Ended(*values) for pk, *values in rows}


# -- the handler's transaction ------------------------------------------------------------


@dataclass(frozen=True)
class HeldTransaction:
    """The transaction of a fenced block, as its fence check found it: what a supervisor
    ends when the block's handler will not stop (:func:`end_transaction`).

    PostgreSQL: the server process (``pid``) and the transaction's start (``started``). A
    server session is no identity here: a connection pooler in transaction mode (PgBouncer,
    Django's own pool) hands one server session to many clients in turn, and a handler may
    reconnect during its run. A transaction is the handler's alone. SQLite: the DB-API
    connection (``raw``), which only this process uses.
    """

    alias: str
    pid: int = 0
    started: datetime | None = None
    raw: Any = None


#: What :class:`HeldTransaction` is made of, in the fence check's select list:
#: ``now()`` is the transaction's start, as ``pg_stat_activity.xact_start`` shows it.
_IDENTIFY = "pg_backend_pid(), now()"


def _limit_idle(idle_limit: timedelta | None) -> str:
    """The select-list item that limits how long the checking transaction may sit idle.

    A holder paused (SIGSTOP, a suspended VM, a GC pause) inside its fenced transaction is,
    to the server, a session idle in transaction; so is a handler that sits in Python (a
    sleep, a call to another service) for longer than that inside one. With
    ``idle_in_transaction_session_timeout`` set to the job's ``lease_ttl`` the server ends
    such a transaction after ``lease_ttl``: its writes roll back and its lock on the lease
    row goes, so the job is taken over at its next slot instead of freezing until the
    holder resumes. ``set_config(..., true)`` scopes the setting to this transaction, so
    nothing of the run outlives it on the server session: behind a transaction pooler the
    next client of that session never inherits it. ``NULL`` when there is no limit to set.
    """
    if idle_limit is None:
        return "NULL"
    limit = f"{max(int(idle_limit.total_seconds() * 1000), 1)}ms"
    return f"set_config('idle_in_transaction_session_timeout', '{limit}', true)"  # digits only


def _held(connection: BaseDatabaseWrapper, row: tuple[Any, ...] | None) -> HeldTransaction | None:
    if row is None:
        return None
    if connection.vendor == "postgresql":
        return HeldTransaction(connection.alias, pid=row[0], started=row[1])
    return HeldTransaction(connection.alias, raw=connection.connection)


def end_transaction(held: HeldTransaction) -> bool:
    """End the fenced transaction ``held``, if it is still open: it rolls back and its locks
    go. True when something was ended.

    For a handler past its timeout that holds the lease row (inside a fenced transaction,
    blocked where no interrupt reaches it). PostgreSQL: the server process is terminated
    only while that same transaction is open on it (pid *and* transaction start, checked in
    the statement that terminates): not a later transaction of the handler, not another
    client's that a pooler has since given the session to, not a reused pid. The session
    goes with it, which a pooler replaces. SQLite: the connection is closed.
    """
    if held.raw is not None:
        held.raw.close()
        return True
    with connections[held.alias].cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE pid = %s AND xact_start = %s",
            [held.pid, held.started],
        )
        return cursor.fetchone() is not None
