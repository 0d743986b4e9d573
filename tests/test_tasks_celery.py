"""Scheduled ``django.tasks`` on Celery, with real processes: runners (``runjobs --once``)
that enqueue on django-tasks-fennel's backend, a real ``redis-server`` (Celery's broker and
result backend) and a real ``celery worker`` that runs the task.

Why it matters: Celery is a queue outside the lease database, so a run's task is recorded in
the run's transaction (an outbox row) and handed to Celery after the commit; Celery delivers
at least once (a message can come again under the same task id). The task's fenced writes
must still commit once per slot: the task is run with its run's fence and reported back by
the worker, a message delivered twice writes once (the second execution's
``fenced_atomic()`` raises ``DuplicateDelivery``), and a task the runner never handed over
is relayed.

django-tasks-fennel sends each task under a Celery task id of its own making, which is the
task's id in Django's framework too (``TaskResult.id``): the run records it, and the worker
reports (``task_started``/``task_finished``) under it.

The runners are ``python -m tests.celery_jobs JOB`` processes over the jobs of
:mod:`tests.celery_jobs`; the workers come from the ``celery_worker`` fixture
(tests/conftest.py), Redis from ``redis_server``.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from celery import Celery
from celery.result import AsyncResult

from django_fencedjobs import clock
from django_fencedjobs.declared import sync as sync_rows
from django_fencedjobs.models import (
    FINISHED_TASK,
    JobRun,
    Outcome,
    RunTask,
    TaskDelivery,
    TaskStatus,
)
from django_fencedjobs.registry import registry
from tests import celery_jobs
from tests.celery_jobs import CELERY_FAULTY_WRITE, CELERY_FENCED_WRITE
from tests.faults.harness import REPO_ROOT, WAIT, make_due, wait_lease_expired, wait_until
from tests.taskapp.backends import KILL_MARKER_ENV
from tests.testapp.models import Write

pytest.importorskip(
    "django_tasks_fennel",
    reason="django-tasks-fennel is not installed (not in the dev extra: FENNEL_BASE_EXCEPTIONS)",
)

# Real Celery workers, on the production database (and in the Django 6 pass).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only]

#: The runners relay a task still pending this long (seconds) after its commit, not 10 s.
GRACE = {"FENCEDJOBS_TEST_HANDOVER_GRACE": "1"}
#: Why a second delivery fails with django-tasks-fennel 0.1 (its backend.py, the task wrapper
#: of ``Task.__post_init__``): the wrapper catches ``Exception`` only, where Django's own
#: backends (``ImmediateBackend``, django-tasks-db's worker) catch ``BaseException`` and report
#: the task failed. ``DuplicateDelivery`` is a ``BaseException`` (a ``RunAborted``, so that a
#: task's ``except Exception:`` cannot swallow it): the wrapper sends no ``task_finished``, so
#: the duplicate is never counted, and hands it to Celery's tracer, which re-raises whatever is
#: not an ``Exception`` to the pool as fatal. The solo pool turns it into ``WorkerLostError``
#: and the worker exits ("Unrecoverable error: TypeError('cannot unpack non-iterable
#: ExceptionInfo object')"); the prefork pool logs "Task handler raised error" and stores no
#: result. The fence still holds: the second execution writes nothing.
FENNEL_BASE_EXCEPTIONS = (
    "django-tasks-fennel 0.1 reports no task_finished for a BaseException (DuplicateDelivery) "
    "and hands it to Celery, which treats it as fatal: the duplicate is not counted and a "
    "solo worker exits"
)
#: django-tasks-fennel's name of a task in Celery's registry: its module path, prefixed.
CELERY_NAME = "django_tasks:{}"


def prepare(name: str) -> None:
    """Create the job's lease row as a runner would, and make it due now ("run now")."""
    with registry.isolated():
        celery_jobs.register()
        sync_rows([registry.get(name)], clock.now())
    make_due(name)


