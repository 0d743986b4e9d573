"""fenced_atomic has the shape of transaction.atomic and commits only under a current fence."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections, transaction

from django_fencedjobs import FenceLost, NotInRun, Run, WatermarkError, declared, fenced_atomic, job
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.loop import tick
from django_fencedjobs.models import JobLease, Outcome
from tests.conftest import JOBS_T0 as T0
from tests.conftest import round_trips_of
from tests.testapp.models import Write

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def inside_run(jobs):
    """Call ``body(run)`` as the handler of a real run; re-raise what it raised."""

    def call(body: Callable[[Run], Any], **job_kwargs: Any):
        raised: list[BaseException] = []

        @job("*/5 * * * *", name="t.fenced", **job_kwargs)
        def handler(run):
            try:
                body(run)
            except BaseException as exc:
                raised.append(exc)
                raise

        tick()
        fake_clock.advance(timedelta(minutes=5))
        (record,) = tick().runs
        if raised and not isinstance(raised[0], FenceLost):
            raise raised[0]
        return record

    return call


def write(run: Run, seq: int) -> None:
    Write.objects.create(job=run.job.name, fence=run.fence, seq=seq)


def test_works_as_context_manager_bare_decorator_and_decorator_with_arguments(inside_run):
    @fenced_atomic
    def bare(run):
        write(run, 2)

    @fenced_atomic(using="default")
    def with_arguments(run):
        write(run, 3)

    def body(run):
        with fenced_atomic():
            write(run, 1)
        bare(run)
        with_arguments(run)

    assert inside_run(body).outcome == Outcome.SUCCEEDED
    assert sorted(Write.objects.values_list("seq", flat=True)) == [1, 2, 3]


def test_one_instance_serves_nested_blocks_and_the_runs_other_threads(inside_run, monkeypatch):
    """As Django's ``test_reuse_*`` tests: one instance, entered again inside itself (a
    savepoint that rolls back alone), and meanwhile from another thread of the run, which
    checks the fence itself (waiting for this block's lock) instead of joining this
    thread's block."""
    from django_fencedjobs import lease

    checked_by: list[int] = []
    real = lease.lock_fence
    monkeypatch.setattr(
        lease, "lock_fence", lambda *args: checked_by.append(threading.get_ident()) or real(*args)
    )
    block = fenced_atomic()

    @block
    def guarded(run, seq):
        write(run, seq)

    def body(run):
        errors: list[BaseException] = []

        def in_other_thread():
            try:
                guarded(run, 4)
            except BaseException as exc:
                errors.append(exc)
            finally:
                connections.close_all()  # this thread's own

        with block:
            write(run, 1)
            with pytest.raises(ValueError), block:
                write(run, 2)
                raise ValueError("rolls back the inner block only")
            guarded(run, 3)
            other = threading.Thread(target=contextvars.copy_context().run, args=[in_other_thread])
            other.start()
            other.join(1)
            assert other.is_alive(), errors  # waiting for this block's lock on the fence
        other.join()
        assert errors == []

    record = inside_run(body)
    assert record.outcome == Outcome.SUCCEEDED, record.error
    assert sorted(Write.objects.values_list("seq", flat=True)) == [1, 3, 4]
    assert len(checked_by) == len(set(checked_by)) == 2  # once per thread, not per block


def lease_row_is_locked(name: str) -> bool:
    """Seen from a second connection: is the lease row locked (PostgreSQL), or the
    database's write lock taken (SQLite), right now?"""
    from django.db import OperationalError

    other = connections.create_connection("default")
    if other.vendor == "sqlite":
        other.settings_dict = {
            **other.settings_dict,
            "OPTIONS": {**other.settings_dict["OPTIONS"], "timeout": 0.05},
        }
    try:
        with other.cursor() as cursor:
            if other.vendor == "postgresql":
                cursor.execute("SET lock_timeout = '50ms'")
                cursor.execute("BEGIN")
                sql = "SELECT 1 FROM fencedjobs_joblease WHERE name = %s FOR UPDATE"
            else:
                sql = "UPDATE fencedjobs_joblease SET fence = fence WHERE name = %s"
            try:
                cursor.execute(sql, [name])
            except OperationalError:
                return True
            return False
    finally:
        other.close()


def test_the_fenced_block_holds_the_lease_row_lock_until_it_ends(inside_run):
    seen = []

    def body(run):
        with fenced_atomic():
            write(run, 1)
            seen.append(lease_row_is_locked(run.job.name))
        seen.append(lease_row_is_locked(run.job.name))

    assert inside_run(body).outcome == Outcome.SUCCEEDED
    assert seen == [True, False]


def test_a_nested_block_joins_the_outer_without_a_second_check(inside_run, monkeypatch):
    from django_fencedjobs import lease

    checks = []
    real = lease.lock_fence
    monkeypatch.setattr(lease, "lock_fence", lambda *args: checks.append(args) or real(*args))

    def body(run):
        with fenced_atomic():
            write(run, 1)
            with fenced_atomic():
                write(run, 2)
        with fenced_atomic():
            write(run, 3)

    assert inside_run(body).outcome == Outcome.SUCCEEDED
    assert len(checks) == 2
    assert Write.objects.count() == 3


def test_an_inner_failure_rolls_back_only_the_inner_block(inside_run):
    def body(run):
        with fenced_atomic():
            write(run, 1)
            with pytest.raises(ValueError), fenced_atomic():
                write(run, 2)
                raise ValueError("inner")

    assert inside_run(body).outcome == Outcome.SUCCEEDED
    assert list(Write.objects.values_list("seq", flat=True)) == [1]


def test_the_body_exception_is_never_hidden(inside_run):
    def body(run):
        with fenced_atomic():
            write(run, 1)
            raise KeyError("from the body")

    with pytest.raises(KeyError, match="from the body"):
        inside_run(body)
    assert Write.objects.count() == 0


def test_a_superseded_fence_raises_at_entry_and_the_block_never_runs(inside_run):
    entered = []

    def body(run):
        JobLease.objects.filter(name=run.job.name).update(fence=run.fence + 1)
        with fenced_atomic():
            entered.append(True)
            write(run, 1)

    record = inside_run(body)
    assert record.outcome == Outcome.FENCE_LOST
    assert entered == []
    assert Write.objects.count() == 0


def test_fence_lost_inside_an_outer_plain_atomic_rolls_back_the_outer_writes(inside_run):
    def body(run):
        with transaction.atomic():
            write(run, 1)
            JobLease.objects.filter(name=run.job.name).update(fence=run.fence + 1)
            with fenced_atomic():
                write(run, 2)

    assert inside_run(body).outcome == Outcome.FENCE_LOST
    assert Write.objects.count() == 0


def test_outside_a_run_it_raises_not_in_run_with_advice():
    with pytest.raises(NotInRun, match="only work inside a job's handler"):
        with fenced_atomic():
            pass


def test_another_database_than_the_leases_is_refused(inside_run):
    def body(run):
        with pytest.raises(NotInRun, match="same database"):
            with fenced_atomic(using="other"):
                pass

    assert inside_run(body).outcome == Outcome.SUCCEEDED


def test_the_watermark_only_moves_forward_and_only_inside_the_fenced_block(inside_run):
    def body(run):
        with pytest.raises(WatermarkError, match="inside"):
            run.advance_watermark(T0)
        with fenced_atomic():
            run.advance_watermark(T0)
        with pytest.raises(WatermarkError, match="only moves forward"), fenced_atomic():
            run.advance_watermark(T0 - timedelta(hours=1))
        with fenced_atomic():
            run.advance_watermark(T0 + timedelta(hours=1))

    record = inside_run(body)
    assert record.outcome == Outcome.SUCCEEDED
    assert record.watermark_after == (T0 + timedelta(hours=1)).isoformat()


@pytest.mark.postgres_only
def test_advisory_exclusion_refuses_a_second_concurrent_transaction(inside_run, django_db_blocker):
    from django_fencedjobs.lease import advisory_key

    def body(run):
        other = connections.create_connection("default")
        try:
            with other.cursor() as cursor:
                cursor.execute("BEGIN")
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [advisory_key(run.job.name)])
                with pytest.raises(FenceLost, match="advisory lock"), fenced_atomic():
                    write(run, 1)
                cursor.execute("ROLLBACK")
            with fenced_atomic():
                write(run, 2)
        finally:
            other.close()

    record = inside_run(body, exclusion="advisory")
    assert record.outcome == Outcome.SUCCEEDED, record.error
    assert list(Write.objects.values_list("seq", flat=True)) == [2]


