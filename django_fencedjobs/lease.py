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

import contextlib
import functools
import hashlib
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.db import connections, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import BooleanField, F
from django.db.models.expressions import RawSQL
from django.db.models.functions import Greatest

from django_fencedjobs.models import LEASE_FREE, JobLease, JobRun, Outcome

if TYPE_CHECKING:
    from django_fencedjobs.runner import Run


def lease_db() -> str:
    """The database alias that holds the leases; fenced writes must go to the same one."""
    return router.db_for_write(JobLease)


@dataclass(frozen=True)
class LeaseRow:
    """A lease row as read by :func:`read`: what :func:`acquire` compares against."""

    name: str
    fence: int
    next_run_at: datetime
    lease_until: datetime
    paused: bool
    schedule_fingerprint: str

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
    rows = (
        JobLease.objects.using(lease_db())
        .filter(name__in=names)
        .values_list(
            "name", "fence", "next_run_at", "lease_until", "paused", "schedule_fingerprint"
        )
    )
    return {row[0]: LeaseRow(*row) for row in rows}


@dataclass(frozen=True)
class Scan:
    """What one tick needs of its jobs' lease rows, from :func:`scan`."""

    #: Every existing row's schedule fingerprint, by job name (a missing name: no row yet).
    fingerprints: dict[str, str]
    #: The rows due at ``now``, in full: what :func:`acquire` compares against.
    due: list[LeaseRow]
    #: The earliest :attr:`LeaseRow.wakeup` of the rows that are not paused.
    wakeup: datetime | None


def scan(names: list[str], now: datetime) -> Scan:
    """The tick's read: one query whose cost barely grows with the number of jobs.

    A tick with nothing due must cost the same for 5 jobs as for 200 (bench P3). Reading
    every row in full (:func:`read`) does not: the ORM's ``IN (%s, %s, ...)`` list and
    the parsing of two timestamps per row (Django's timestamptz loader is pure Python)
    made a pass over 200 jobs 3x as slow as one over 5. On PostgreSQL the names go as one
    array parameter (joined, which is cheaper than ``= ANY`` for hundreds), due-ness is
    decided by the same comparison as :meth:`LeaseRow.is_due`, in SQL, and timestamps come
    back only for due rows plus the one earliest wakeup. Other backends read the rows in full.

    Like :func:`read`, this decides nothing: only :func:`acquire` does.
    """
    connection = connections[lease_db()]
    if connection.vendor != "postgresql":
        rows = read(names)
        wakeups = [row.wakeup for row in rows.values() if not row.paused]
        return Scan(
            {name: row.schedule_fingerprint for name, row in rows.items()},
            [row for row in rows.values() if row.is_due(now)],
            min(wakeups) if wakeups else None,
        )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, schedule_fingerprint, due,"
            " CASE WHEN due THEN fence END,"
            " CASE WHEN due THEN next_run_at END,"
            " CASE WHEN due THEN lease_until END,"
            " CASE WHEN row_number() OVER () = 1 THEN min(CASE WHEN NOT paused"
            "  THEN GREATEST(next_run_at, lease_until) END) OVER () END"
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
            LeaseRow(name, fence, nxt, until, False, fp)
            for name, fp, due, fence, nxt, until, _ in result
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


def create(rows: list[JobLease]) -> None:
    """Create missing lease rows. Racing creators are harmless: the unique name wins once."""
    JobLease.objects.using(lease_db()).bulk_create(rows, ignore_conflicts=True)


def reschedule(name: str, old_fingerprint: str, fingerprint: str, next_run_at: datetime) -> bool:
    """The job's schedule changed in code: its next slot is recomputed, once (conditional on
    the fingerprint it replaces, so racing processes do not recompute it twice)."""
    return (
        JobLease.objects.using(lease_db())
        .filter(name=name, schedule_fingerprint=old_fingerprint)
        .update(schedule_fingerprint=fingerprint, next_run_at=next_run_at)
        == 1
    )


