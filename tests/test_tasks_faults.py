"""Faults around scheduled ``django.tasks``, with real processes: ``runjobs`` runners that
enqueue, django-tasks-db's ``db_worker`` workers that run the tasks, and real signals.

Why it matters: a scheduled task is the run's work handed to someone else. The handing
over must happen once per slot whatever the runners do (racing for the slot, paused past
their lease, killed between the commit and the hand-over), a task of a run that was taken
over must not write next to its successor's, and a task that never finishes (its worker
killed, or never taken by the backend) must make the job read late instead of passing
unseen; a task left pending by a runner killed after its commit is handed over by the
relay, once.

The runners are :mod:`tests.faults.worker` processes over the jobs of
:mod:`tests.faults.jobs`; ``tasks`` mode runs ``db_worker``. A task's ``seq`` says which
run enqueued it (the round, or ``fence * 100 + n``).
"""

from __future__ import annotations

import signal
from collections import Counter
from datetime import timedelta

import pytest
from django_tasks_db.models import DBTaskResult

from django_fencedjobs import clock, operations
from django_fencedjobs.health import State, job_health
from django_fencedjobs.models import UNFINISHED_TASK, Outcome, RunTask, TaskDelivery, TaskStatus
from django_fencedjobs.registry import registry
from tests.faults import jobs
from tests.faults.harness import (
    make_due,
    prepare,
    runs,
    stop_outside_transactions,
    wait_lease_expired,
    wait_until,
)
from tests.faults.jobs import (
    TASK_DOUBLE_FIRE,
    TASK_HANDOVER,
    TASK_HELD,
    TASK_STUCK,
    TASK_TAKEOVER,
)
from tests.taskapp.backends import KILL_MARKER_ENV
from tests.testapp.models import Write

pytestmark = pytest.mark.django_db(transaction=True)

CONTENDERS = 4
ROUNDS = 15
#: Tasks each run of :data:`TASK_TAKEOVER` enqueues.
TASKS = 3


def seq_of(result: DBTaskResult) -> int:
    return result.args_kwargs["args"][1]


def task_rows(job: str) -> list[DBTaskResult]:
    """The task rows (django-tasks-db's) enqueued for ``job``: each task's first argument."""
    return [r for r in DBTaskResult.objects.all() if r.args_kwargs["args"][0] == job]


def all_finished(job: str) -> bool:
    return not RunTask.objects.filter(job=job, status__in=UNFINISHED_TASK).exists()


def health(name: str, **kwargs):
    """``job_health`` with the fault jobs declared, as in the processes that run them."""
    with registry.isolated():
        jobs.register()
        return job_health(name, **kwargs)


def deadline(name: str, slot):
    """The instant after which a task of the run for ``slot`` that has not finished makes
    the job late: its slot plus the job's run timeout plus its grace."""
    with registry.isolated():
        jobs.register()
        declared = registry.get(name)
        return slot + declared.run_timeout + declared.grace


# -- a: double fire ---------------------------------------------------------------------------


def test_racing_runners_enqueue_each_slots_task_once_and_workers_run_it_once(spawn):
    """Several runners fire the same slot together, round after round, while two workers
    run the tasks: one task row per slot, one record of it, one execution."""
    prepare(TASK_DOUBLE_FIRE, due=False)
    runners = [spawn("rounds", TASK_DOUBLE_FIRE, f"R{n}") for n in range(CONTENDERS)]
    workers = [spawn("tasks", "-", f"T{n}") for n in range(2)]
    for process in runners + workers:
        process.wait_for("ready")
    for round_ in range(ROUNDS):
        make_due(TASK_DOUBLE_FIRE)
        for runner in runners:
            runner.send(f"go {round_}")
        for runner in runners:
            runner.wait_for("round_done", count=round_ + 1)
        executed = [e for r in runners for e in r.events("executed") if e["round"] == round_]
        assert len(executed) == 1, (round_, executed)

    wait_until(
        lambda: all_finished(TASK_DOUBLE_FIRE) and len(task_rows(TASK_DOUBLE_FIRE)) >= ROUNDS,
        what="the workers to finish every task",
        diagnostics=spawn.logs,
    )
    rows = task_rows(TASK_DOUBLE_FIRE)
    assert Counter(seq_of(r) for r in rows) == {round_: 1 for round_ in range(ROUNDS)}
    assert {r.status for r in rows} == {"SUCCESSFUL"}
    # Run once: one worker took each task, once.
    assert [len(r.worker_ids) for r in rows] == [1] * ROUNDS
    assert {w for r in rows for w in r.worker_ids} <= {"T0", "T1"}
    recorded = runs(TASK_DOUBLE_FIRE)
    assert len(recorded) == ROUNDS and len({r.scheduled_for for r in recorded}) == ROUNDS
    records = RunTask.objects.filter(job=TASK_DOUBLE_FIRE)
    assert Counter(records.values_list("run_id", flat=True)) == {r.pk: 1 for r in recorded}
    assert {r.result_id for r in records} == {str(r.pk) for r in rows}
    assert set(records.values_list("status", flat=True)) == {TaskStatus.SUCCESSFUL}
    writes = Counter(Write.objects.filter(job=TASK_DOUBLE_FIRE).values_list("seq", flat=True))
    assert writes == {round_: 1 for round_ in range(ROUNDS)}


