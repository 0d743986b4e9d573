"""Scheduled ``django.tasks`` on RQ, with real processes: a runner (``runjobs --once``) that
enqueues on django-tasks-rq's backend, a real ``redis-server`` and a real ``rqworker`` that
runs the task.

Why it matters: on a backend that does not write to the lease database the task is handed
over after the run's transaction commits, and the worker that runs it is a process the run
never sees. The task must still be recorded with its run, handed over once, run with its
run's fence (its ``fenced_atomic()`` write commits), and reported back by the worker, so that
the job's health covers it.

The runners are ``python -m tests.rq_jobs JOB`` processes over the jobs of
:mod:`tests.rq_jobs`; the workers come from the ``rq_worker`` fixture (tests/conftest.py),
the Redis server from ``redis_server``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from redis import Redis
from rq.job import Job as RQJob

from django_fencedjobs import clock
from django_fencedjobs.declared import sync as sync_rows
from django_fencedjobs.models import FINISHED_TASK, JobRun, Outcome, RunTask, TaskStatus
from django_fencedjobs.registry import registry
from tests import rq_jobs
from tests.faults.harness import REPO_ROOT, WAIT, make_due, wait_until
from tests.rq_jobs import RQ_FENCED_WRITE
from tests.testapp.models import Write

pytestmark = pytest.mark.django_db(transaction=True)


def prepare(name: str) -> None:
    """Create the job's lease row as a runner would, and make it due now ("run now")."""
    with registry.isolated():
        rq_jobs.register()
        sync_rows([registry.get(name)], clock.now())
    make_due(name)


def run_jobs(env: dict[str, str], *names: str) -> subprocess.CompletedProcess[str]:
    """``runjobs --once`` over ``names`` in a runner process of its own, to its end."""
    return subprocess.run(
        [sys.executable, "-m", "tests.rq_jobs", *names],
        env=env,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=WAIT,
    )


def test_a_task_enqueued_on_rq_is_run_by_an_rq_worker_under_its_runs_fence(
    rq_env, rq_worker, redis_server
):
    prepare(RQ_FENCED_WRITE)
    worker = rq_worker("W0")

    runner = run_jobs(rq_env, RQ_FENCED_WRITE)
    assert runner.returncode == 0, runner.stdout + runner.stderr
    (run,) = JobRun.objects.filter(job=RQ_FENCED_WRITE)
    assert run.outcome == Outcome.SUCCEEDED, run.error
    # Recorded with its run, and handed to RQ after the commit: the record has RQ's job id.
    (record,) = RunTask.objects.filter(run=run)
    assert (record.job, record.fence, record.backend) == (RQ_FENCED_WRITE, run.fence, "rq")
    assert record.task_path == "tests.rq_tasks.fenced_write"
    assert record.result_id, record.status

    wait_until(
        lambda: RunTask.objects.filter(pk=record.pk, status__in=FINISHED_TASK).exists(),
        what="the RQ worker to run the task and report its end",
        diagnostics=rq_worker.logs,
    )
    record.refresh_from_db()
    assert record.status == TaskStatus.SUCCESSFUL, record.error + rq_worker.logs()
    assert record.started_at is not None and record.finished_at is not None
    # The worker's report came from the worker: RQ ran the job, on W0, once.
    job = RQJob.fetch(record.result_id, connection=Redis.from_url(redis_server.url))
    # RQ marks its job finished, and stores its result, after the task's end is reported.
    wait_until(
        lambda: job.get_status(refresh=True) == "finished" and job.results(),
        what="RQ's job finished, with its result",
        diagnostics=rq_worker.logs,
    )
    assert [result.worker_name for result in job.results()] == ["W0"]
    # The task's fenced write committed, under its run's fence, once.
    assert list(Write.objects.filter(job=RQ_FENCED_WRITE).values_list("seq", flat=True)) == [
        run.fence
    ]
    assert worker.proc.poll() is None, worker.log()
