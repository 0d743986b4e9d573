"""SQLite: a wait for the write lock that failed leaves nothing behind that can stall the
lock's holder.

Why it matters: a runner's threads share one SQLite database, each through its own
connection, and SQLite holds a connection's mutex for the whole of a statement, its busy
wait for the write lock included. Django begins a transaction with a cursor it never
closes; when that ``BEGIN IMMEDIATE`` times out ("database is locked"), the exception
Django raises is cyclic garbage that holds the cursor, still open. Python's collector then
frees it in whichever thread happens to collect. If that thread holds the write lock (a
worker inside its fenced block) while the cursor's owner waits for the lock again,
freeing the cursor (on Python 3.11; 3.12 and 3.13 free it without waiting) waits for the
owner's mutex and the owner waits for the lock: a deadlock until the owner's busy timeout
ends its wait with "database is locked". Under load, fenced writes failed that way after
their full 20 s timeout, the holder stalled all along. The app closes a cursor whose
statement failed, in its own thread (:func:`django_fencedjobs.db.close_failed_cursors`).

The test uses a database file of its own, whatever database the suite runs on.
"""

from __future__ import annotations

import gc
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import DatabaseError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.utils import ConnectionHandler


@pytest.fixture
def collector_off(django_db_blocker) -> Iterator[None]:
    """Garbage is collected where the test says: in the holder's thread, holding the lock.
    (And the test's own connections are let through: they touch no test database.)"""
    enabled = gc.isenabled()
    gc.disable()
    try:
        with django_db_blocker.unblock():
            yield
    finally:
        if enabled:
            gc.enable()


def sqlite_connection(path: Path, timeout: float) -> BaseDatabaseWrapper:
    """A Django connection as a runner's thread has one (``transaction_mode`` IMMEDIATE),
    Django's defaults for the rest of its settings; in a handler of its own, not the
    suite's."""
    options = {"transaction_mode": "IMMEDIATE", "timeout": timeout}
    settings = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(path), "OPTIONS": options}
    return ConnectionHandler({"default": settings})["default"]


def test_a_lock_wait_that_timed_out_leaves_no_cursor_that_stalls_the_lock_holder(
    tmp_path, collector_off
):
    path = tmp_path / "lock.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (n integer)")
    holder.execute("BEGIN IMMEDIATE")  # the write lock, held by this (the main) thread
    waiting = threading.Event()
    outcome: list[BaseException | str] = []

    def waiter() -> None:
        connection = sqlite_connection(path, timeout=0.05)

        def begin() -> None:  # as transaction.atomic() begins
            connection.set_autocommit(False, force_begin_transaction_with_broken_autocommit=True)

        try:
            # A first wait that times out against the holder, as a renewal's may under load.
            with pytest.raises(DatabaseError, match="database is locked"):
                begin()
            with connection.cursor() as cursor:
                cursor.execute("PRAGMA busy_timeout = 10000")
            waiting.set()
            # Then a wait long enough for the holder to finish: it must get the lock.
            begin()
            with connection.cursor() as cursor:
                cursor.execute("INSERT INTO t VALUES (1)")
            connection.commit()
            outcome.append("committed")
        except BaseException as exc:  # reported by the assert below
            outcome.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=waiter)
    thread.start()
    assert waiting.wait(10), outcome
    time.sleep(0.3)  # the waiter enters SQLite's busy wait (else the test proves nothing new)
    # The holder collects garbage while it holds the lock, as a worker's thread may at any
    # allocation inside its fenced block. The waiter's failed cursor must not be in it
    # unclosed: freeing it would wait on the waiter's mutex as long as the waiter waits.
    gc.collect()
    holder.execute("COMMIT")
    thread.join(30)
    assert outcome == ["committed"]
    assert holder.execute("SELECT count(*) FROM t").fetchone() == (1,)
    holder.close()