@pytest.mark.postgres_only
def test_a_fenced_one_row_transaction_takes_as_many_round_trips_as_a_plain_one(jobs):
    """The fence check goes with the transaction's BEGIN: counted in the wire protocol, a
    round trip ends with the server's ReadyForQuery."""
    from django_fencedjobs import lease

    @job("*/5 * * * *", name="t.round_trips")
    def round_trips(run):
        pass

    declared.sync([round_trips.job], fake_clock())
    fence = JobLease.objects.get(name="t.round_trips").fence

    def plain() -> None:
        with transaction.atomic():
            Write.objects.create(job="t.round_trips", fence=fence, seq=1)

    def fenced() -> None:
        with transaction.atomic():
            assert lease.lock_fence(connection, "t.round_trips", fence)
            Write.objects.create(job="t.round_trips", fence=fence, seq=2)

    assert round_trips_of(fenced) == round_trips_of(plain) == 3
    assert Write.objects.filter(job="t.round_trips").count() == 2
    # The transaction was one: a write after a failed check in the same block rolls back.
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        assert lease.lock_fence(connection, "t.round_trips", fence)
        Write.objects.create(job="t.round_trips", fence=fence, seq=3)
        1 / 0  # noqa: B018
    assert Write.objects.filter(job="t.round_trips").count() == 2
    assert connection.get_autocommit() and connection.connection.autocommit
