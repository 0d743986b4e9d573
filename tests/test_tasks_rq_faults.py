"""Faults around scheduled tasks on RQ, with real processes: runners (``runjobs --once``) that
enqueue on django-tasks-rq's backend, real ``rqworker`` workers, a real ``redis-server``,
and real SIGKILLs and Redis restarts.

Why it matters: RQ is a queue outside the lease database, so a run's task is recorded in the
run's transaction (an outbox row) and handed to RQ after the commit; RQ delivers at least
once (a job can be requeued, a worker's job abandoned and run again). The task's fenced
writes must still commit once per slot: a task the runner never handed over is relayed, a
job delivered twice writes once (the second execution's ``fenced_atomic()`` raises
``DuplicateDelivery``), and a task RQ lost or left behind makes the job read late instead of
passing unseen.

The runners are ``tests.rq_jobs.faults_main`` processes over the jobs of
:mod:`tests.rq_jobs`; the workers come from the ``rq_worker`` fixture, Redis from
``redis_server`` (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from redis import Redis
from rq import Queue
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job as RQJob
from rq.registry import FailedJobRegistry, StartedJobRegistry
from rq.results import Result

from django_fencedjobs import clock
from django_fencedjobs.declared import sync as sync_rows
from django_fencedjobs.health import JobHealth, State, job_health
from django_fencedjobs.integrations import relay
from django_fencedjobs.models import (
    FINISHED_TASK,
    JobRun,
    Outcome,
    RunTask,
    TaskDelivery,
    TaskStatus,
)
from django_fencedjobs.registry import registry
from tests import rq_jobs
from tests.faults.harness import (
    REPO_ROOT,
    WAIT,
    make_due,
    process_state,
    wait_lease_expired,
    wait_until,
)
from tests.redis_harness import RQWorker, children_of
from tests.rq_backends import HOLD_MARKER_ENV, reached
from tests.rq_jobs import (
    HELD_DIR_ENV,
    RQ_FAULTY_WRITE,
    RQ_FENCED_WRITE,
    RQ_HELD_AFTER_COMMIT,
    RQ_HELD_WRITE,
)
from tests.taskapp.backends import KILL_MARKER_ENV
from tests.testapp.models import Write

# The broker's faults, on the production database (and in the Django 6 pass): the
# database's side is the same code on SQLite, tested by tests/test_tasks_relay.py.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only]

#: The runners relay a task still pending this long (seconds) after its commit, not 10 s.
GRACE = {"FENCEDJOBS_TEST_HANDOVER_GRACE": "1"}
RUNNER = "import sys, tests.rq_jobs as m; sys.exit(m.faults_main(sys.argv[1:]))"


def register() -> None:
    rq_jobs.register()
    rq_jobs.register_faults()


def prepare(name: str) -> None:
    """Create the job's lease row as a runner would, and make it due now ("run now")."""
    with registry.isolated():
        register()
        sync_rows([registry.get(name)], clock.now())
    make_due(name)


def start_runner(env: dict[str, str], name: str, log: Path) -> subprocess.Popen[str]:
    """``runjobs --once`` over ``name`` in a runner process of its own, its output in ``log``."""
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-c", RUNNER, name],
            env=env,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )


def run_jobs(env: dict[str, str], name: str) -> subprocess.CompletedProcess[str]:
    """``runjobs --once`` over ``name`` in a runner process of its own, to its end."""
    return subprocess.run(
        [sys.executable, "-c", RUNNER, name],
        env=env,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=WAIT,
    )


def health(name: str, now: datetime) -> JobHealth:
    with registry.isolated():
        register()
        return job_health(name, now=now)


def deadline(name: str, slot: datetime) -> datetime:
    """The instant after which a task of the run for ``slot`` that has not finished makes
    the job late: its slot plus the job's run timeout plus its grace."""
    with registry.isolated():
        register()
        declared = registry.get(name)
        return slot + declared.run_timeout + declared.grace


