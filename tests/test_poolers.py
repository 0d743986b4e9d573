"""Faults behind a connection pooler: PgBouncer in transaction pooling, and Django's own pool.

Why it matters: a pooler shares server sessions between clients. Behind PgBouncer in
transaction mode, two statements of one client outside a transaction may run on two server
sessions, and the session a run used a moment ago now serves someone else. So nothing of a
run may outlive its transaction there: a session setting (the idle limit) would end other
clients' transactions, and ending "the run's session" would end someone else's. Behind
Django's pool, a connection a run gave back serves the process's other threads.

The workers are :mod:`tests.faults.worker` processes, started by ``spawn_via`` (conftest) to
reach the database through the pooler (``FENCEDJOBS_TEST_VIA``, tests/settings.py); the
test reads the database directly. PgBouncer is the one ``scripts/throwaway_postgres.py``
starts in front of its cluster (``pool_mode = transaction``, ``default_pool_size = 3``); the
"innocent" clients are plain psycopg connections through it that have nothing to do with
the app (:class:`tests.faults.harness.Innocents`). The scenarios of the other fault tests
are reused as they are, with workers behind the pooler.
"""

from __future__ import annotations

import contextlib

import pytest

from django_fencedjobs.models import LEASE_FREE, JobRun, Outcome
from tests import test_faults_liveness as liveness
from tests import test_faults_paused_holder as paused_holder
from tests import test_tasks_faults as tasks_faults
from tests.faults.harness import (
    PGBOUNCER_POOL_SIZE,
    Innocents,
    lease_row,
    make_due,
    prepare,
    runs,
    wait_until,
)
from tests.faults.jobs import POOLED, RECONNECT
from tests.testapp.models import Write

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only]

PGBOUNCER = pytest.param("pgbouncer", marks=pytest.mark.pgbouncer)
#: Both poolers: PgBouncer in transaction pooling, and Django's own pool.
POOLERS = [PGBOUNCER, "pool"]


def run_outcome(name: str) -> str | None:
    run = JobRun.objects.filter(job=name).order_by("-fence").first()
    return run.outcome if run is not None else None


def check_revoked_and_free(name: str, run: JobRun) -> None:
    """The run is recorded timed_out and revoked: the fence moved on and the lease is free."""
    assert run.outcome == Outcome.TIMED_OUT, run.error
    row = lease_row(name)
    assert (row.fence, row.owner, row.lease_until) == (run.fence + 1, "", LEASE_FREE)


# -- the pooler the tests go through -----------------------------------------------------------


