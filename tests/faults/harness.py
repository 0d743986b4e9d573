"""The test side of the fault tests: start workers, watch their events, signal them, and
read the database the way the tests need to.

Waits poll (events files, the database) with an explicit timeout and never assert how long
anything took. Every process a test starts is killed (SIGCONT first, in case it is
stopped) when the test ends, whatever happened.

Each test module wraps :class:`Spawner` in its own ``spawn`` fixture.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest
from django.db import connection

from django_fencedjobs import clock, operations
from django_fencedjobs.declared import sync as sync_rows
from django_fencedjobs.models import JobLease, JobRun
from django_fencedjobs.registry import registry
from tests.faults import jobs

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
#: Default bound of a wait for a worker: generous, since other suites may share the CPUs.
WAIT = 30.0

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T],
    *,
    timeout: float = WAIT,
    what: str = "",
    diagnostics: Callable[[], str] = lambda: "",
) -> T:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}\n{diagnostics()}")
        time.sleep(0.02)


class Worker:
    """A child process running :mod:`tests.faults.worker`."""

    def __init__(self, label: str, proc: subprocess.Popen[bytes], directory: Path) -> None:
        self.label = label
        self.proc = proc
        self.directory = directory

    def __repr__(self) -> str:
        return f"<Worker {self.label} pid={self.proc.pid}>"

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def log_path(self) -> Path:
        return self.directory / f"worker-{self.label}.log"

    def log(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        header = f"--- log of worker {self.label} (pid {self.pid}, exit {self.proc.poll()}):"
        return f"{header}\n{text[-6000:]}"

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        try:
            lines = (self.directory / f"events-{self.label}.jsonl").read_text().splitlines()
        except FileNotFoundError:
            return []
        events = [json.loads(line) for line in lines if line.endswith("}")]
        return [e for e in events if name is None or e["event"] == name]

    def wait_for(self, name: str, *, count: int = 1, timeout: float = WAIT) -> list[dict[str, Any]]:
        """Wait until this worker has reported ``name`` ``count`` times; fail early if it
        exited without doing so."""

        def reached() -> list[dict[str, Any]] | None:
            found = self.events(name)
            if len(found) >= count:
                return found
            if self.proc.poll() is not None:
                found = self.events(name)  # it may have reported just before exiting
                if len(found) >= count:
                    return found
                pytest.fail(f"worker {self.label} exited before reporting {name!r}\n{self.log()}")
            return None

        return wait_until(
            reached, timeout=timeout, what=f"{self.label}: {name} x{count}", diagnostics=self.log
        )

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def touch(self, name: str) -> None:
        (self.directory / name).touch()

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def stop(self) -> None:
        """SIGSTOP, and wait until the kernel reports the process stopped."""
        self.signal(signal.SIGSTOP)
        wait_until(lambda: process_state(self.pid) == "T", timeout=10, what=f"{self.label} to stop")

    def cont(self) -> None:
        self.signal(signal.SIGCONT)

    def wait_exit(self, timeout: float = WAIT) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"worker {self.label} did not exit within {timeout:.0f}s\n{self.log()}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.pid, signal.SIGCONT)
                self.proc.kill()
            except ProcessLookupError:
                pass
        self.proc.wait(10)


def process_state(pid: int) -> str:
    """The state letter of /proc/<pid>/stat (R, S, T, Z...)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return "gone"
    return stat.rsplit(")", 1)[1].split()[0]


