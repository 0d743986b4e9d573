"""Every statement that decides exclusion, in one place.

A job's lease is its :class:`~django_fencedjobs.models.JobLease` row; its *fence* is a
counter on the row that taking the lease, ending a run and revoking one increment, and that
never goes down. A run keeps the fence it was given and every later statement of it is
conditional on the row still carrying it: a run paused (GC, VM suspend, SIGSTOP) while a
successor took over matches zero rows, and changes nothing. ``lease_until`` only decides
*when* a successor may take over; what keeps two runs from writing at once is
:func:`lock_fence`, inside the very transaction that writes.

Each function says why its statement is safe. The ORM is used where it can say a statement,
the cursor where it cannot or where model instantiation would dominate a small transaction.
"""

from __future__ import annotations

import functools
import hashlib
import json
import struct
from collections.abc import Collection, Iterable
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connections, models, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Case, Count, Exists, F, Max, Min, OuterRef, Q, Value, When
from django.db.models.functions import Greatest, Least

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
    #: The fence of the last run whose fenced work committed (:func:`lock_fence`).
    committed_fence: int | None = None

    def is_due(self, now: datetime) -> bool:
        return not self.paused and self.next_run_at <= now and self.lease_until < now

    @property
    def wakeup(self) -> datetime:
        """When this job can next be acquired: its slot, or its lease's end if later."""
        return max(self.next_run_at, self.lease_until)


#: The columns of a :class:`LeaseRow`, in its order, and as a claim selects them.
_ROW_FIELDS = tuple(field.name for field in fields(LeaseRow))
_LEASE_COLUMNS = ", ".join(f"lease.{field}" for field in _ROW_FIELDS)


def read(names: list[str]) -> dict[str, LeaseRow]:
    """The lease rows of these jobs, in one query. Reading is not deciding: two processes
    may both see a job due here; only :func:`acquire` decides, and only one wins it."""
    rows = JobLease.objects.using(lease_db()).filter(name__in=names).values_list(*_ROW_FIELDS)
    return {row[0]: LeaseRow(*row) for row in rows}


@dataclass(frozen=True)
class Scan:
    """What one tick needs of its jobs' lease rows, from :func:`scan`."""

    #: Every existing row's schedule fingerprint, by job name (a missing name: no row yet).
    fingerprints: dict[str, str]
    #: The rows due at ``now``, in full: what :func:`acquire` compares against.
    due: list[LeaseRow]
    #: The earliest :attr:`LeaseRow.wakeup` of the rows neither paused nor due.
    wakeup: datetime | None


