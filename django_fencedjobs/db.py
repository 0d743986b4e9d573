"""The lease database, and how the app talks to it.

Which database holds the leases (:func:`lease_db`; fenced writes go to the same one), how a
statement rides in the same round trip as its transaction's ``BEGIN`` on PostgreSQL
(:func:`first_statement`), the bound on every wait for a row lock of the app's own
bookkeeping (:func:`bounded_wait`), and every other difference between databases that the
app relies on. Outside this module and :mod:`django_fencedjobs.lease` (the statements that
decide exclusion, spelled once per database), no module asks which database it talks to.
This module holds no policy of its own about jobs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, cast

from django.db import connections, models, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import DateTimeField, Func

from django_fencedjobs.checkids import CheckId
from django_fencedjobs.models import JobLease


def lease_db() -> str:
    """The database alias that holds the leases; fenced writes must go to the same one."""
    return router.db_for_write(JobLease)


def first_statement(
    connection: BaseDatabaseWrapper, sql: str, params: list[Any]
) -> tuple[Any, ...] | None:
    """Run ``sql`` and return its first row (or None). As the first statement of an open
    transaction on PostgreSQL, it goes in the same round trip as the transaction's
    ``BEGIN`` (:func:`_begin_with`); elsewhere it is any statement."""
    begin = _begin_with(connection)
    if begin:
        # psycopg's own cursor: Django's wrapper (query logging, execute wrappers) would
        # cost as much as the round trip saved.
        with connection.wrap_database_errors, connection.connection.cursor() as raw:
            raw.execute(f"{begin}; {sql}", params)
            raw.nextset()  # past BEGIN's result, to the statement's
            row: tuple[Any, ...] | None = raw.fetchone()
            return row
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found: tuple[Any, ...] | None = cursor.fetchone()
        return found


def _begin_with(connection: BaseDatabaseWrapper) -> str:
    """PostgreSQL, inside ``transaction.atomic`` before its first statement: the ``BEGIN``
    to send with that statement, after telling psycopg not to send its own; else "".

    Django opened the transaction by turning psycopg's autocommit off, and psycopg would
    send ``BEGIN`` by itself, and wait for its answer, before the first statement. With
    autocommit back on psycopg sends nothing of its own, the explicit ``BEGIN`` opens the
    transaction on the server, and everything up to Django's ``COMMIT`` or ``ROLLBACK`` (which
    psycopg sends whatever its autocommit says) is in it. Django turns autocommit on again
    when the block ends, as usual. Only where :func:`_bundling` allows it.
    """
    raw = _bundling(connection)
    if (
        raw is None
        or raw.autocommit
        or not connection.in_atomic_block
        or raw.info.transaction_status != _idle()
    ):
        return ""
    raw.autocommit = True
    return "BEGIN"


def _bundling(connection: BaseDatabaseWrapper) -> Any:
    """psycopg's connection, when several statements may go to the server as one query on
    it: PostgreSQL with Django's ``AUTOCOMMIT`` (Django owns every transaction boundary),
    client-side binding (server-side binding sends each statement on its own, as a
    prepared statement) and READ COMMITTED (``fencedjobs.E015``), neither read-only nor
    deferrable; else None."""
    settings = connection.settings_dict
    if (
        connection.vendor != "postgresql"
        or not settings.get("AUTOCOMMIT")
        or (settings.get("OPTIONS") or {}).get("server_side_binding")
    ):
        return None
    from psycopg import IsolationLevel

    raw = connection.connection
    if (
        raw is None
        or raw.isolation_level not in (None, IsolationLevel.READ_COMMITTED)
        or raw.read_only is not None
        or raw.deferrable is not None
    ):
        return None
    return raw


def _idle() -> Any:
    from psycopg.pq import TransactionStatus

    return TransactionStatus.IDLE


#: The longest a statement of the app's own bookkeeping (renewal, the end of a run, an
#: admin action) waits for a lease row that someone else has locked.
LOCK_WAIT = 2.0


@contextlib.contextmanager
def bounded_wait(seconds: float = LOCK_WAIT) -> Iterator[BaseDatabaseWrapper]:
    """A transaction on the lease database in which waiting for a lock ends after
    ``seconds`` with a ``DatabaseError`` (see :func:`is_lock_timeout`).

    No statement of the app waits on another holder's row lock without a bound: a holder
    paused inside its fenced transaction keeps its lock until the server ends that
    transaction, and nothing of the app may freeze behind it meanwhile. PostgreSQL:
    ``lock_timeout``, local to this transaction. SQLite: the connection's busy timeout,
    for the duration (SQLite waits for its write lock per transaction, not per statement).
    """
    alias = lease_db()
    connection = connections[alias]
    if connection.vendor == "sqlite":
        with _sqlite_busy_timeout(connection, seconds), transaction.atomic(using=alias):
            yield connection
        return
    with transaction.atomic(using=alias):
        if connection.vendor == "postgresql":
            # In BEGIN's round trip: this runs at every run's end and every renewal.
            first_statement(
                connection,
                "SELECT set_config('lock_timeout', %s, true)",
                [f"{int(seconds * 1000)}ms"],
            )
        yield connection


@contextlib.contextmanager
def without_jit() -> Iterator[None]:
    """PostgreSQL: the statements inside are planned without JIT compilation, in a
    transaction of the lease database.

    For a read that runs a few cheap subqueries per row: the planner's cost for it passes
    ``jit_above_cost`` with a few hundred rows, and compiling its expressions then takes
    about a second (measured: 1.3 s for a 0.15 s read of 435 instances' health). The
    setting is local to the transaction; inside one already open, it is set back after.
    """
    alias = lease_db()
    connection = connections[alias]
    if connection.vendor != "postgresql":
        yield
        return
    nested = connection.in_atomic_block
    with transaction.atomic(using=alias):
        # In BEGIN's round trip; the setting as it was read first (OFFSET 0: before the
        # set_config beside it).
        row = first_statement(
            connection,
            "SELECT was.jit, set_config('jit', 'off', true)"
            " FROM (SELECT current_setting('jit') AS jit OFFSET 0) AS was",
            [],
        )
        yield
        if nested and row is not None:
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('jit', %s, true)", [row[0]])


def bounded_rows(
    sql: str,
    params: list[Any],
    seconds: float = LOCK_WAIT,
    *,
    setup: Callable[[Any], None] = lambda cursor: None,
) -> list[tuple[Any, ...]]:
    """Run one statement of the app's bookkeeping on the lease database, its waits for row
    locks bounded by ``seconds`` as in :func:`bounded_wait`, and return its rows.
    ``setup(cursor)`` is called with psycopg's cursor before it runs (its loaders, say).

    On PostgreSQL outside any transaction, in one round trip: the bound and the statement
    go as one query (``SELECT set_config('lock_timeout', ..., true); sql``), which the
    server runs as one transaction, so the bound is the statement's and ends with it, with
    no ``BEGIN`` or ``COMMIT`` of their own; an error rolls all of it back. Behind a
    transaction pooler the query is one transaction, on one server session. Only where
    :func:`_bundling` allows it; else in :func:`bounded_wait`'s transaction.
    """
    connection = connections[lease_db()]
    raw = None
    if connection.vendor == "postgresql" and not connection.in_atomic_block:
        connection.ensure_connection()
        raw = _bundling(connection)
    if raw is None or not raw.autocommit or raw.info.transaction_status != _idle():
        with bounded_wait(seconds), connection.cursor() as wrapped:
            setup(wrapped.cursor)
            wrapped.execute(sql, params)
            return list(wrapped.fetchall())
    with raw.cursor() as cursor:
        setup(cursor)
        with connection.wrap_database_errors:
            cursor.execute(
                f"SELECT set_config('lock_timeout', '{int(seconds * 1000)}ms', true); {sql}",
                params,
            )
            cursor.nextset()  # past set_config's result, to the statement's
            rows: list[tuple[Any, ...]] = cursor.fetchall()
            return rows


def is_lock_timeout(exc: BaseException) -> bool:
    """True when ``exc`` is a lock wait that :func:`bounded_wait` cut short."""
    cause = exc.__cause__
    if getattr(cause, "sqlstate", None) == "55P03":  # PostgreSQL: lock_not_available
        return True
    return "database is locked" in str(exc)


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


def close_failed_cursors(
    execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]
) -> Any:
    """An execute wrapper of every SQLite connection (``connection_created``, see
    :class:`~django_fencedjobs.apps.FencedJobsConfig`): a statement that fails has its
    cursor closed at once, in the thread that owns it.

    Why: Django begins a transaction with a cursor it never closes, and the error it raises
    when that ``BEGIN IMMEDIATE`` times out ("database is locked") is cyclic garbage that
    holds the cursor, still open. Python's collector frees it in whichever thread collects,
    and on Python 3.11 freeing an open cursor waits for its connection's mutex, which SQLite
    holds through the owner's whole busy wait. A worker that collects inside its fenced
    block, holding the write lock, while that owner waits for the lock again, would deadlock
    with it until the owner's busy timeout failed its transaction. A closed cursor holds no
    statement: freeing it waits for nothing (tests/test_sqlite_write_lock.py).
    """
    try:
        return execute(sql, params, many, context)
    except BaseException:
        with contextlib.suppress(Exception):  # the statement's own error is the one to see
            context["cursor"].close()
        raise


def install_sqlite_wrapper(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """``connection_created`` receiver: :func:`close_failed_cursors` on a SQLite connection."""
    if connection.vendor == "sqlite" and close_failed_cursors not in connection.execute_wrappers:
        connection.execute_wrappers.append(close_failed_cursors)


def isolation_problem() -> str | None:
    """Why the lease database cannot run jobs at its transaction isolation, or None.

    PostgreSQL at REPEATABLE READ or SERIALIZABLE (set in ``OPTIONS``: system check
    ``fencedjobs.E015``; or as the server's, database's or role's
    ``default_transaction_isolation``, which only a query shows): a fenced transaction
    that locks the lease row after the run's own renewal changed it fails with "could not
    serialize access", and so does an acquirer that loses a race.
    """
    connection = connections[lease_db()]
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SHOW transaction_isolation")
        (level,) = cursor.fetchone()
    if level == "read committed":
        return None
    return (
        f"the database runs transactions at {level.upper()} (default_transaction_isolation "
        "or DATABASES OPTIONS isolation_level); the job leases need READ COMMITTED, "
        f"PostgreSQL's default ({CheckId.ISOLATION})"
    )


# -- What differs between databases ---------------------------------------------------

#: The query that reads a database server's clock, by vendor. ``clock_timestamp()``, not
#: ``now()``: the real time, not the start of the transaction.
_CLOCK_SQL = {"postgresql": "SELECT clock_timestamp()", "mysql": "SELECT UTC_TIMESTAMP(6)"}


def server_now() -> datetime | None:
    """The lease database server's clock, in UTC; None where the database is a file on this
    host (SQLite), whose clock is this host's. As the first statement of a transaction it
    goes with the transaction's ``BEGIN`` (:func:`first_statement`)."""
    connection = connections[lease_db()]
    sql = _CLOCK_SQL.get(connection.vendor)
    if sql is None:
        return None
    row = first_statement(connection, sql, [])
    value: datetime = row[0]  # type: ignore[index]  # one row, always
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)