def run_jobs(env: dict[str, str], *names: str) -> subprocess.CompletedProcess[str]:
    """``runjobs --once`` over ``names`` in a runner process of its own, to its end."""
    return subprocess.run(
        [sys.executable, "-m", "tests.celery_jobs", *names],
        env=env,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=WAIT,
    )


def celery_app(redis_url: str) -> Celery:
    """A Celery client of the test's Redis, as broker and result backend (extended results:
    the worker's name)."""
    app = Celery("fencedjobs-tests", broker=redis_url, backend=redis_url, set_as_current=False)
    app.conf.result_extended = True
    return app


def the_run_and_task(name: str) -> tuple[JobRun, RunTask]:
    (run,) = JobRun.objects.filter(job=name)
    (record,) = RunTask.objects.filter(run=run)
    return run, record


def wait_finished(record: RunTask, celery_worker) -> RunTask:
    wait_until(
        lambda: RunTask.objects.filter(pk=record.pk, status__in=FINISHED_TASK).exists(),
        what="the Celery worker to run the task and report its end",
        diagnostics=celery_worker.logs,
    )
    record.refresh_from_db()
    return record


def writes(name: str) -> list[int]:
    return list(Write.objects.filter(job=name).values_list("seq", flat=True))


def test_a_task_enqueued_on_celery_is_run_by_a_celery_worker_under_its_runs_fence(
    celery_env, celery_worker, redis_server
):
    prepare(CELERY_FENCED_WRITE)
    worker = celery_worker("W0")

    runner = run_jobs(celery_env, CELERY_FENCED_WRITE)
    assert runner.returncode == 0, runner.stdout + runner.stderr
    run, record = the_run_and_task(CELERY_FENCED_WRITE)
    assert run.outcome == Outcome.SUCCEEDED, run.error
    # Recorded with its run, and handed to Celery after the commit: the record has the id
    # Celery knows the task by.
    assert (record.job, record.fence, record.backend) == (CELERY_FENCED_WRITE, run.fence, "celery")
    assert record.task_path == "tests.celery_tasks.fenced_write"
    assert record.result_id, record.status
    (delivery,) = TaskDelivery.objects.filter(task_id=record.pk)
    assert delivery.result_id == record.result_id

    record = wait_finished(record, celery_worker)
    assert record.status == TaskStatus.SUCCESSFUL, record.error + celery_worker.logs()
    assert record.started_at is not None and record.finished_at is not None
    assert record.executor  # claimed by the execution that wrote
    assert record.duplicates == 0
    # The worker's report came from the worker: Celery ran the task, on W0, and stored its
    # success under the recorded id.
    result = AsyncResult(record.result_id, app=celery_app(redis_server.url))
    wait_until(lambda: result.state == "SUCCESS", what="Celery to store the task's result")
    assert (result.name, result.worker) == (
        CELERY_NAME.format(record.task_path),
        worker.hostname,
    )
    # The task's fenced write committed, under its run's fence, once.
    assert writes(CELERY_FENCED_WRITE) == [run.fence]
    assert worker.proc.poll() is None, worker.log()