def acquire(
    seen: LeaseRow, *, owner: str, now: datetime, ttl: timedelta, next_run_at: datetime
) -> int | None:
    """Take the lease; return the new fence, or None when another process took it first.

    One conditional UPDATE, a compare-and-set on the row as :func:`read` read it: the
    fence and the slot must be unchanged and the lease must have expired. Two
    acquirers that read the same row race on this statement; the database serialises
    them on the row, the second re-evaluates the WHERE against the first's committed
    row (fence already incremented, ``next_run_at`` already moved past ``now``) and
    updates nothing. The same statement moves ``next_run_at`` to the first slot after
    ``now``, so the job is not due again for this slot even if this run dies.

    Call inside the transaction that records the run, so that both commit or neither.
    """
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
        )
    )
    return seen.fence + 1 if updated == 1 else None


def mark_abandoned(name: str, fence: int, now: datetime) -> int:
    """Runs of this job still marked running under an older fence belong to a holder whose
    lease expired (dead, or paused and since superseded): record them as abandoned.
    Called in the acquiring transaction, so only the new fence holder does it."""
    return (
        JobRun.objects.using(lease_db())
        .filter(job=name, outcome=Outcome.RUNNING, fence__lt=fence)
        .update(
            outcome=Outcome.ABANDONED,
            finished_at=now,
            error="The lease expired before this run finished and a later run took over "
            "(the process died, or was paused past its lease).",
        )
    )


def _table(connection: BaseDatabaseWrapper) -> str:
    return connection.ops.quote_name(JobLease._meta.db_table)


def lock_fence(connection: BaseDatabaseWrapper, name: str, fence: int) -> bool:
    """The fence check of ``fenced_atomic``: True when ``fence`` is still current.

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

    One round trip through the connection's cursor, no model instantiation: this runs in
    every fenced transaction, and its cost is the fence's whole price.
    """
    with connection.cursor() as cursor:
        if connection.features.has_select_for_update:
            cursor.execute(
                f"SELECT 1 FROM {_table(connection)} WHERE name = %s AND fence = %s FOR UPDATE",
                [name, fence],
            )
            return cursor.fetchone() is not None
        cursor.execute(
            f"UPDATE {_table(connection)} SET fence = fence WHERE name = %s AND fence = %s",
            [name, fence],
        )
        return cursor.rowcount == 1


def fence_held(connection: BaseDatabaseWrapper, name: str, fence: int) -> RawSQL | None:
    """:func:`lock_fence` as a condition for the claim statement of ``run.batches()``, so
    that claiming a batch and checking the fence take one statement, not two.

    ``EXISTS (SELECT ... FOR UPDATE)`` filtered on the fence: PostgreSQL runs it once per
    statement, before the claimed rows are read (a one-time filter), and locks the lease
    row until the transaction ends, exactly as :func:`lock_fence` does; when the fence is
    stale the condition is false and nothing is claimed. One round trip less per batch
    matters: on a durable server a claim transaction is four round trips, and a fifth
    cost a fifth of the throughput (bench P2).

    None where the claim cannot carry the lock (no ``SELECT ... FOR UPDATE``, or not
    PostgreSQL): the batch then checks the fence with :func:`lock_fence` first.
    """
    if connection.vendor != "postgresql" or not connection.features.has_select_for_update:
        return None
    return RawSQL(
        f"EXISTS (SELECT 1 FROM {_table(connection)} WHERE name = %s AND fence = %s FOR UPDATE)",
        [name, fence],
        output_field=BooleanField(),
    )


def advisory_key(name: str) -> int:
    """A stable signed 64-bit key for ``pg_advisory_xact_lock``, from the job's name."""
    digest = hashlib.blake2b(f"django-fencedjobs:{name}".encode(), digest_size=8).digest()
    value: int = struct.unpack(">q", digest)[0]
    return value