def statement_now() -> Func | None:
    """The lease database's clock at the start of the statement, as SQL (PostgreSQL's
    ``statement_timestamp()``: two columns set by one statement read one instant); None
    where the database has no clock of its own."""
    if connections[lease_db()].vendor != "postgresql":
        return None
    return Func(
        function="statement_timestamp", template="%(function)s()", output_field=DateTimeField()
    )


def estimated_rows(rows: models.QuerySet[Any]) -> int | None:
    """The planner's estimate of the rows of ``rows``' table (PostgreSQL's
    ``pg_class.reltuples``, kept current by autovacuum); None where there is none, or the
    table was never analysed (the admin's paginators count with it)."""
    connection = connections[rows.db]
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)",
            [rows.model._meta.db_table],
        )
        found = cursor.fetchone()
    if found is None or found[0] is None or found[0] < 0:  # -1: never analysed
        return None
    return int(found[0])


def advisory_lock_problem() -> str | None:
    """Why the lease database has no session-free advisory locks (PostgreSQL's
    ``pg_advisory_xact_lock``), or None when it has them."""
    vendor = connections[lease_db()].vendor
    return None if vendor == "postgresql" else f"the database is {vendor}"


def insert_columns(model: type[models.Model], using: str, columns: dict[str, list[Any]]) -> None:
    """Insert rows of ``model`` given column by column (field attribute name to one value
    per row). On PostgreSQL one ``INSERT`` from arrays (``unnest``), without a model
    instance per row; elsewhere ``bulk_create``."""
    connection = connections[using]
    fields = [cast("models.Field[Any, Any]", model._meta.get_field(name)) for name in columns]
    if connection.vendor != "postgresql":
        names, rows = [field.attname for field in fields], zip(*columns.values(), strict=True)
        model._default_manager.using(using).bulk_create(
            [model(**dict(zip(names, row, strict=True))) for row in rows]
        )
        return
    quote = connection.ops.quote_name
    targets = ", ".join(quote(str(field.column)) for field in fields)
    arrays = ", ".join(f"%s::{field.db_type(connection)}[]" for field in fields)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {quote(model._meta.db_table)} ({targets}) SELECT * FROM unnest({arrays})",
            list(columns.values()),
        )