def the_run_and_task(name: str) -> tuple[JobRun, RunTask]:
    (run,) = JobRun.objects.filter(job=name)
    (record,) = RunTask.objects.filter(run=run)
    return run, record


def wait_finished(record: RunTask, rq_worker) -> RunTask:
    wait_until(
        lambda: RunTask.objects.filter(pk=record.pk, status__in=FINISHED_TASK).exists(),
        what="the RQ worker to run the task and report its end",
        diagnostics=rq_worker.logs,
    )
    record.refresh_from_db()
    return record


def writes(name: str) -> list[int]:
    return list(Write.objects.filter(job=name).values_list("seq", flat=True))


def kill_with_its_horse(worker: RQWorker) -> None:
    """SIGKILL an RQ worker, then the work horse it forked to run the job (in a process group
    of its own): the worker first, so that it cannot see its horse die and fail the job
    itself, as when both die together (the machine lost, an OOM kill of the container)."""
    horses = children_of(worker.pid)
    assert horses, worker.log()
    os.kill(worker.pid, signal.SIGKILL)
    worker.proc.wait(WAIT)
    for pid in horses:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_until(
        lambda: all(process_state(pid) in ("gone", "Z") for pid in horses),
        what="the work horse to die",
    )


# -- killed between the commit and the hand-over ----------------------------------------------


def test_a_task_left_pending_by_a_runner_killed_in_the_hand_over_is_relayed_and_run_once(
    rq_env, rq_worker, redis_server, tmp_path
):
    marker = tmp_path / "kill-on-enqueue"
    marker.touch()
    env = {**rq_env, **GRACE, KILL_MARKER_ENV: str(marker)}
    prepare(RQ_FAULTY_WRITE)
    worker = rq_worker("W0")

    crashed = run_jobs(env, RQ_FAULTY_WRITE)
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr
    run, record = the_run_and_task(RQ_FAULTY_WRITE)
    # Committed with its run's transaction (an outbox row, with its call), never handed to
    # RQ: the runner died in the backend's enqueue, before anything reached Redis.
    assert (record.status, record.result_id, record.handovers) == (TaskStatus.PENDING, "", 1)
    assert record.call == {"args": [RQ_FAULTY_WRITE, run.fence], "kwargs": {}}
    conn = Redis.from_url(redis_server.url)
    assert Queue("default", connection=conn).count == 0
    marker.unlink()

    # A restarted runner's relay hands it over once its grace has passed; the slot itself is
    # not run a second time.
    wait_lease_expired(RQ_FAULTY_WRITE, diagnostics=rq_worker.logs)
    wait_until(lambda: clock.now() > record.handover_after, what="the hand-over's grace to pass")
    restarted = run_jobs(env, RQ_FAULTY_WRITE)
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    assert JobRun.objects.filter(job=RQ_FAULTY_WRITE).count() == 1
    assert RunTask.objects.filter(job=RQ_FAULTY_WRITE).count() == 1
    record.refresh_from_db()
    assert record.handovers == 2 and record.result_id, (record.status, record.error)

    record = wait_finished(record, rq_worker)
    assert (record.status, record.handovers) == (TaskStatus.SUCCESSFUL, 2), record.error
    # Each hand-over's id was recorded before it began; the killed one's never reached RQ.
    killed, relayed = TaskDelivery.objects.filter(task_id=record.pk).order_by("pk")
    assert (relayed.backend, relayed.result_id) == ("rq_faulty", record.result_id)
    with pytest.raises(NoSuchJobError):
        RQJob.fetch(killed.result_id, connection=conn)
    job = RQJob.fetch(record.result_id, connection=conn)
    # RQ stores a job's result after the task's own end is reported: wait for it.
    wait_until(lambda: job.results(), what="RQ's result of the job")
    assert [result.worker_name for result in job.results()] == ["W0"]
    # Its fenced write, once, under its run's fence.
    assert writes(RQ_FAULTY_WRITE) == [run.fence]
    assert worker.proc.poll() is None, worker.log()


# -- the same job delivered twice -------------------------------------------------------------