class Spawner:
    """``spawner(mode, job, label, wait_go=False, **config)`` starts a worker. Used as a
    context manager, it kills every worker it started on exit (SIGCONT first, in case one
    is stopped), whatever happened in the test. Each test module wraps it in a fixture::

        @pytest.fixture
        def spawn(child_env, tmp_path):
            with Spawner(child_env, tmp_path) as spawner:
                yield spawner
    """

    def __init__(self, env: dict[str, str], directory: Path) -> None:
        self.env = env
        self.directory = directory
        self.started: list[Worker] = []

    def __call__(
        self, mode: str, job: str, label: str, /, *, wait_go: bool = False, **config: object
    ) -> Worker:
        settings = {"dir": str(self.directory), "label": label, **config}
        argv = [sys.executable, "-m", "tests.faults.worker", mode, job]
        if wait_go:
            argv.append("--wait-go")
        for key, value in settings.items():
            argv += ["--set", f"{key}={value}"]
        with open(self.directory / f"worker-{label}.log", "wb") as log:
            proc = subprocess.Popen(
                argv,
                env=self.env,
                cwd=REPO_ROOT,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        worker = Worker(label, proc, self.directory)
        self.started.append(worker)
        return worker

    def logs(self) -> str:
        return "\n".join(worker.log() for worker in self.started)

    def __enter__(self) -> Spawner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for worker in self.started:
            worker.kill()
            if worker.proc.stdin is not None:
                worker.proc.stdin.close()


# -- the database, as the tests see it -------------------------------------------------------


def now() -> datetime:
    """The clock the workers use (the database's, by default)."""
    return clock.now()


def prepare(name: str, *, due: bool = True) -> None:
    """Create the job's lease row as a worker would (same schedule fingerprint), and make it
    due now ("run now") unless ``due`` is False."""
    with registry.isolated():
        jobs.register()
        declared = registry.get(name)
        sync_rows([declared], now())
    if due:
        make_due(name)


def make_due(name: str) -> None:
    """Make the job due now ("run now"). A job whose own slot fell due meanwhile (an hourly
    job whose test runs across the hour) is due already: that is what the caller needs."""
    at = now()
    change = operations.make_due(name, at)
    assert change or lease_row(name).next_run_at <= at, f"{name}: not made due ({change})"


def lease_row(name: str) -> JobLease:
    return JobLease.objects.get(name=name)


def wait_lease_expired(name: str, *, diagnostics: Callable[[], str] = lambda: "") -> None:
    """Wait until the job's lease has run out by the workers' clock (no blind sleep)."""
    wait_until(
        lambda: lease_row(name).lease_until < now(),
        what=f"the lease of {name} to expire",
        diagnostics=diagnostics,
    )


def runs(name: str) -> list[JobRun]:
    return list(JobRun.objects.filter(job=name).order_by("fence"))


def sqlite_write_lock_free() -> bool:
    """SQLite: True when no process holds the database's write lock right now."""
    probe = sqlite3.connect(connection.settings_dict["NAME"], timeout=0.2, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        probe.close()


def stop_outside_transactions(worker: Worker) -> None:
    """SIGSTOP ``worker`` at a moment it holds no lock other processes would wait for.

    The handler itself is stopped at a point outside any transaction; but its supervisor
    thread renews the lease every ttl/3. On PostgreSQL a stopped client cannot hold a
    renewal open (the server finishes an autocommit statement by itself); on SQLite the lock
    is the client's own file lock, so if the stop caught a renewal in flight, let it go on
    and stop it again.
    """
    for _ in range(50):
        worker.stop()
        if connection.vendor != "sqlite" or sqlite_write_lock_free():
            return
        worker.cont()
        time.sleep(0.01)
    pytest.fail(f"could not stop {worker.label} outside a write transaction\n{worker.log()}")


# -- connection poolers (tests/test_poolers.py) ----------------------------------------------

#: The ways a fault worker can reach the database (``FENCEDJOBS_TEST_VIA``, tests/settings.py).
POOLERS = ("pgbouncer", "pool")
#: The server sessions the throwaway PgBouncer keeps per database (``default_pool_size``).
PGBOUNCER_POOL_SIZE = 3


def pgbouncer_url() -> str:
    """The throwaway PgBouncer's URL (transaction pooling); the test fails, saying why, when
    there is none."""
    url = os.environ.get("FENCEDJOBS_TEST_PGBOUNCER_URL", "")
    if not url:
        reason = os.environ.get("FENCEDJOBS_TEST_PGBOUNCER_ERROR") or (
            "scripts/throwaway_postgres.py was run with --no-pgbouncer, or DATABASE_URL "
            "was supplied without FENCEDJOBS_TEST_PGBOUNCER_URL"
        )
        pytest.fail(f"this test needs PgBouncer and there is none: {reason}", pytrace=False)
    return url


def pgbouncer_conninfo() -> dict[str, Any]:
    """psycopg.connect() arguments for this run's test database through PgBouncer."""
    from tests.settings import parse_database_url

    pooler = parse_database_url(pgbouncer_url())
    return {
        "host": pooler["HOST"],
        "port": pooler["PORT"],
        "user": connection.settings_dict["USER"] or pooler["USER"],
        "dbname": connection.settings_dict["NAME"],
        # No server-side prepared statements behind a transaction pooler.
        "prepare_threshold": None,
    }


def pooler_env(env: dict[str, str], via: str) -> dict[str, str]:
    """``env`` for processes that reach the database ``via`` ``direct``, ``pgbouncer`` or
    ``pool`` (Django's own pool); fails, saying why, when that is not available here."""
    if via == "direct":
        return env
    if connection.vendor != "postgresql":
        pytest.fail(f"via={via} needs PostgreSQL", pytrace=False)
    if via == "pgbouncer":
        pgbouncer_url()
    elif via == "pool":
        try:
            import psycopg_pool  # noqa: F401
        except ImportError:
            pytest.fail("via=pool needs psycopg-pool (pip install 'psycopg[pool]')", pytrace=False)
    else:
        raise ValueError(f"via={via!r}")
    return {**env, "FENCEDJOBS_TEST_VIA": via}


def release_pooled_sessions(timeout: float = WAIT) -> None:
    """End every other session on this run's test database and wait until they are gone:
    PgBouncer keeps its server connections open after its clients left, and the test
    database cannot be flushed of their locks, nor dropped, while they are there."""
    sql = (
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND backend_type = 'client backend'"
    )

    def gone() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(sql)
            return not cursor.fetchall()

    wait_until(gone, timeout=timeout, what="the pooler's server sessions to end")


class Innocents:
    """Clients that have nothing to do with the app: ``count`` threads, each with one plain
    psycopg connection through PgBouncer, running transactions that sit idle ``idle``
    seconds between two statements (application code between two queries), ``between``
    seconds apart (then PgBouncer hands their server sessions to other clients, and theirs
    next transactions get whichever session is free), until :meth:`stop`. Every error they
    meet is kept in :attr:`errors`; a client that met one reconnects and goes on."""

    def __init__(self, count: int = 2, *, idle: float = 1.5, between: float = 0.2) -> None:
        import threading

        self.idle = idle
        self.between = between
        self.conninfo = pgbouncer_conninfo()
        self.errors: list[str] = []
        self.completed = [0] * count
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._client, args=(n,), daemon=True, name=f"innocent-{n}")
            for n in range(count)
        ]

    def __enter__(self) -> Innocents:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _client(self, n: int) -> None:
        import psycopg

        conn: psycopg.Connection[Any] | None = None
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = psycopg.connect(**self.conninfo, connect_timeout=10)
                with conn.transaction():
                    conn.execute("SELECT 1")
                    time.sleep(self.idle)
                    conn.execute("SELECT pg_sleep(0.3)")
                self.completed[n] += 1
                self._stop.wait(self.between)
            except Exception as exc:
                first = (str(exc).strip().splitlines() or [""])[0]
                self.errors.append(f"client {n}: {type(exc).__name__}: {first}")
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:
                        pass
                conn = None
                time.sleep(0.1)
        if conn is not None:
            conn.close()

    def wait_for_transactions(self, count: int, timeout: float = WAIT) -> None:
        """Wait until every client has completed ``count`` more transactions."""
        targets = [done + count for done in self.completed]
        wait_until(
            lambda: all(done >= t for done, t in zip(self.completed, targets, strict=True)),
            timeout=timeout,
            what=f"each innocent client to complete {count} more transactions",
            diagnostics=lambda: f"completed {self.completed}, errors {self.errors}",
        )

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(WAIT)
