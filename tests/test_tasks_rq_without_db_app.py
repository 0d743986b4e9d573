"""RQ in a project that has django-tasks-db installed but not in ``INSTALLED_APPS`` (a
dependency of something else): its models cannot be imported there, and whether a backend
writes to the lease database must not need them. Real processes: a runner, a real
``redis-server``, a real ``rqworker``, both with tests.rq_settings without the app."""

from __future__ import annotations

import pytest

from django_fencedjobs.models import FINISHED_TASK, JobRun, Outcome, RunTask, TaskStatus
from tests.faults.harness import wait_until
from tests.rq_jobs import RQ_FENCED_WRITE
from tests.test_tasks_rq import prepare, run_jobs
from tests.testapp.models import Write

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def rq_env(rq_env: dict[str, str]) -> dict[str, str]:
    """The runners and workers of this module: django-tasks-db is not an app."""
    return {**rq_env, "FENCEDJOBS_TEST_WITHOUT_TASKS_DB": "1"}


def test_a_task_enqueued_on_rq_runs_when_django_tasks_db_is_installed_but_not_an_app(
    rq_env, rq_worker
):
    prepare(RQ_FENCED_WRITE)
    worker = rq_worker("W0")

    runner = run_jobs(rq_env, RQ_FENCED_WRITE)
    assert runner.returncode == 0, runner.stdout + runner.stderr
    (run,) = JobRun.objects.filter(job=RQ_FENCED_WRITE)
    assert run.outcome == Outcome.SUCCEEDED, run.error
    (record,) = RunTask.objects.filter(run=run)
    assert record.result_id, (record.status, record.error)

    wait_until(
        lambda: RunTask.objects.filter(pk=record.pk, status__in=FINISHED_TASK).exists(),
        what="the RQ worker to run the task and report its end",
        diagnostics=rq_worker.logs,
    )
    record.refresh_from_db()
    assert record.status == TaskStatus.SUCCESSFUL, record.error + rq_worker.logs()
    assert list(Write.objects.filter(job=RQ_FENCED_WRITE).values_list("seq", flat=True)) == [
        run.fence
    ]
    assert worker.proc.poll() is None, worker.log()