def scan(names: list[str], now: datetime) -> Scan:
    """The tick's read: one query whose cost barely grows with the number of jobs (bench P3).
    On PostgreSQL the names go as one array (joined: cheaper than ``= ANY`` for hundreds),
    due-ness is :meth:`LeaseRow.is_due` in SQL, and timestamps (parsing them is most of the
    cost) come back only for due rows and the earliest wakeup. Decides nothing."""
    connection = connections[lease_db()]
    if connection.vendor != "postgresql":
        rows = read(names).values()
        wakeups = [row.wakeup for row in rows if not row.paused and not row.is_due(now)]
        return Scan(
            {row.name: row.schedule_fingerprint for row in rows},
            [row for row in rows if row.is_due(now)],
            min(wakeups, default=None),
        )
    result = _fetch(
        connection,
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


def _fetch(connection: BaseDatabaseWrapper, sql: str, params: list[Any]) -> list[Any]:
    """The rows of a read on PostgreSQL, its instants parsed in C (most of its cost)."""
    with connection.cursor() as cursor:
        _load_instants_in_c(connection, cursor.cursor)
        cursor.execute(sql, params)
        return list(cursor.fetchall())


#: A lease row's fences start at its id times this (:func:`create`).
FENCE_EPOCH = 2**32


def create(rows: list[JobLease], *, ignore_conflicts: bool = True) -> None:
    """Create lease rows, each with its first fence. With ``ignore_conflicts`` a row whose
    name exists is left as it is (racing creators are harmless); without, IntegrityError.

    A fence must never repeat for a name, even across a row deleted and created again: a run
    of the old row holding fence 7 would pass the new row's check at its seventh run. So a
    row's fences start at its id times :data:`FENCE_EPOCH`, set in the inserting transaction:
    ids never repeat (a sequence; ``AUTOINCREMENT`` on SQLite), so a row starts above every
    fence before it, unless one was taken 2**32 times (a century at a run a second). Rows of
    older releases start at 0, below them all.
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
    """Recompute the job's next slot after its schedule changed in code, once: conditional
    on the fingerprint it replaces, so racing processes do not both do it. True when this
    call did. A row locked right now (a run inside a fenced transaction) is passed over,
    not waited for (``SKIP LOCKED``): the next tick, or the next observer, recomputes it."""
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
    holds the row right now. Call it in the transaction that records the run: both commit,
    or neither. ``dropped_retry``: :attr:`django_fencedjobs.slots.Slot.dropped_retry`.

    One conditional UPDATE, a compare-and-set on the row as read (fence and slot unchanged,
    lease expired): of two racing acquirers, the second re-evaluates the WHERE against the
    first's committed row and updates nothing. It moves ``next_run_at`` past the slot too,
    so the slot is not due again even if this run dies (a one-shot row stays due for its
    next attempt instead, as :func:`django_fencedjobs.slots.plan` says). On PostgreSQL the
    row is locked first, ``FOR UPDATE SKIP LOCKED``: a row someone holds (a run in its
    fenced transaction, another acquirer) is passed over, not waited for, so one stuck
    holder never holds up the jobs behind it; :func:`lock_fence` bounds its idle time.
    """
    connection = connections[lease_db()]
    if connection.vendor == "postgresql":
        table, as_seen = _table(connection), (seen.name, seen.fence, seen.next_run_at, now)
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET fence = fence + 1, owner = %s, lease_until = %s,"
                " next_run_at = %s, run_slot = %s, attempt = %s,"
                " consecutive_failures = consecutive_failures + %s,"
                f" {_aged(failed='TRUE' if dropped_retry else 'FALSE')}"
                f" WHERE name = (SELECT name FROM {table} WHERE name = %s AND fence = %s"
                "  AND next_run_at = %s AND lease_until < %s AND NOT paused"
                "  FOR UPDATE SKIP LOCKED)",
                [owner, now + ttl, next_run_at, run_slot, attempt, int(dropped_retry), *as_seen],
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
    """The failure ages as SQL SET items: a success when ``succeeded`` holds, a failure
    (:func:`_failure_aged`) when ``failed`` does, else unchanged. An age with no failure
    before it stays NULL."""
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
    """Lock up to ``limit`` of the due rows ``names`` (from :func:`scan`), earliest first,
    with their watermarks, for :func:`take` in the same transaction. ``FOR UPDATE SKIP
    LOCKED`` (PostgreSQL): a row another runner is claiming, or that a run holds in a fenced
    transaction, is passed over, not waited for, so runners get disjoint batches. Elsewhere
    the rows are read unlocked and :func:`take`'s compare-and-set decides."""
    if limit < 1 or not names:
        return []
    connection = connections[lease_db()]
    if connection.vendor != "postgresql":
        rows = JobLease.objects.using(lease_db()).filter(
            name__in=names, paused=False, next_run_at__lte=now, lease_until__lt=now
        )
        return _with_watermarks(list(rows.order_by("next_run_at")[:limit]), instance=False)
    found = _fetch(
        connection,
        f"SELECT {_LEASE_COLUMNS}, {_marks(connection)}"
        f" FROM {_table(connection)} AS lease"
        "  JOIN unnest(%s::text[]) AS job(name) ON lease.name = job.name"
        " WHERE NOT lease.paused AND lease.next_run_at <= %s AND lease.lease_until < %s"
        " ORDER BY lease.next_run_at LIMIT %s"
        " FOR UPDATE OF lease SKIP LOCKED",
        [_text_array(tuple(names)), now, now, limit],
    )
    return [DueRow(LeaseRow(*row), None, _watermarks_from_json(marks)) for *row, marks in found]


def _marks(connection: BaseDatabaseWrapper) -> str:
    """The select-list item of a claim that reads the row's watermarks, as JSON text."""
    return (
        "(SELECT json_agg(json_build_array(mark.key, mark.position, mark.cursor))"
        f"  FROM {_table(connection, Watermark)} AS mark WHERE mark.job = lease.name)::text"
    )


def claim_instances(
    parents: list[str], now: datetime, limit: int, held: Collection[str] = ()
) -> list[DueRow]:
    """Lock up to ``limit`` due instances of the jobs ``parents``, for :func:`take` in the
    same transaction: earliest first within each job, the jobs in the order given. By the
    partial index on ``(parent, next_run_at)`` of unpaused instance rows, whose first
    entries are a job's earliest: the cost of ``limit`` rows, however many instances (bench
    P10). Locked as :func:`claim_named` locks; on PostgreSQL one statement per job. The rows
    ``held`` (by the claiming runner's own workers) are passed by, expired or not: a runner
    paused past their leases never takes a run over from itself."""
    claimed: list[DueRow] = []
    passed_by = tuple(held)
    for parent in parents:
        if len(claimed) >= limit:
            break
        claimed += _claim_of(parent, now, limit - len(claimed), passed_by)
    return claimed


#: What a claim of instances reads of each instance (its ``kwargs`` too, as text).
_INSTANCE_FIELDS = "id job key cron every timezone jitter enabled timeout grace".split()
#: And its JSON fields, as text.
_INSTANCE_JSON = ("kwargs", "exclude")


def _claim_of(parent: str, now: datetime, limit: int, held: tuple[str, ...]) -> list[DueRow]:
    connection = connections[lease_db()]
    if connection.vendor != "postgresql":
        rows = (
            JobLease.objects.using(lease_db())
            .filter(
                parent=parent,
                instance__isnull=False,
                paused=False,
                next_run_at__lte=now,
                lease_until__lt=now,
            )
            .exclude(name__in=held)
        )
        claim = rows.select_related("instance").order_by("next_run_at")[:limit]
        return _with_watermarks(list(claim), instance=True)
    instance_columns = ", ".join(f"instance.{field}" for field in _INSTANCE_FIELDS)
    found = _fetch(
        connection,
        f"SELECT {_LEASE_COLUMNS}, {instance_columns},"
        f" {', '.join(f'instance.{name}::text' for name in _INSTANCE_JSON)}, {_marks(connection)}"
        f" FROM {_table(connection)} AS lease"
        f" JOIN {_table(connection, JobInstance)} AS instance ON instance.id = lease.instance_id"
        " WHERE lease.parent = %s AND lease.instance_id IS NOT NULL AND NOT lease.paused"
        "  AND lease.next_run_at <= %s AND lease.lease_until < %s"
        "  AND NOT lease.name = ANY(%s::text[])"
        " ORDER BY lease.next_run_at LIMIT %s"
        " FOR UPDATE OF lease SKIP LOCKED",
        [parent, now, now, list(held), limit],
    )
    width = len(_ROW_FIELDS)
    claimed = []
    for row in found:
        *values, kwargs, exclude, marks = row[width:]
        instance = dict(zip(_INSTANCE_FIELDS, values, strict=True))
        instance.update(kwargs=json.loads(kwargs), exclude=json.loads(exclude))
        lease_row = LeaseRow(*row[:width])
        claimed.append(DueRow(lease_row, JobInstance(**instance), _watermarks_from_json(marks)))
    return claimed


def _watermarks_from_json(text: str | None) -> dict[str, datetime | int]:
    found: dict[str, datetime | int] = {}
    for key, position, cursor in json.loads(text) if text else ():
        if position is not None:
            found[key] = datetime.fromisoformat(position)
        elif cursor is not None:
            found[key] = int(cursor)
    return found


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
    """The earliest next fire time of each job's unpaused instances, if any, by the index
    :func:`claim_instances` reads (one entry per job). Decides nothing."""
    connection = connections[lease_db()]
    if connection.vendor != "postgresql":
        return dict(
            JobLease.objects.using(lease_db())
            .filter(parent__in=parents, instance__isnull=False, paused=False)
            .values("parent")
            .annotate(earliest=Min("next_run_at"))
            .values_list("parent", "earliest")
        )
    return dict(
        _fetch(
            connection,
            "SELECT job.parent, earliest.next_run_at FROM unnest(%s::text[]) AS job(parent)"
            " CROSS JOIN LATERAL (SELECT next_run_at"
            f"  FROM {_table(connection)} AS lease WHERE lease.parent = job.parent"
            "  AND lease.instance_id IS NOT NULL AND NOT lease.paused"
            "  ORDER BY lease.next_run_at LIMIT 1) AS earliest",
            [list(parents)],
        )
    )


@dataclass(frozen=True)
class DueOneShot:
    """A due backfill slot's or one-off's lease row locked by :func:`claim_oneshots`, with
    the one-off's arguments."""

    row: LeaseRow
    kwargs: dict[str, Any] | None


def claim_oneshots(
    parents: list[str], now: datetime, limit: int, held: Collection[str] = ()
) -> list[DueOneShot]:
    """Lock up to ``limit`` due backfill slots and one-offs of the jobs ``parents``, earliest
    first, for :func:`acquire` in the same transaction (``SKIP LOCKED``, by their partial
    index), each backfill kept to its ``concurrency`` under a lock on its ``Backfill`` row
    (:func:`_backfill_room`): of two runners claiming one backfill's slots at once, one
    counts the rows held and claims, the other claims none of them at this pass. Together
    they never exceed it, and neither waits. The rows ``held`` are passed by, as
    :func:`claim_instances` passes them by."""
    alias = lease_db()
    features = connections[alias].features
    rows = list(
        JobLease.objects.using(alias)
        .select_for_update(skip_locked=features.has_select_for_update_skip_locked)
        .filter(parent__in=parents, paused=False, next_run_at__lte=now, lease_until__lt=now)
        .exclude(kind=RunKind.SCHEDULED)
        .exclude(name__in=held)
        .order_by("next_run_at")
        .values_list(*_ROW_FIELDS, "kwargs", "backfill_id")[:limit]
    )
    room = _backfill_room(sorted({row[-1] for row in rows if row[-1] is not None}), now)
    claimed = []
    for *row_fields, kwargs, backfill_id in rows:
        if backfill_id is not None:
            if room.get(backfill_id, 0) < 1:
                continue
            room[backfill_id] -= 1
        claimed.append(DueOneShot(LeaseRow(*row_fields), kwargs))
    return claimed


def _backfill_room(ids: list[int], now: datetime) -> dict[int, int]:
    """How many more slots each backfill may start now: its concurrency less its rows held.
    ``FOR NO KEY UPDATE SKIP LOCKED``: a backfill whose row another session holds (a runner
    claiming its slots, retention deleting it) has no room at this pass, and the dispatcher
    never waits for it. ``NO KEY``: its slots' rows, whose foreign key shares the lock, do
    not make it skipped."""
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
    """The earliest ``next_run_at`` of each job's unpaused one-shot rows, if any. Read every
    tick: it reads *every* job's (usually none or a few, by their partial index) and keeps
    this runner's in Python, rather than send thousands of names. Decides nothing."""
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


def _abandon(now: datetime, error: str, *where: Any, **conditions: Any) -> int:
    """Record abandoned the runs still marked running that match: how many."""
    return (
        JobRun.objects.using(lease_db())
        .filter(*where, outcome=Outcome.RUNNING, **conditions)
        .update(outcome=Outcome.ABANDONED, finished_at=now, error=error)
    )


def mark_abandoned(name: str, fence: int, now: datetime) -> None:
    """Runs of this job still marked running under an older fence belong to a holder whose
    lease expired (dead, or paused and since superseded): record them abandoned. Called in
    the acquiring transaction, so only the new fence holder does it."""
    _abandon(now, outcomes.ABANDONED, job=name, kind=RunKind.SCHEDULED, fence__lt=fence)


def mark_oneshot_abandoned(
    job: str, kind: str, slot: datetime, fence: int, now: datetime, error: str = outcomes.ABANDONED
) -> None:
    """:func:`mark_abandoned` for a backfill slot or one-off: its earlier attempts, recorded
    as the target ``job`` (whose own runs have fences of another row)."""
    _abandon(now, error, job=job, kind=kind, scheduled_for=slot, fence__lt=fence)


def end_orphans(now: datetime) -> int:
    """Record abandoned, and count, the runs still marked running that no acquisition will
    find (:func:`mark_abandoned`) since their job or instance is not run again: its lease
    row is gone or carries a later fence (the run can write nothing), or is paused with the
    run's fence and expired: that row's fence is moved on first, as an acquisition would,
    so that a holder that was only paused writes nothing when it resumes. Runs of kind
    ``scheduled`` only (a one-shot's row stays due); a lease that holds is never touched.
    """
    error = outcomes.ABANDONED_ORPHAN
    lease_of = JobLease.objects.filter(name=OuterRef("job"))
    gone = ~Exists(lease_of.filter(fence__lte=OuterRef("fence")))
    ended = _abandon(now, error, gone, kind=RunKind.SCHEDULED)
    stuck = Exists(lease_of.filter(fence=OuterRef("fence"), paused=True, lease_until__lt=now))
    for name, fence in list(
        JobRun.objects.using(lease_db())
        .filter(stuck, outcome=Outcome.RUNNING, kind=RunKind.SCHEDULED)
        .values_list("job", "fence")
    ):
        revoked = (
            JobLease.objects.using(lease_db())
            .filter(name=name, fence=fence, paused=True, lease_until__lt=now)
            .update(fence=F("fence") + 1, owner="", lease_until=LEASE_FREE)
        )
        if revoked:
            ended += _abandon(now, error, job=name, fence=fence, kind=RunKind.SCHEDULED)
    return ended


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
    """Take the leases of a batch of rows locked by a claim and record their runs: ``(taken
    and recorded, with their primary key; passed, their slot recorded already)``.

    Only the rows whose run was inserted are taken, by :func:`acquire`'s compare-and-set,
    and older fences' runs still running are marked abandoned (:func:`mark_abandoned`). A
    row whose slot was recorded already is moved past it, its fence unchanged (as
    :func:`~django_fencedjobs.operations.skip_slot` does): every fence a row hands out is a
    recorded run's. On PostgreSQL one statement, whatever the batch; elsewhere row by row.
    """
    if not batch:
        return [], []
    connection = connections[lease_db()]
    if connection.vendor != "postgresql":
        return _take_elsewhere(batch, now)
    run_table = _table(connection, JobRun)
    columns = ", ".join(_RECORD_COLUMNS)
    # A retry (attempt 2 on) is the slot's next attempt, as insert_as_next_attempt numbers
    # it. (The batch's rows are distinct jobs: no two of its runs share a slot.)
    values = ", ".join(
        f"CASE WHEN run.attempt > 1 THEN GREATEST(run.attempt, 1 + (SELECT"
        f" COALESCE(MAX(done.attempt), 0) FROM {run_table} AS done WHERE"
        " done.job = run.job AND done.scheduled_for = run.scheduled_for))"
        " ELSE run.attempt END"
        if column == "attempt"
        else f"run.{column}"
        for column in _RECORD_COLUMNS
    )
    # Only a row whose last run did not end its lease (killed, given up on) may have runs
    # still marked running; a batch without one does without that part.
    abandoned = any(item.row.lease_until != LEASE_FREE for item in batch)
    marking = (Outcome.ABANDONED, now, outcomes.ABANDONED, Outcome.RUNNING, RunKind.SCHEDULED)
    with connection.cursor() as cursor:
        cursor.execute(
            # The batch is one JSON parameter, unpacked by the server: quoting a value at a
            # time on the client costs more than the statement. Each LIMIT tells the planner
            # how many rows the JSON holds (it guesses 100 for any set-returning function,
            # and would scan every lease row to join them).
            "WITH claimed AS (SELECT * FROM json_to_recordset(%s::json)"
            "  AS claimed(name text, fence bigint, slot timestamptz, next_run_at timestamptz,"
            "  lease_until timestamptz, run_slot timestamptz, attempt integer,"
            "  dropped integer) LIMIT %s),"
            # The rows the batch may take, checked as the grant below checks them.
            " takeable AS ("
            f" SELECT lease.name FROM {_table(connection)} AS lease JOIN claimed"
            "  ON lease.name = claimed.name WHERE lease.fence = claimed.fence"
            "  AND lease.next_run_at = claimed.slot AND lease.lease_until < %s"
            "  AND NOT lease.paused),"
            # The runs first: a row is taken only when its run is recorded, so no fence is
            # handed out without a run.
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
                # statement's own inserts are not visible to it. (Kind "scheduled" only:
                # a backfill slot's runs are recorded under their job's name.)
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
                *(marking if abandoned else ()),
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
    "job scheduled_for started_at finished_at outcome capped items batches fence owner"
    " missed_slots watermark_before watermark_after error attempt kind interval_start"
).split()


def _json(rows: Iterable[dict[str, Any]]) -> str:
    """``rows`` as one JSON array, instants in ISO 8601 (what ``timestamptz`` reads)."""
    return json.dumps(list(rows), default=datetime.isoformat)


def insert_as_next_attempt(record: JobRun) -> None:
    """Insert a retry's or one-shot's run as its slot's next attempt: if the slot's history
    grew since its number was read, as the one after the slot's latest, never dropped (its
    lease is taken, its slot must run). :func:`take` numbers a batch's retries so too."""
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
    """On psycopg's ``cursor``: read timestamptz values with psycopg's own loader, in C (the
    same instants in the same zone): Django's is a Python subclass of it, some 3 µs a
    value, and a fleet draining a stampede reads thousands of rows every few tenths of a
    second."""
    if connection.timezone is not None:
        from psycopg.types.datetime import TimestamptzLoader

        cursor.adapters.register_loader("timestamptz", TimestamptzLoader)


def pause_invalid(name: str, fence: int) -> None:
    """Pause a row found unable to run when claimed (an instance changed without
    :func:`~django_fencedjobs.instances.save`, a one-shot whose target is gone): conditional
    on the fence as claimed. A lease still held by a run that never ended (its holder dead,
    or paused past it) is ended as an acquisition would end it, fence + 1: no acquisition
    will follow on a paused row, so that holder writes nothing should it resume, and its run
    is one that :func:`end_orphans` or :func:`mark_oneshot_abandoned` records abandoned."""
    rows = JobLease.objects.using(lease_db()).filter(name=name, fence=fence)
    rows.filter(lease_until=LEASE_FREE).update(paused=True)
    rows.exclude(lease_until=LEASE_FREE).update(
        paused=True, fence=F("fence") + 1, owner="", lease_until=LEASE_FREE
    )


def _table(connection: BaseDatabaseWrapper, model: type[models.Model] = JobLease) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def lock_fence(
    connection: BaseDatabaseWrapper, name: str, fence: int, idle_limit: timedelta | None = None
) -> HeldTransaction | None:
    """The fence check of ``fenced_atomic``: the transaction that now holds the lease row,
    while ``fence`` is still current; None when it is not.

    It runs in the transaction that writes, and *locks* the row (a plain SELECT would be
    check-then-act: a successor could take the lease before the commit). It is an UPDATE
    on the fence: an acquirer's UPDATE waits until this transaction ends, so these writes
    are ordered strictly before the takeover; a takeover that won the row first leaves a
    newer fence, and no row. (SQLite has one write lock, which it takes until the end.)

    What it sets, ``committed_fence = fence``, commits with the block's writes or rolls
    back with them, so the row says exactly whether this run's fenced work committed, even
    if the run dies before its end is recorded or ends by a timeout: a slot whose work
    committed is not run again by accident (:func:`django_fencedjobs.retries.redoes`).

    On PostgreSQL it also limits this transaction's idle time (:func:`_limit_idle`) and says
    which server transaction it is (:class:`HeldTransaction`), and it rides with ``BEGIN``
    (:func:`~django_fencedjobs.db.first_statement`): its cost is the fence's whole price.
    """
    sql = f"UPDATE {_table(connection)} SET committed_fence = fence WHERE name = %s AND fence = %s"
    if connection.vendor == "postgresql":
        sql += f" RETURNING {_IDENTIFY}, {_limit_idle(idle_limit)}"
        return _held(connection, first_statement(connection, sql, [name, fence]))
    with connection.cursor() as cursor:
        cursor.execute(sql, [name, fence])
        updated: int = cursor.rowcount
    return _held(connection, ()) if updated == 1 else None


def lock_task_fence(
    connection: BaseDatabaseWrapper, name: str, fence: int, *, ttl: timedelta
) -> bool:
    """The fence check of ``fenced_atomic`` in a ``django.tasks`` task that a run of ``name``
    enqueued with ``fence``: True while no later run of the job has been granted the lease
    (the row shows ``fence``, or ``fence + 1`` and free: the run's end). Locked as
    :func:`lock_fence` locks, but *shared*: a run's tasks must not queue on each other, only
    keep an acquisition from landing between their check and their commit. Its idle time
    is limited to ``ttl`` as :func:`lock_fence`'s is: a task is not supervised."""
    table, free = _table(connection), connection.ops.adapt_datetimefield_value(LEASE_FREE)
    condition = "name = %s AND (fence = %s OR (fence = %s AND lease_until = %s))"
    params: list[Any] = [name, fence, fence + 1, free]
    with connection.cursor() as cursor:
        if connection.features.has_select_for_update:
            limit = _limit_idle(ttl) if connection.vendor == "postgresql" else "1"
            cursor.execute(f"SELECT {limit} FROM {table} WHERE {condition} FOR SHARE", params)
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
    """``exclusion="advisory"``: a transaction-scoped advisory lock on the job's key, held
    exactly as long as the writes it guards are uncommitted (behind a pooler too). It does
    not stop a stale holder writing after a successor has finished (docs/fencing.md).
    Bounded and identified as :func:`lock_fence` is."""
    sql = f"SELECT {_IDENTIFY}, {_limit_idle(idle_limit)} WHERE pg_try_advisory_xact_lock(%s)"
    return _held(connection, first_statement(connection, sql, [advisory_key(name)]))


def renew(name: str, fence: int, until: datetime, *, to_next_slot: bool = False) -> bool:
    """Extend the lease to ``until``; False when the fence is no longer ours (a superseded
    run cannot extend its successor's). ``Greatest``: renewals out of order never move it
    backwards. ``to_next_slot`` (``overlap="replace"``): never past the row's next slot, so
    that the slot's run can take the lease over then, from a holder paused or gone too. Run
    it in ``bounded_wait``: the run's own fenced transaction may hold the row."""
    bound: Any = Least(Value(until), F("next_run_at")) if to_next_slot else until
    return (
        JobLease.objects.using(lease_db())
        .filter(name=name, fence=fence)
        .update(lease_until=Greatest("lease_until", bound))
        == 1
    )


def mark_replaced(names: list[str], now: datetime) -> None:
    """The runs of ``names`` (``overlap="replace"`` jobs whose held row a claim just took
    over at its next slot) that the claim recorded abandoned are replaced instead."""
    JobRun.objects.using(lease_db()).filter(
        job__in=names, kind=RunKind.SCHEDULED, outcome=Outcome.ABANDONED, finished_at=now
    ).update(outcome=Outcome.REPLACED, error=outcomes.REPLACED_BY_CLAIM)


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
    """End the run's lease and record its result on the job; False when the fence was lost
    (a superseded run records nothing on its successor's row). The fence is incremented, so
    every later fenced block or statement of an ended run (finished, timed out: revoked, or
    given up on) fails; ``lease_until`` goes to the past so the next slot is not held up.

    ``retry``: scheduled ``retry.backoff`` after ``now`` unless that reaches the row's next
    slot (:data:`_RETRYING`); a failure counts only when no retry follows (a slot is judged
    by its last attempt), or once a later slot drops it (:func:`acquire`). ``final``: the
    outcome ends a one-shot row (paused: done) unless a retry follows.
    """
    rows = JobLease.objects.using(lease_db()).filter(name=name, fence=fence)
    changes: dict[str, object] = {"fence": F("fence") + 1, "lease_until": LEASE_FREE, "owner": ""}
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
#: scheduled row's ``run_slot`` is set only while a retry (or deferred run) of it is pending.
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
    """Record each of ``ends``: :func:`end` on its lease row, then its run's row (from
    running or abandoned only; :meth:`RunEnd.recorded`'s), in one transaction whose row
    lock waits are bounded by ``lock_wait`` seconds. What each run's row now says, by its
    primary key; a run recorded already is left as it is and missing from the result.

    Every lease row first, then the runs' rows, as every path that locks both: a finishing
    run and its successor cannot deadlock. One statement on PostgreSQL, the ORM elsewhere:
    two spellings of one contract, which tests/test_end_store.py holds both to.
    """
    if not ends:
        return {}
    if connections[lease_db()].vendor == "postgresql":
        return _end_runs_in_one_statement(ends, lock_wait)
    return _end_runs_with_the_orm(ends, lock_wait)


def _end_runs_with_the_orm(ends: list[RunEnd], lock_wait: float) -> dict[int, Ended]:
    found: dict[int, Ended] = {}
    with bounded_wait(lock_wait):
        now = clock.now()
        released = {
            ending.run_pk: end(
                ending.name,
                ending.fence,
                succeeded_at=ending.succeeded_at,
                failed=ending.failed,
                late_after=ending.late_after,
                retry=ending.retry,
                final=ending.final,
                now=ending.finished_at or now,
            )
            for ending in ends
        }
        runs = JobRun.objects.using(lease_db())
        for ending in ends:
            finished_at, pk = ending.finished_at or now, ending.run_pk
            outcome, error = ending.recorded(released[pk])
            if runs.filter(pk=pk, outcome__in=ENDABLE_OUTCOMES).update(
                outcome=outcome,
                error=error,
                finished_at=finished_at,
                capped=ending.capped,
                items=F("items") + ending.loose_items,
            ):
                row = runs.filter(pk=pk).values_list("items", "batches", "watermark_after").get()
                retry_at = _retried_at(ending, finished_at) if released[pk] else None
                found[pk] = Ended(released[pk], outcome, error, finished_at, *row, retry_at)
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


#: What :func:`_end_runs_in_one_statement` sends of each :class:`RunEnd` as it is.
_END_FIELDS = (
    "name fence run_pk outcome error capped loose_items succeeded_at late_after finished_at"
    " final failed lost_outcome lost_error"
).split()


def _end_runs_in_one_statement(ends: list[RunEnd], lock_wait: float) -> dict[int, Ended]:
    """:func:`end_runs` on PostgreSQL: one statement, one round trip
    (:func:`~django_fencedjobs.db.bounded_rows`). ``lease`` aggregates the lease rows'
    UPDATE, so all of it is done before any run's row is updated (a data-modifying CTE
    nobody reads would run after the main statement instead)."""
    connection = connections[lease_db()]
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
        f" UPDATE {_table(connection, JobRun)} AS run SET"
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
            **{field: getattr(end, field) for field in _END_FIELDS},
            # An interval PostgreSQL reads: seconds, with their fraction.
            "backoff": f"{end.retry.backoff.total_seconds()} seconds" if end.retry else None,
            "retry_slot": end.retry.slot if end.retry else None,
            "retry_attempt": end.retry.attempt if end.retry else None,
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
    ends when the block's handler will not stop (:func:`end_transaction`). PostgreSQL: the
    server process and the transaction's start (a session is no identity: a transaction
    pooler hands one to many clients in turn, and a handler may reconnect; a transaction is
    the handler's alone). SQLite: the DB-API connection, which only this process uses."""

    alias: str
    pid: int = 0
    started: datetime | None = None
    raw: Any = None


#: What :class:`HeldTransaction` is made of, in the fence check's select list:
#: ``now()`` is the transaction's start, as ``pg_stat_activity.xact_start`` shows it.
_IDENTIFY = "pg_backend_pid(), now()"


def _limit_idle(idle_limit: timedelta | None) -> str:
    """The select-list item that limits how long the checking transaction may sit idle
    (``NULL``: no limit). A holder paused (SIGSTOP, a GC pause) or sitting in Python inside
    its fenced transaction is idle in transaction to the server, which ends it after the
    job's ``lease_ttl``: its writes roll back and its row lock goes, so the job is taken
    over instead of freezing until the holder resumes. ``set_config(..., true)`` scopes it
    to this transaction: behind a pooler, the session's next client never inherits it."""
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
    """End the fenced transaction ``held`` if it is still open (it rolls back, its locks
    go): a handler past its timeout, blocked where no interrupt reaches it. True when
    something was ended. PostgreSQL: the server process is terminated only while that same
    transaction is open on it (pid *and* start, checked by the terminating statement): not
    a later one of the handler, nor another client's a pooler gave the session to, nor a
    reused pid. SQLite: the connection is closed."""
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