def test_an_rq_job_delivered_again_after_it_wrote_writes_nothing_and_counts_a_duplicate(
    rq_env, rq_worker, redis_server
):
    """RQ's ``Job.requeue()`` takes only a failed job (from the ``FailedJobRegistry``); a
    finished one is delivered again by enqueueing it on its queue once more, under the same
    id, as a broker's redelivery would. The second execution is refused by its fence."""
    prepare(RQ_FENCED_WRITE)
    rq_worker("W0")
    runner = run_jobs(rq_env, RQ_FENCED_WRITE)
    assert runner.returncode == 0, runner.stdout + runner.stderr
    run, record = the_run_and_task(RQ_FENCED_WRITE)
    record = wait_finished(record, rq_worker)
    assert record.status == TaskStatus.SUCCESSFUL, record.error + rq_worker.logs()
    assert record.executor  # claimed by the execution that wrote
    assert writes(RQ_FENCED_WRITE) == [run.fence]

    conn = Redis.from_url(redis_server.url)
    job = RQJob.fetch(record.result_id, connection=conn)
    with pytest.raises(InvalidJobOperation):
        job.requeue()
    Queue(job.origin, connection=conn).enqueue_job(job)

    wait_until(
        lambda: len(job.results()) == 2,
        what="the RQ worker to run the job again",
        diagnostics=rq_worker.logs,
    )
    # The second execution raised DuplicateDelivery in fenced_atomic(), before writing.
    assert writes(RQ_FENCED_WRITE) == [run.fence]
    latest, first = job.results()
    assert (first.type, latest.type) == (Result.Type.SUCCESSFUL, Result.Type.FAILED)
    assert "DuplicateDelivery" in (latest.exc_string or ""), latest.exc_string
    # The record is the first execution's: successful, the second counted as a duplicate.
    wait_until(
        lambda: RunTask.objects.filter(pk=record.pk, duplicates__gt=0).exists(),
        what="the worker to count the second execution as a duplicate",
        diagnostics=rq_worker.logs,
    )
    record.refresh_from_db()
    assert (record.status, record.duplicates) == (TaskStatus.SUCCESSFUL, 1), record.error
    assert TaskDelivery.objects.filter(task_id=record.pk).count() == 1