# -- b: paused inside its fenced transaction, before the commit -------------------------------


# SQLite: a process stopped inside its write transaction keeps the database's write lock (a
# lock on the file) until it resumes, and nothing ends it: no successor can take over while
# it is stopped, so there is no takeover to test. PostgreSQL ends the paused session.
@pytest.mark.postgres_only
@pytest.mark.parametrize("round_", range(2))
def test_an_enqueue_paused_before_its_commit_and_taken_over_never_commits(spawn, round_):
    prepare(TASK_TAKEOVER)
    a = spawn("once", TASK_TAKEOVER, "A", role="A", pause_inside=1)
    b = spawn("once", TASK_TAKEOVER, "B", wait_go=True, role="B")
    (pause,) = a.wait_for("pause_point")
    a.stop()
    a.touch("resume-A")
    wait_lease_expired(TASK_TAKEOVER, diagnostics=spawn.logs)
    wait_until(
        lambda: operations.make_due(TASK_TAKEOVER, clock.now()),
        what="the paused holder's transaction to be ended by the server",
        diagnostics=spawn.logs,
    )
    b.wait_for("ready")
    b.send("go")
    assert b.wait_exit() == 0, b.log()
    a.cont()
    assert a.wait_exit() == 0, a.log()
    assert not a.events("enqueued"), a.log()

    fence_a = pause["fence"]
    fence_b = b.events("enqueued")[0]["fence"]
    assert fence_b > fence_a
    # A's enqueue never committed: no task row, no record, for its fence; B's all did.
    assert not DBTaskResult.objects.filter(pk=pause["result_id"]).exists()
    assert sorted(seq_of(r) for r in task_rows(TASK_TAKEOVER)) == [
        fence_b * 100 + n for n in range(TASKS)
    ]
    records = RunTask.objects.filter(job=TASK_TAKEOVER)
    assert set(records.values_list("fence", flat=True)) == {fence_b}
    assert records.count() == TASKS
    run_a, run_b = runs(TASK_TAKEOVER)
    assert run_a.fence == fence_a and run_a.outcome != Outcome.SUCCEEDED
    assert run_b.outcome == Outcome.SUCCEEDED, run_b.error


# -- c: committed, then paused past the lease and taken over ----------------------------------


