"""A run's database session on PostgreSQL: the idle limit a run needs is in force in each of
its fenced transactions and never on the session (which a pooler may share with other
clients); the app's bounded waits cost no round trip."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.backends.signals import connection_created

from django_fencedjobs import db, fenced_atomic, job, manual
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.fencing import current_holder
from django_fencedjobs.loop import tick
from django_fencedjobs.models import JobLease, JobRun, Outcome
from tests.conftest import JOBS_T0 as T0
from tests.conftest import round_trips_of

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only]


def show_idle_limit() -> tuple[int, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_backend_pid(), current_setting('idle_in_transaction_session_timeout')"
        )
        pid, limit = cursor.fetchone()
    return pid, limit


@pytest.fixture
def worker_statements():
    """The statements sent on connections opened while the test runs (the pool's workers
    open theirs), by thread name."""
    sent: list[str] = []

    def count(execute: Callable[..., Any], sql: str, *args: Any) -> Any:
        sent.append(sql)
        return execute(sql, *args)

    def wrap(sender: Any, connection: Any, **kwargs: Any) -> None:
        connection.execute_wrappers.append(count)

    connection_created.connect(wrap, weak=False, dispatch_uid="test_run_session")
    try:
        yield sent
    finally:
        connection_created.disconnect(dispatch_uid="test_run_session")


def test_the_idle_limit_is_in_force_in_each_fenced_transaction_and_nowhere_else(
    jobs, worker_statements
):
    """Behind a transaction pooler the server session is shared with other clients: the
    run's idle limit rides with each fenced transaction's fence check and ends with it."""
    seen: dict[str, tuple[int, str]] = {}

    def handler(run):
        seen[f"{run.job.name} before"] = show_idle_limit()
        with fenced_atomic():
            seen[f"{run.job.name} fenced"] = show_idle_limit()
        with transaction.atomic():
            seen[f"{run.job.name} plain"] = show_idle_limit()
        seen[f"{run.job.name} after"] = show_idle_limit()

    for name, ttl in (("t.session_a", 40), ("t.session_b", 90)):
        job("*/15 * * * *", name=name, lease_ttl=timedelta(seconds=ttl))(handler)
    tick()
    default = show_idle_limit()[1]
    fake_clock.set(T0 + timedelta(minutes=15, seconds=2))
    result = tick(workers=1)
    assert sorted(r.outcome for r in result.runs) == [Outcome.SUCCEEDED] * 2
    assert {where: limit for where, (_, limit) in seen.items()} == {
        "t.session_a before": default,
        "t.session_a fenced": "40s",
        "t.session_a plain": default,
        "t.session_a after": default,
        "t.session_b before": default,
        "t.session_b fenced": "90s",
        "t.session_b plain": default,
        "t.session_b after": default,
    }
    # Nothing is ever set on the session, so nothing needs resetting.
    assert not [sql for sql in worker_statements if ", false)" in sql or "RESET" in sql]


def test_a_reconnected_handler_is_limited_again_in_its_next_fenced_block(jobs):
    """A handler's connection replaced during its run (a server restart, a failover, a
    killed session): the next fenced block on the new session carries the limit too."""
    seen: list[tuple[int, str]] = []

    @job("*/15 * * * *", name="t.session_new", lease_ttl=timedelta(seconds=40))
    def handler(run):
        with fenced_atomic():
            seen.append(show_idle_limit())
        connection.close()
        with fenced_atomic():
            seen.append(show_idle_limit())

    tick()
    fake_clock.set(T0 + timedelta(minutes=15, seconds=2))
    tick(workers=1)
    assert JobRun.objects.get(job="t.session_new").outcome == Outcome.SUCCEEDED
    assert [limit for _, limit in seen] == ["40s", "40s"]
    assert seen[0][0] != seen[1][0]  # two server sessions


def test_a_one_off_run_leaves_its_session_at_the_server_default(jobs):
    seen: list[tuple[int, str]] = []

    @job("*/15 * * * *", name="t.session_manual", lease_ttl=timedelta(seconds=40))
    def handler(run):
        with fenced_atomic():
            seen.append(show_idle_limit())

    default = show_idle_limit()
    record = manual.run_now(handler.job)
    assert record.outcome == Outcome.SUCCEEDED, record.error
    assert seen == [(default[0], "40s")]  # this thread's session, limited in the block ...
    assert show_idle_limit() == default  # ... and as it was after


def test_a_bounded_wait_costs_no_round_trip(jobs):
    """The end of every run and every renewal is a one-row update in a bounded wait: its
    lock timeout goes in the transaction's first round trip, with BEGIN."""

    @job("*/15 * * * *", name="t.session_wait")
    def handler(run):
        pass

    tick()
    rows = JobLease.objects.filter(name="t.session_wait")

    def plain() -> None:
        with transaction.atomic():
            rows.update(owner="plain")

    def bounded() -> None:
        with db.bounded_wait(0.5):
            rows.update(owner="bounded")

    assert round_trips_of(plain) == 3
    assert round_trips_of(bounded) == 3
    assert rows.get().owner == "bounded"
    # The timeout is the transaction's own: set inside, gone after.
    with db.bounded_wait(0.5), connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone()[0] == "500ms"
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone()[0] == "0"
    assert connection.get_autocommit() and connection.connection.autocommit


def test_the_database_clock_read_first_in_a_transaction_costs_no_round_trip(jobs):
    """A run's acquisition reads the clock first in its transaction: with BEGIN."""
    from django_fencedjobs.clock import database_now

    @job("*/15 * * * *", name="t.session_clock")
    def handler(run):
        pass

    tick()
    rows = JobLease.objects.filter(name="t.session_clock")
    read: list[Any] = []

    def plain() -> None:
        with transaction.atomic():
            rows.update(owner="plain")

    def clock_first() -> None:
        with transaction.atomic():
            read.append(database_now())
            rows.update(owner="clock")

    assert round_trips_of(plain) == 3
    assert round_trips_of(clock_first) == 3
    assert rows.get().owner == "clock"
    assert read[0].tzinfo is not None
    # Outside a transaction it is a statement like any other.
    assert round_trips_of(database_now) == 1


def test_a_heartbeat_inside_a_plain_transaction_is_bounded_as_a_fenced_block(jobs):
    """Renewing inside the handler's own transaction locks the lease row until it ends: that
    transaction gets the idle limit, and is the one the supervisor would end."""
    seen: list[tuple[str, bool]] = []

    @job("*/15 * * * *", name="t.session_heartbeat", lease_ttl=timedelta(seconds=40))
    def handler(run):
        with transaction.atomic():
            run.heartbeat()
            seen.append((show_idle_limit()[1], current_holder().held is not None))
        seen.append((show_idle_limit()[1], True))

    tick()
    fake_clock.set(T0 + timedelta(minutes=15, seconds=2))
    tick(workers=1)
    assert JobRun.objects.get(job="t.session_heartbeat").outcome == Outcome.SUCCEEDED
    default = show_idle_limit()[1]
    assert seen == [("40s", True), (default, True)]