@pytest.mark.pgbouncer
def test_the_throwaway_pgbouncer_pools_by_transaction_and_reaches_the_test_database():
    import psycopg
    from django.db import connection

    from tests.faults.harness import pgbouncer_conninfo

    admin = {**pgbouncer_conninfo(), "dbname": "pgbouncer"}
    with psycopg.connect(**admin, autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
        config = {row[0]: row[1] for row in conn.execute("SHOW CONFIG").fetchall()}
    assert (config["pool_mode"], config["default_pool_size"]) == ("transaction", "3")
    with psycopg.connect(**pgbouncer_conninfo()) as conn:
        (name,) = conn.execute("SELECT current_database()").fetchone() or ("",)
    assert name == connection.settings_dict["NAME"]


# -- nothing of a run outlives its transaction on a shared session ----------------------------


@pytest.mark.parametrize("via", [PGBOUNCER])
def test_a_timed_out_run_never_touches_another_clients_transaction(spawn_via):
    """``timeout=1s``, ``lease_ttl=1s``: the handler writes in a fenced block, then sleeps
    8 s outside any transaction, past its timeout and the supervisor's grace, where no
    interrupt reaches it, so the run is ended and given up on. Meanwhile innocent clients,
    as many as PgBouncer has server sessions (so that every session the run touched serves
    one of them soon after), run transactions that sit idle 1.5 s between two statements:
    not one of their transactions is ended."""
    prepare(POOLED)
    with Innocents(PGBOUNCER_POOL_SIZE, idle=1.5) as innocents:
        innocents.wait_for_transactions(1)
        worker = spawn_via("once", POOLED, "W", mode="write_then_block", block=8)
        worker.wait_for("blocking")
        assert worker.wait_exit() == 0, worker.log()
        wait_until(
            lambda: run_outcome(POOLED) not in (None, Outcome.RUNNING),
            what="the run to be recorded",
            diagnostics=worker.log,
        )
        # The sessions the run used serve the innocent clients afterwards, untouched.
        innocents.wait_for_transactions(2)
    assert innocents.errors == [], worker.log()
    (run,) = runs(POOLED)
    check_revoked_and_free(POOLED, run)
    assert not worker.events("not_interrupted")
    assert list(Write.objects.filter(job=POOLED).values_list("fence", "seq")) == [(run.fence, 0)]


@pytest.mark.parametrize("via", POOLERS)
def test_a_handler_blocked_in_its_transaction_past_its_timeout_is_ended_and_the_next_run_proceeds(
    spawn_via, via
):
    """``timeout=1s``, ``lease_ttl=1s``: the handler writes inside a fenced block and sleeps
    there 20 s, holding the lease row. The run is recorded timed_out, its write rolls back,
    the lease row is revoked and free, and the next run of the job succeeds; behind
    PgBouncer, the innocent clients sharing the server sessions meet no error."""
    prepare(POOLED)
    innocents = Innocents(PGBOUNCER_POOL_SIZE, idle=1.5) if via == "pgbouncer" else None
    with innocents or contextlib.nullcontext():
        worker = spawn_via("once", POOLED, "W", mode="block_in_transaction", block=20)
        worker.wait_for("blocking")
        assert worker.wait_exit() == 0, worker.log()
        (run,) = runs(POOLED)
        check_revoked_and_free(POOLED, run)
        assert not worker.events("not_interrupted")
        # Nothing written in the blocked transaction committed.
        assert not Write.objects.filter(job=POOLED, fence=run.fence).exists()
        if innocents is not None:
            innocents.wait_for_transactions(1)
    # The next run, once the innocent clients have let go of the pool's sessions: with a
    # 1 s timeout, a run that waits for one of them (each holds a session 1.5 s) could
    # time out on a busy machine, which says nothing of the blocked run's end.
    make_due(POOLED)
    successor = spawn_via("once", POOLED, "N", mode="write")
    assert successor.wait_exit() == 0, successor.log()
    _, second = runs(POOLED)
    assert second.outcome == Outcome.SUCCEEDED, second.error
    assert list(Write.objects.filter(job=POOLED).values_list("fence", "seq")) == [(second.fence, 0)]
    if innocents is not None:
        assert innocents.errors == [], worker.log()


# -- the fault tests, behind a pooler ---------------------------------------------------------


@pytest.mark.parametrize("via", POOLERS)
def test_a_paused_holders_write_is_rejected_behind_a_pooler(spawn_via):
    """SIGSTOP past the TTL outside any transaction, a successor takes over, the resumed
    holder's next fenced write raises FenceLost: no write of its fence after the takeover
    (tests/test_faults_paused_holder.py)."""
    paused_holder.test_paused_holder_write_is_rejected(spawn_via, 0)


@pytest.mark.parametrize("via", POOLERS)
def test_a_holder_paused_inside_its_transaction_behind_a_pooler_is_ended_and_taken_over(
    spawn_via,
):
    """SIGSTOP inside the fenced transaction: the server ends that transaction after the
    lease TTL, its write rolls back, the job is taken over at its next slot
    (tests/test_faults_liveness.py)."""
    liveness.test_a_holder_paused_inside_its_transaction_is_ended_by_the_server_and_taken_over(
        spawn_via, 0
    )


@pytest.mark.parametrize("via", [PGBOUNCER])
def test_racing_runners_behind_pgbouncer_enqueue_each_slots_task_once(spawn_via):
    """Four runners fire each slot together, two task workers run the tasks, all through
    PgBouncer: one task per slot, run once (tests/test_tasks_faults.py)."""
    tasks_faults.test_racing_runners_enqueue_each_slots_task_once_and_workers_run_it_once(spawn_via)


@pytest.mark.parametrize("via", [PGBOUNCER])
def test_an_enqueue_paused_before_its_commit_behind_pgbouncer_never_commits(spawn_via):
    tasks_faults.test_an_enqueue_paused_before_its_commit_and_taken_over_never_commits(spawn_via, 0)


@pytest.mark.parametrize("via", [PGBOUNCER])
def test_a_task_worker_paused_in_its_fenced_block_behind_pgbouncer_does_not_freeze_the_job(
    spawn_via, tmp_path
):
    tasks_faults.test_a_worker_paused_inside_a_tasks_fenced_block_does_not_freeze_the_job(
        spawn_via, tmp_path
    )


# -- a handler that reconnects ----------------------------------------------------------------


#: How long after the handler blocks the run must be ended: well before its 20-s block ends.
RECONNECT_BOUND = 15.0


def test_a_reconnect_during_a_run_stays_bounded(spawn):
    """``timeout=2s``, ``lease_ttl=6s``. The handler's session is ended by an outside
    connection; the handler retries on a new one and blocks 20 s inside a fenced block
    there. The run is still ended: recorded timed_out with the lease row revoked and free
    while the handler is still blocked, and nothing of the blocked block commits."""
    prepare(RECONNECT)
    worker = spawn("once", RECONNECT, "W", block=20)
    (session,) = worker.wait_for("session")
    (reconnected,) = worker.wait_for("reconnected")
    assert reconnected["pid"] != session["pid"], worker.log()
    worker.wait_for("blocking")

    def ended() -> bool:
        run = JobRun.objects.filter(job=RECONNECT).first()
        row = lease_row(RECONNECT)
        return (
            run is not None
            and run.outcome == Outcome.TIMED_OUT
            and row.fence == run.fence + 1
            and row.lease_until == LEASE_FREE
        )

    wait_until(
        ended,
        timeout=RECONNECT_BOUND,
        what="the run to be recorded timed_out and its lease freed while the handler that "
        "reconnected is blocked in its fenced block",
        diagnostics=lambda: (
            f"{list(JobRun.objects.filter(job=RECONNECT).values())}\n{worker.log()}"
        ),
    )
    assert not worker.events("not_interrupted")
    (run,) = runs(RECONNECT)
    assert not Write.objects.filter(job=RECONNECT, fence=run.fence, seq=99).exists()
    assert worker.wait_exit() == 0, worker.log()
    assert not Write.objects.filter(job=RECONNECT, fence=run.fence, seq=99).exists()
