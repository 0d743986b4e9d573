"""Fault: one job's holder stops (paused inside its fenced transaction, or a handler that
will not stop), and everything else must go on.

Why it matters: the fence keeps a stuck holder from writing, but a lock it keeps, or a
runner it keeps busy, can still freeze every job behind it. Nothing of the app may wait on
another holder's row lock without a bound, a paused holder's transaction is ended by the
server, and a run ends within its timeout plus a grace whatever its handler catches and
wherever it is blocked.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections

from django_fencedjobs import clock, declared, lease, loop, operations
from django_fencedjobs.models import JobLease, JobRun, Outcome
from django_fencedjobs.registry import registry
from tests.faults.harness import make_due, prepare, runs, wait_lease_expired, wait_until
from tests.faults.jobs import BYSTANDER, OVERRUN, PAUSED_WRITER
from tests.testapp.models import Write

pytestmark = pytest.mark.django_db(transaction=True)


class RowHolder:
    """A second session that holds a job's lease row locked, as a holder paused inside its
    fenced transaction does (before the server ends it)."""

    def __init__(self, name: str) -> None:
        self.connection = connections.create_connection("default")
        self.connection.set_autocommit(False)
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM fencedjobs_joblease WHERE name = %s FOR UPDATE", [name])

    def release(self) -> None:
        self.connection.rollback()
        self.connection.close()


@pytest.mark.postgres_only
def test_a_locked_lease_row_holds_up_no_other_job_and_no_admin_action(spawn):
    prepare(PAUSED_WRITER)
    prepare(BYSTANDER)
    holder = RowHolder(PAUSED_WRITER)
    try:
        # A runner over both jobs passes the locked one by and runs the other.
        worker = spawn("once", f"{PAUSED_WRITER},{BYSTANDER}", "C")
        assert worker.wait_exit() == 0, worker.log()
        assert [r.outcome for r in runs(BYSTANDER)] == [Outcome.SUCCEEDED]
        assert runs(PAUSED_WRITER) == []
        # "Run now", pause and a schedule change wait a bounded time, then say so.
        now = clock.now()
        row = lease.read([PAUSED_WRITER])[PAUSED_WRITER]
        assert operations.set_paused(PAUSED_WRITER, True) is operations.Change.BUSY
        earlier = row.next_run_at - timedelta(seconds=1)  # a change the row would take
        assert operations.make_due(PAUSED_WRITER, earlier) is operations.Change.BUSY
        assert lease.reschedule(PAUSED_WRITER, row.schedule_fingerprint, "changed", now) is False
        assert JobLease.objects.get(name=PAUSED_WRITER).schedule_fingerprint != "changed"
    finally:
        holder.release()
    # Once the row is free, the job runs as usual.
    worker = spawn("once", PAUSED_WRITER, "D", role="B")
    worker.touch("stop-D")
    assert worker.wait_exit() == 0, worker.log()
    assert [r.outcome for r in runs(PAUSED_WRITER)] == [Outcome.SUCCEEDED]


@pytest.mark.postgres_only
@pytest.mark.parametrize("round_", range(2))
def test_a_holder_paused_inside_its_transaction_is_ended_by_the_server_and_taken_over(
    spawn, round_
):
    """The server ends the paused holder's transaction once it has sat idle for the lease's
    TTL: its unfinished write rolls back and the successor takes over without waiting for
    the holder to resume. Resumed, the holder writes nothing and its run ends fence_lost."""
    prepare(PAUSED_WRITER, due=False)
    make_due(PAUSED_WRITER)
    a = spawn("once", PAUSED_WRITER, "A", role="A", pause_after=2, pause_inside=1)
    b = spawn("once", PAUSED_WRITER, "B", wait_go=True, role="B")
    (pause,) = a.wait_for("pause_point")
    a.stop()
    a.touch("resume-A")
    wait_lease_expired(PAUSED_WRITER, diagnostics=spawn.logs)
    wait_until(
        lambda: operations.make_due(PAUSED_WRITER, clock.now()),
        what="the paused holder's transaction to be ended by the server",
        diagnostics=spawn.logs,
    )
    b.wait_for("ready")
    b.send("go")
    b.wait_for("ack", count=3)  # while A is still stopped
    a.cont()
    assert a.wait_exit() == 0, a.log()
    b.touch("stop-B")
    assert b.wait_exit() == 0, b.log()
    # The write A was paused in the middle of rolled back; B's all committed.
    assert not Write.objects.filter(pk=pause["id"]).exists()
    assert Write.objects.filter(fence=pause["fence"]).count() == 1
    acked_b = {e["id"] for e in b.events("ack")}
    assert acked_b <= set(Write.objects.values_list("id", flat=True))
    run_a, run_b = runs(PAUSED_WRITER)
    assert run_a.outcome == Outcome.FENCE_LOST, run_a.error
    assert run_b.outcome == Outcome.SUCCEEDED, run_b.error


@pytest.mark.parametrize("mode", ["block", "block_in_transaction", "swallow"])
def test_a_run_ends_at_its_timeout_whatever_its_handler_catches_or_blocks_in(spawn, mode):
    """``timeout=1s``. ``block``: one 60-s sleep no interrupt reaches; in a transaction,
    holding the lease row; ``swallow``: ``except Exception`` around every item. The run is
    recorded timed_out and the runner exits while a blocked handler is still asleep."""
    prepare(OVERRUN)
    worker = spawn("once", OVERRUN, "W", mode=mode)
    assert worker.wait_exit() == 0, worker.log()
    (run,) = runs(OVERRUN)
    assert run.outcome == Outcome.TIMED_OUT, run.error
    assert not worker.events("not_interrupted")
    # The handler never got to catch the end of its run.
    assert worker.events("swallowed") == [], worker.log()
    # Nothing written in the blocked transaction committed.
    assert not Write.objects.filter(job=OVERRUN, seq=1, fence=run.fence).exists() or (
        mode == "swallow"
    )
    row = JobLease.objects.get(name=OVERRUN)
    assert (row.fence, row.consecutive_failures) == (run.fence + 1, 1)


def test_the_end_of_a_run_is_never_caught_as_an_ordinary_error_wherever_it_lands(jobs):
    """The timeout's interrupt can land inside a database call (after the COMMIT was sent,
    before its result was read); the cleanup that follows then fails on the connection
    with an ordinary error that replaced the interrupt, and a handler's ``except
    Exception:`` caught it and went on. Many short runs, so the interrupt lands at many
    points of a tight loop of fenced writes (before the fix, about one run in 20 caught a
    ``ProgrammingError``): not one error is caught, every run ends timed_out."""
    import time

    from django_fencedjobs import fenced_atomic, job
    from django_fencedjobs.clock import fake_clock

    caught: list[str] = []

    @job(every=timedelta(hours=1), name="t.swallow", timeout=timedelta(milliseconds=50))
    def swallow(run):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with fenced_atomic():
                    Write.objects.create(job=run.job.name, fence=run.fence, seq=0)
            except Exception as exc:
                caught.append(repr(exc))

    loop.tick()  # the first tick creates the lease row
    for _ in range(150):
        fake_clock.advance(timedelta(hours=1))
        (record,) = loop.tick().runs
        assert record.outcome == Outcome.TIMED_OUT, record.error
        assert caught == []


def test_a_timed_out_run_keeps_its_watermark_after(jobs):
    from datetime import datetime

    from django_fencedjobs import fenced_atomic, job
    from django_fencedjobs.clock import fake_clock

    start = datetime(2026, 11, 29, 6, 0, tzinfo=fake_clock().tzinfo)

    @job(every=timedelta(hours=1), name="t.slow_windows", timeout=timedelta(seconds=2))
    def slow(run):
        for window in run.windows(timedelta(hours=1), start=start):
            with fenced_atomic():
                run.advance_watermark(window.end)
            import time

            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # overruns after the first window
                pass

    loop.tick()  # the first tick creates the lease row
    fake_clock.advance(timedelta(hours=1))
    (record,) = loop.tick().runs
    assert record.outcome == Outcome.TIMED_OUT
    assert record.watermark_after == "2026-11-29T07:00:00+00:00"


@pytest.mark.postgres_only
def test_a_finishing_run_takes_the_lease_row_before_its_run_row(jobs):
    """One lock order everywhere, the lease row first: a finishing run waits for the lease
    row *before* it locks its own run row, so a successor that holds the lease row (and is
    about to mark that run abandoned) never deadlocks with it."""
    from django_fencedjobs import job

    returning, go = threading.Event(), threading.Event()

    @job(every=timedelta(hours=1), name="t.lock_order")
    def lock_order(run):
        returning.set()
        go.wait(30)

    ticking = threading.Thread(target=lambda: (loop.tick(), connections.close_all()))
    declared.sync([registry.get("t.lock_order")], clock.now())
    operations.make_due("t.lock_order", clock.now())
    ticking.start()
    assert returning.wait(30)
    (run,) = JobRun.objects.filter(job="t.lock_order")
    successor = RowHolder("t.lock_order")  # a successor's acquisition, in progress
    try:
        go.set()
        wait_until(lambda: _waiting_on_a_lock(), what="the finishing run to wait for the lease")
        with successor.connection.cursor() as cursor:
            # Would raise (lock_not_available) if the finishing run had locked its row first.
            cursor.execute(
                "SELECT 1 FROM fencedjobs_jobrun WHERE id = %s FOR UPDATE NOWAIT", [run.pk]
            )
    finally:
        successor.release()
    ticking.join(30)
    run.refresh_from_db()
    assert run.outcome == Outcome.SUCCEEDED, run.error


def _waiting_on_a_lock() -> bool:
    # pg_locks is the whole server's: count only the sessions on this test database, not
    # those of tests running beside this one on databases of their own.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks JOIN pg_stat_activity USING (pid)"
            " WHERE NOT granted AND datname = current_database()"
        )
        return cursor.fetchone()[0] > 0