@pytest.mark.parametrize("round_", range(2))
def test_the_tasks_of_a_run_taken_over_write_nothing_and_the_successors_do(spawn, round_):
    """A commits its enqueues and is stopped (outside any transaction) past its lease; B
    takes over, enqueues its own and keeps the lease while a worker runs all the tasks:
    A's are refused (FenceLost, recorded as their failure), B's commit. Resumed, A cannot
    enqueue another."""
    prepare(TASK_TAKEOVER)
    a = spawn("once", TASK_TAKEOVER, "A", role="A")
    b = spawn("once", TASK_TAKEOVER, "B", wait_go=True, role="B", hold=1)
    (pause,) = a.wait_for("pause_point")
    stop_outside_transactions(a)
    a.touch("resume-A")
    wait_lease_expired(TASK_TAKEOVER, diagnostics=spawn.logs)
    make_due(TASK_TAKEOVER)
    b.wait_for("ready")
    b.send("go")
    (holding,) = b.wait_for("holding")
    fence_a, fence_b = pause["fence"], holding["fence"]
    assert fence_b == fence_a + 1

    worker = spawn("tasks", "-", "T", batch=1)
    assert worker.wait_exit() == 0, worker.log()
    b.touch("release-B")
    assert b.wait_exit() == 0, b.log()
    a.cont()
    assert a.wait_exit() == 0, a.log()

    seqs_a = [fence_a * 100 + n for n in range(TASKS)]
    seqs_b = [fence_b * 100 + n for n in range(TASKS)]
    rows = {seq_of(r): r for r in task_rows(TASK_TAKEOVER)}
    assert sorted(rows) == seqs_a + seqs_b  # A's enqueues had committed
    assert sorted(Write.objects.filter(job=TASK_TAKEOVER).values_list("seq", flat=True)) == seqs_b
    for seq in seqs_a:
        assert rows[seq].status == "FAILED"
        assert rows[seq].exception_class_path.endswith(".FenceLost"), rows[seq].traceback
    assert {rows[seq].status for seq in seqs_b} == {"SUCCESSFUL"}
    records = RunTask.objects.filter(job=TASK_TAKEOVER)
    for record in records.filter(fence=fence_a):
        assert record.status == TaskStatus.FAILED
        assert "FenceLost" in record.error
    assert records.filter(fence=fence_a).count() == TASKS
    assert set(records.filter(fence=fence_b).values_list("status", flat=True)) == {
        TaskStatus.SUCCESSFUL
    }
    # Resumed, A could enqueue nothing more: refused by the fence (in its enqueue, or
    # before it, by its supervisor, which stops the run), and its run recorded so.
    assert fence_a * 100 + 99 not in rows
    assert [e["seq"] for e in a.events("enqueued")] == seqs_a, a.log()
    run_a, run_b = runs(TASK_TAKEOVER)
    assert (run_a.fence, run_a.outcome) == (fence_a, Outcome.FENCE_LOST), run_a.error
    assert run_b.outcome == Outcome.SUCCEEDED, run_b.error


# -- a worker paused inside a task's fenced transaction ----------------------------------------


# SQLite: the paused task holds the database's write lock (a lock on the file) and nothing
# ends it; every writer waits for it to resume. PostgreSQL can end the paused session.
@pytest.mark.postgres_only
def test_a_worker_paused_inside_a_tasks_fenced_block_does_not_freeze_the_job(spawn, tmp_path):
    """A task's fenced block locks its job's lease row (shared) until it commits, so that no
    later run is granted the lease in between. A worker paused there (SIGSTOP, a suspended
    VM, a long GC pause) must not hold that lock for ever: as for a run's own transaction,
    the server ends the paused session once it has sat idle for the job's lease TTL, the
    task's write rolls back, and the job's next run starts."""
    prepare(TASK_HELD)
    runner = spawn("once", TASK_HELD, "R1")
    assert runner.wait_exit() == 0, runner.log()
    (first,) = runs(TASK_HELD)
    worker = spawn("tasks", "-", "T")
    wait_until(
        lambda: (tmp_path / "task-in-block").exists(),
        what="the worker to be inside the task's fenced block",
        diagnostics=spawn.logs,
    )
    worker.stop()
    worker.touch("release")  # seen as soon as it runs again
    wait_until(
        lambda: operations.make_due(TASK_HELD, clock.now()),
        timeout=15,
        what="the paused task's transaction to be ended by the server (the job's lease row "
        "stays locked by a worker paused inside a task's fenced block)",
        diagnostics=spawn.logs,
    )
    successor = spawn("once", TASK_HELD, "R2")
    assert successor.wait_exit() == 0, successor.log()
    _, second = runs(TASK_HELD)
    assert second.outcome == Outcome.SUCCEEDED, second.error
    worker.cont()
    wait_until(
        lambda: (
            worker.proc.poll() is not None
            or RunTask.objects.filter(run=first, status__in=UNFINISHED_TASK).count() == 0
        ),
        what="the resumed worker to end the paused task",
        diagnostics=spawn.logs,
    )
    # The paused task's write never committed.
    assert not Write.objects.filter(job=TASK_HELD, seq=first.fence).exists()