def holds_write_lock(connection: BaseDatabaseWrapper) -> Any:
    """The driver's connection under ``connection`` where the whole database has one write
    lock, held by a connection until its transaction ends (SQLite): closing it is the one
    way to free that lock from another thread. None elsewhere (row locks; the server ends a
    session's transaction when its holder is cut off)."""
    return connection.connection if connection.vendor == "sqlite" else None


def strict_isolation_option(alias: str) -> str | None:
    """The isolation level stricter than READ COMMITTED that ``DATABASES[alias]['OPTIONS']``
    names (PostgreSQL), or None. An unknown level is Django's own check's to report."""
    connection = connections[alias]
    level = (connection.settings_dict.get("OPTIONS") or {}).get("isolation_level")
    if connection.vendor != "postgresql" or level is None:
        return None
    from django.db.backends.postgresql.psycopg_any import IsolationLevel

    try:
        named = IsolationLevel(level)
    except ValueError:
        return None
    return None if named == IsolationLevel.READ_COMMITTED else named.name


def session_bound_settings(alias: str) -> list[str]:
    """What in ``DATABASES[alias]`` keeps state on a server session, which a transaction
    pooler shares between clients: Django's server-side cursors (``QuerySet.iterator()``)
    and psycopg's server-side binding (prepared statements). PostgreSQL only."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return []
    wrong = []
    if not connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"):
        wrong.append("DISABLE_SERVER_SIDE_CURSORS is not True")
    if (connection.settings_dict.get("OPTIONS") or {}).get("server_side_binding"):
        wrong.append("OPTIONS['server_side_binding'] is True")
    return wrong


def lazy_write_lock(alias: str) -> tuple[bool, str | None]:
    """SQLite, which has one write lock for the whole file: whether ``DATABASES[alias]``
    takes it only at a transaction's first write (SQLite's default, DEFERRED), and the
    ``transaction_mode`` it names. ``(False, None)`` for every other database."""
    connection = connections[alias]
    if connection.vendor != "sqlite":
        return False, None
    mode = (connection.settings_dict.get("OPTIONS") or {}).get("transaction_mode")
    eager = isinstance(mode, str) and mode.upper() in ("IMMEDIATE", "EXCLUSIVE")
    return not eager, mode