# -- a worker killed in the middle of a task --------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(RQ_HELD_WRITE, id="killed-inside-the-fenced-block"),
        pytest.param(RQ_HELD_AFTER_COMMIT, id="killed-after-the-fenced-block-committed"),
    ],
)
def test_a_task_whose_rq_worker_was_killed_reads_late_and_requeued_writes_once(
    name, rq_env, rq_worker, redis_server, tmp_path
):
    """What RQ does with a job whose worker (and work horse) was SIGKILLed: nothing at
    once. The job stays ``started`` in its queue's ``StartedJobRegistry`` until its execution
    expires (its last heartbeat plus RQ's heartbeat TTL, 90 s by default), and a worker
    started meanwhile does not take it. The first worker maintenance after that
    (``clean_registries``, at a worker's start and every 10 minutes) calls the job's failure
    callback (django-tasks-rq's reports the task failed, so its record is recorded failed)
    and, django-tasks-rq enqueueing without retries, moves it to the ``FailedJobRegistry``:
    RQ never runs it again by itself. An operator requeues it (``Job.requeue()``); the new
    execution writes if the killed one's fenced block had not committed, and raises
    ``DuplicateDelivery`` before writing if it had.

    The task's record reads what its last execution did: failed, as the cleanup reported,
    when the requeued execution was a duplicate; successful when it wrote and ran to its
    end."""
    committed_first = name == RQ_HELD_AFTER_COMMIT
    prepare(name)
    w0 = rq_worker("W0")
    runner = run_jobs({**rq_env, HELD_DIR_ENV: str(tmp_path)}, name)
    assert runner.returncode == 0, runner.stdout + runner.stderr
    run, record = the_run_and_task(name)
    wait_until(
        lambda: (tmp_path / "task-held").exists(),
        what="the worker to hold the task",
        diagnostics=rq_worker.logs,
    )
    kill_with_its_horse(w0)
    record.refresh_from_db()
    assert record.status == TaskStatus.RUNNING  # started, and nobody will report its end
    assert writes(name) == ([run.fence] if committed_first else [])
    assert bool(record.executor) == committed_first

    # Up to its deadline the task may still be running as it should: not late yet; past
    # it, late, saying why.
    due_by = deadline(name, run.scheduled_for)
    early = health(name, due_by - timedelta(seconds=1))
    assert early.state != State.LATE, early.reason
    late = health(name, due_by + timedelta(seconds=1))
    assert late.state == State.LATE, late.reason
    assert "1 running on backend 'rq', queue 'default'" in late.reason, late.reason
    assert "worker may have died" in late.reason, late.reason

    # RQ: the job is still started, its execution not expired; a new worker does not take it.
    conn = Redis.from_url(redis_server.url)
    job = RQJob.fetch(record.result_id, connection=conn)
    assert job.get_status() == "started"
    burst = rq_worker("B1", burst=True)
    assert burst.wait_exit() == 0, burst.log()
    assert job.get_status(refresh=True) == "started"
    assert writes(name) == ([run.fence] if committed_first else [])

    # Once the execution has expired, a worker's maintenance moves it to the failed jobs and
    # reports the task failed (its failure callback).
    expired = subprocess.run(
        [sys.executable, "-c", "import sys, tests.rq_jobs as m; sys.exit(m.expire_main())"],
        env=rq_env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert expired.returncode == 0, expired.stdout + expired.stderr
    assert expired.stdout.split() == [record.result_id], expired.stdout + expired.stderr
    queue = Queue("default", connection=conn)
    assert job.get_status(refresh=True) == "failed"
    assert record.result_id in FailedJobRegistry(queue=queue)
    assert record.result_id not in StartedJobRegistry(queue=queue).get_job_ids(cleanup=False)
    record.refresh_from_db()
    assert record.status == TaskStatus.FAILED, expired.stderr
    assert health(name, clock.now()).state == State.FAILING

    # An operator requeues it; a worker runs it again.
    (tmp_path / "release").touch()
    executions = len(job.results())
    job.requeue()
    rq_worker("W1")
    wait_until(
        lambda: len(job.results()) > executions,
        what="the new worker to run the requeued job",
        diagnostics=rq_worker.logs,
    )
    # Its write, exactly once, whichever execution committed it.
    assert writes(name) == [run.fence]
    latest = job.results()[0]
    record.refresh_from_db()
    if committed_first:
        assert latest.type == Result.Type.FAILED
        assert "DuplicateDelivery" in (latest.exc_string or ""), latest.exc_string
        assert record.duplicates == 1
    else:
        assert latest.type == Result.Type.SUCCESSFUL, latest.exc_string
        assert record.duplicates == 0
    # The requeued execution's end: a duplicate's leaves the record as the cleanup
    # recorded it; a success is recorded over the failure.
    expected = TaskStatus.FAILED if committed_first else TaskStatus.SUCCESSFUL
    assert record.status == expected, (record.status, record.error)


# -- Redis restarted during a slot ------------------------------------------------------------


def test_a_task_whose_hand_over_met_redis_down_stays_pending_and_is_relayed_once_it_is_back(
    rq_env, rq_worker, redis_server, tmp_path
):
    hold = tmp_path / "hold-enqueue"
    hold.touch()
    env = {**rq_env, **GRACE, HOLD_MARKER_ENV: str(hold)}
    prepare(RQ_FAULTY_WRITE)
    runner = start_runner(env, RQ_FAULTY_WRITE, tmp_path / "runner.log")
    wait_until(
        lambda: reached(hold).exists() or runner.poll() is not None,
        what="the runner to reach the hand-over",
    )
    # The run's transaction has committed its task; Redis goes away right before the hand-over.
    redis_server.stop()
    hold.unlink()
    assert runner.wait(WAIT) == 0, (tmp_path / "runner.log").read_text()
    run, record = the_run_and_task(RQ_FAULTY_WRITE)
    assert run.outcome == Outcome.SUCCEEDED, run.error
    # Not handed over, and recorded so: pending, with the error, tried again after a backoff.
    assert (record.status, record.result_id, record.handovers) == (TaskStatus.PENDING, "", 1)
    assert "Hand-over 1: the backend 'rq_faulty' did not take the task" in record.error
    assert "ConnectionError" in record.error, record.error
    assert record.handover_after >= run.started_at + relay.BACKOFF
    (refused,) = TaskDelivery.objects.filter(task_id=record.pk)  # its id, chosen before

    # Redis comes back, empty; once the backoff has passed, a runner's relay hands it over.
    redis_server.restart()
    rq_worker("W0")
    wait_until(
        lambda: clock.now() > record.handover_after,
        timeout=WAIT + relay.BACKOFF.total_seconds(),
        what="the hand-over's backoff to pass",
    )
    relaying = run_jobs(env, RQ_FAULTY_WRITE)
    assert relaying.returncode == 0, relaying.stdout + relaying.stderr
    record.refresh_from_db()
    assert record.handovers == 2 and record.result_id, (record.status, record.error)
    record = wait_finished(record, rq_worker)
    assert (record.status, record.handovers, record.error) == (TaskStatus.SUCCESSFUL, 2, "")
    delivery = TaskDelivery.objects.filter(task_id=record.pk).latest("pk")
    assert delivery.result_id == record.result_id != refused.result_id
    with pytest.raises(NoSuchJobError):
        RQJob.fetch(refused.result_id, connection=Redis.from_url(redis_server.url))
    job = RQJob.fetch(record.result_id, connection=Redis.from_url(redis_server.url))
    wait_until(lambda: job.results(), what="RQ's result of the job")
    assert [result.worker_name for result in job.results()] == ["W0"]
    assert writes(RQ_FAULTY_WRITE) == [run.fence]
    assert JobRun.objects.filter(job=RQ_FAULTY_WRITE).count() == 1


def test_a_task_queued_in_a_redis_that_restarted_empty_is_lost_and_the_job_reads_late(
    rq_env, rq_worker, redis_server
):
    """A Redis without persistence that restarts loses what was queued in it. The task was
    handed over (its record is ``ready``, with RQ's id), so nothing hands it over again (the
    relay looks only at pending tasks): it is lost for good, and the job reads late once the
    slot's deadline has passed, the reason naming the backend and queue where it waits and
    saying no worker started it."""
    prepare(RQ_FENCED_WRITE)
    runner = run_jobs(rq_env, RQ_FENCED_WRITE)
    assert runner.returncode == 0, runner.stdout + runner.stderr
    run, record = the_run_and_task(RQ_FENCED_WRITE)
    assert record.status == TaskStatus.READY and record.result_id
    assert (record.backend, record.queue_name) == ("rq", "default")
    conn = Redis.from_url(redis_server.url)
    assert Queue("default", connection=conn).job_ids == [record.result_id]

    redis_server.restart(crash=True)
    conn = Redis.from_url(redis_server.url)
    with pytest.raises(NoSuchJobError):
        RQJob.fetch(record.result_id, connection=conn)
    # A worker on the restarted Redis finds nothing to run.
    burst = rq_worker("B0", burst=True)
    assert burst.wait_exit() == 0, burst.log()
    record.refresh_from_db()
    assert record.status == TaskStatus.READY
    assert not Write.objects.filter(job=RQ_FENCED_WRITE).exists()
    assert record.pk not in {r.pk for r in relay.pending(clock.now() + timedelta(days=1))}

    due_by = deadline(RQ_FENCED_WRITE, run.scheduled_for)
    early = health(RQ_FENCED_WRITE, due_by - timedelta(seconds=1))
    assert early.state != State.LATE, early.reason
    late = health(RQ_FENCED_WRITE, due_by + timedelta(seconds=1))
    assert late.state == State.LATE, late.reason
    assert "1 ready on backend 'rq', queue 'default': not started by any worker" in late.reason, (
        late.reason
    )