def try_advisory_xact_lock(connection: BaseDatabaseWrapper, name: str) -> bool:
    """``exclusion="advisory"``: a transaction-scoped advisory lock on the job's key.

    PostgreSQL releases it when the transaction ends, so it is held exactly as long as the
    writes it guards are uncommitted: two transactions of the job never overlap. It does
    not stop a stale holder from writing after a successor has finished; see
    docs/fencing.md for when that is acceptable.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [advisory_key(name)])
        locked: bool = cursor.fetchone()[0]
        return locked


def renew(name: str, fence: int, until: datetime) -> bool:
    """Extend the lease to ``until``; False when the fence is no longer ours.

    Conditional on the fence, so a superseded run cannot extend its successor's lease.
    ``Greatest`` keeps the lease from moving backwards if renewals arrive out of order.
    """
    return (
        JobLease.objects.using(lease_db())
        .filter(name=name, fence=fence)
        .update(lease_until=Greatest("lease_until", until))
        == 1
    )


def release(name: str, fence: int, *, succeeded_at: datetime | None, failed: bool) -> bool:
    """End the run's lease and record its result on the job; False when the fence was lost.

    Conditional on the fence: a superseded run records nothing on its successor's row.
    The fence itself is kept (it never decreases); ``lease_until`` goes back to the past
    so the next slot is not held up.
    """
    changes: dict[str, object] = {"lease_until": LEASE_FREE, "owner": ""}
    if succeeded_at is not None:
        changes["last_success_at"] = succeeded_at
        changes["consecutive_failures"] = 0
    elif failed:
        changes["consecutive_failures"] = F("consecutive_failures") + 1
    return JobLease.objects.using(lease_db()).filter(name=name, fence=fence).update(**changes) == 1


def revoke(name: str, fence: int) -> bool:
    """Take the lease away from a run that overran its timeout; False when it no longer had it.

    Incrementing the fence is what stops the run: its next fenced transaction finds a
    newer fence and rolls back, however long it keeps running. Conditional on the run's
    own fence, so a late revocation can never revoke a successor. Counts as a failure.
    """
    return (
        JobLease.objects.using(lease_db())
        .filter(name=name, fence=fence)
        .update(
            fence=F("fence") + 1,
            lease_until=LEASE_FREE,
            owner="",
            consecutive_failures=F("consecutive_failures") + 1,
        )
        == 1
    )


def make_due(name: str, now: datetime) -> bool:
    """ "Run now": make the job due at ``now``. It still goes through :func:`acquire`."""
    return (
        JobLease.objects.using(lease_db())
        .filter(name=name, next_run_at__gt=now)
        .update(next_run_at=now)
        == 1
    )


def set_paused(name: str, paused: bool) -> bool:
    return JobLease.objects.using(lease_db()).filter(name=name).update(paused=paused) == 1


def skip_slot(seen: LeaseRow, *, next_run_at: datetime) -> bool:
    """Move a due job past a slot that cannot be recorded (its run row already exists)."""
    with transaction.atomic(using=lease_db()):
        return (
            JobLease.objects.using(lease_db())
            .filter(name=seen.name, fence=seen.fence, next_run_at=seen.next_run_at)
            .update(next_run_at=next_run_at)
            == 1
        )


@contextlib.contextmanager
def _sqlite_busy_timeout(connection: BaseDatabaseWrapper, seconds: float) -> Iterator[None]:
    """Set SQLite's busy timeout on ``connection`` for the duration, then restore it."""
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA busy_timeout")
        (previous,) = cursor.fetchone()
        cursor.execute(f"PRAGMA busy_timeout = {int(seconds * 1000)}")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"PRAGMA busy_timeout = {int(previous)}")


def revoke_timed_out(run: Run, *, wait: float | None = None) -> bool:
    """Revoke a run that overran its timeout and record it as timed out, in one transaction.

    :func:`revoke` is conditional on the run's fence and the run record only moves from
    ``running``, so whoever gets here first (the supervisor thread, or the runner after the
    handler returned) does it once. ``wait`` bounds how long to wait for the lease row
    (PostgreSQL's ``lock_timeout``, SQLite's busy timeout); a lock wait that runs out raises
    ``DatabaseError``.
    """
    from django_fencedjobs import clock

    alias = lease_db()
    if wait is not None and connections[alias].vendor == "sqlite":
        # SQLite waits for its write lock (held by the handler's open fenced transaction)
        # as long as the connection's busy timeout, not per statement: bound it here, for
        # this one transaction.
        with _sqlite_busy_timeout(connections[alias], wait):
            return revoke_timed_out(run)
    with transaction.atomic(using=alias):
        connection = connections[alias]
        if wait is not None and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT set_config('lock_timeout', %s, true)", [f"{int(wait * 1000)}ms"]
                )
        if not revoke(run.job.name, run.fence):
            return False
        JobRun.objects.using(alias).filter(
            pk=run.record.pk, outcome__in=[Outcome.RUNNING, Outcome.ABANDONED]
        ).update(
            outcome=Outcome.TIMED_OUT,
            finished_at=clock.now(),
            items=run.items,
            batches=run.batch_count,
            error=f"Timed out after {run.job.run_timeout}; the lease was revoked, so no "
            "later write of this run can commit.",
        )
        return True