# -- d: a worker killed in the middle of a task -----------------------------------------------


def test_a_task_whose_worker_was_killed_makes_the_job_late_after_its_deadline(spawn, tmp_path):
    prepare(TASK_STUCK)
    runner = spawn("once", TASK_STUCK, "R")
    assert runner.wait_exit() == 0, runner.log()
    (run,) = runs(TASK_STUCK)
    assert run.outcome == Outcome.SUCCEEDED, run.error

    worker = spawn("tasks", "-", "T")
    wait_until(
        lambda: (tmp_path / "task-started").exists(),
        what="the worker to start the task",
        diagnostics=spawn.logs,
    )
    worker.signal(signal.SIGKILL)
    assert worker.wait_exit() == -signal.SIGKILL
    (record,) = RunTask.objects.filter(job=TASK_STUCK)
    assert record.status == TaskStatus.RUNNING  # started, and nobody will report its end

    due_by = deadline(TASK_STUCK, run.scheduled_for)
    # Up to its deadline the task may still be running as it should: not late yet...
    early = health(TASK_STUCK, now=due_by - timedelta(seconds=1))
    assert early.state != State.LATE, early.reason
    # ...past it, never healthy again while the task has not finished.
    for when in (due_by + timedelta(seconds=1), run.scheduled_for + timedelta(minutes=50)):
        verdict = health(TASK_STUCK, now=when)
        assert verdict.state in (State.LATE, State.FAILING), (when, verdict.state, verdict.reason)
    # And by the clock itself, once it has passed the deadline.
    wait_until(lambda: clock.now() > due_by, what="the task's deadline to pass")
    verdict = health(TASK_STUCK)
    assert verdict.state in (State.LATE, State.FAILING), verdict.reason
    assert not Write.objects.filter(job=TASK_STUCK).exists()


# -- e: killed between the commit and the hand-over -------------------------------------------


def test_a_task_left_pending_by_a_runner_killed_after_the_commit_is_relayed_once(spawn, tmp_path):
    marker = tmp_path / "kill-on-enqueue"
    marker.touch()
    spawn.env[KILL_MARKER_ENV] = str(marker)
    spawn.env["FENCEDJOBS_TEST_HANDOVER_GRACE"] = "1"
    prepare(TASK_HANDOVER)
    crashed = spawn("once", TASK_HANDOVER, "R1")
    assert crashed.wait_exit() == -signal.SIGKILL, crashed.log()
    assert crashed.events("enqueueing") and not crashed.events("enqueued")
    (first,) = runs(TASK_HANDOVER)
    (lost,) = RunTask.objects.filter(job=TASK_HANDOVER)
    # Committed with its run's transaction (an outbox row, with its call), not handed over:
    # the process died in the backend's enqueue.
    assert (lost.run_id, lost.status, lost.result_id) == (first.pk, TaskStatus.PENDING, "")
    assert lost.call is not None and lost.handovers == 1
    marker.unlink()

    # A restarted runner's relay hands it over, once its hand-over grace has passed; the
    # slot itself is not run a second time.
    wait_lease_expired(TASK_HANDOVER, diagnostics=spawn.logs)
    wait_until(lambda: clock.now() > lost.handover_after, what="the hand-over's grace to pass")
    restarted = spawn("once", TASK_HANDOVER, "R2")
    assert restarted.wait_exit() == 0, restarted.log()
    assert not restarted.events("enqueueing")
    assert list(RunTask.objects.filter(job=TASK_HANDOVER)) == [lost]
    lost.refresh_from_db()
    assert (lost.status, lost.handovers) == (TaskStatus.SUCCESSFUL, 2), lost.error
    assert TaskDelivery.objects.filter(task_id=lost.pk).count() == 1
    # Its fenced write, once, for the first slot.
    assert list(Write.objects.filter(job=TASK_HANDOVER).values_list("seq", flat=True)) == [
        int(first.scheduled_for.timestamp())
    ]