@pytest.mark.xfail(strict=True, reason=FENNEL_BASE_EXCEPTIONS)
def test_a_celery_message_delivered_again_after_it_wrote_writes_nothing_and_counts_a_duplicate(
    celery_env, celery_worker, redis_server
):
    """The same message again: Celery's own ``send_task`` of the task's registered name,
    with its arguments, under the id it was first sent with (what a broker's redelivery
    looks like to a worker). The second execution is refused by its fence."""
    prepare(CELERY_FENCED_WRITE)
    worker = celery_worker("W0")
    runner = run_jobs(celery_env, CELERY_FENCED_WRITE)
    assert runner.returncode == 0, runner.stdout + runner.stderr
    run, record = the_run_and_task(CELERY_FENCED_WRITE)
    record = wait_finished(record, celery_worker)
    assert record.status == TaskStatus.SUCCESSFUL, record.error + celery_worker.logs()
    assert record.executor
    assert writes(CELERY_FENCED_WRITE) == [run.fence]

    app = celery_app(redis_server.url)
    first = AsyncResult(record.result_id, app=app)
    wait_until(lambda: first.state == "SUCCESS", what="Celery to store the task's result")
    app.send_task(
        CELERY_NAME.format(record.task_path),
        args=record.call["args"],
        kwargs=record.call["kwargs"],
        task_id=record.result_id,
        queue="default",
    )

    def redelivered() -> bool:
        record.refresh_from_db()
        wrote_again = len(writes(CELERY_FENCED_WRITE)) > 1
        return record.duplicates > 0 or wrote_again or worker.proc.poll() is not None

    wait_until(
        redelivered,
        what="the Celery worker to run the task again and report it",
        diagnostics=celery_worker.logs,
    )
    # The second execution raised DuplicateDelivery in fenced_atomic(), before writing, and
    # reported its end: the record is the first execution's, successful, the second counted
    # as a duplicate.
    assert writes(CELERY_FENCED_WRITE) == [run.fence]
    assert worker.proc.poll() is None, worker.log()
    assert (record.status, record.duplicates, record.error) == (TaskStatus.SUCCESSFUL, 1, "")
    # Celery keeps the first execution's success under the id (its result backend does not
    # overwrite a success).
    assert AsyncResult(record.result_id, app=app).state == "SUCCESS"
    assert TaskDelivery.objects.filter(task_id=record.pk).count() == 1


def test_a_task_left_pending_by_a_runner_killed_in_the_hand_over_is_relayed_to_celery_once(
    celery_env, celery_worker, redis_server, tmp_path
):
    marker = tmp_path / "kill-on-enqueue"
    marker.touch()
    env = {**celery_env, **GRACE, KILL_MARKER_ENV: str(marker)}
    prepare(CELERY_FAULTY_WRITE)
    worker = celery_worker("W0")

    crashed = run_jobs(env, CELERY_FAULTY_WRITE)
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr
    run, record = the_run_and_task(CELERY_FAULTY_WRITE)
    # Committed with its run's transaction (an outbox row, with its call), never handed to
    # Celery: the runner died in the backend's enqueue, before anything reached the broker.
    assert (record.status, record.result_id, record.handovers) == (TaskStatus.PENDING, "", 1)
    assert record.call == {"args": [CELERY_FAULTY_WRITE, run.fence], "kwargs": {}}
    assert not TaskDelivery.objects.filter(task_id=record.pk).exists()
    marker.unlink()

    # A restarted runner's relay hands it over once its grace has passed; the slot itself is
    # not run a second time.
    wait_lease_expired(CELERY_FAULTY_WRITE, diagnostics=celery_worker.logs)
    wait_until(lambda: clock.now() > record.handover_after, what="the hand-over's grace to pass")
    restarted = run_jobs(env, CELERY_FAULTY_WRITE)
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    assert JobRun.objects.filter(job=CELERY_FAULTY_WRITE).count() == 1
    assert RunTask.objects.filter(job=CELERY_FAULTY_WRITE).count() == 1

    record = wait_finished(record, celery_worker)
    assert (record.status, record.handovers) == (TaskStatus.SUCCESSFUL, 2), record.error
    (delivery,) = TaskDelivery.objects.filter(task_id=record.pk)
    assert (delivery.backend, delivery.result_id) == ("celery_faulty", record.result_id)
    result = AsyncResult(record.result_id, app=celery_app(redis_server.url))
    wait_until(lambda: result.state == "SUCCESS", what="Celery to store the task's result")
    assert result.worker == worker.hostname
    # Its fenced write, once, under its run's fence.
    assert writes(CELERY_FAULTY_WRITE) == [run.fence]
    assert worker.proc.poll() is None, worker.log()
