"""Sentry Crons and scheduled tasks: the check-in of a run that enqueued tasks is not ``ok``
until its tasks have finished, and the worker that finishes the last one closes it, with
the id of the run's ``in_progress`` check-in (derived from the run alone). Envelopes are
captured by a transport (tests/test_sentry.py); the tasks run in django-tasks-db's worker,
in this process."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest

from django_fencedjobs import fenced_atomic, job, signals
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.integrations.sentry import check_in_id
from django_fencedjobs.loop import tick
from django_fencedjobs.models import JobRun, Outcome, RunTask, TaskStatus
from tests.conftest import JOBS_T0 as T0
from tests.taskapp import tasks
from tests.test_sentry import CapturingTransport
from tests.test_tasks import run_worker

pytestmark = pytest.mark.django_db(transaction=True)

HOUR = timedelta(hours=1)


def run_slot() -> JobRun:
    """Tick at 09:00 (the job is seen), then at its 10:00 slot: the run recorded."""
    tick()
    fake_clock.set(T0 + HOUR)
    (record,) = tick().runs
    return record


def statuses(sentry: CapturingTransport) -> list[str]:
    return [check_in["status"] for check_in in sentry.check_ins()]


def test_a_run_with_unfinished_tasks_stays_in_progress_until_the_worker_finishes_them(jobs, sentry):
    @job("0 * * * *", name="t.fan_out")
    def fan_out(run):
        run.enqueue(tasks.record_write, "t.fan_out", 1)
        run.enqueue(tasks.record_write, "t.fan_out", 2)

    record = run_slot()
    assert record.outcome == Outcome.SUCCEEDED, record.error
    assert statuses(sentry) == ["in_progress"]  # its tasks wait for a worker

    run_worker()
    started, finished = sentry.check_ins()
    assert finished["status"] == "ok"
    assert started["check_in_id"] == finished["check_in_id"] == check_in_id(record)
    assert finished["monitor_slug"] == "t-fan_out"
    assert finished["monitor_config"] == started["monitor_config"]
    last = max(RunTask.objects.values_list("finished_at", flat=True))
    assert finished["duration"] == (last - record.started_at).total_seconds()


def test_a_failed_task_closes_the_runs_check_in_as_error(jobs, sentry):
    @job("0 * * * *", name="t.broken_task")
    def broken_task(run):
        run.enqueue(tasks.record_write, "t.broken_task", 1)
        run.enqueue(tasks.fail, "the task broke")

    record = run_slot()
    assert record.outcome == Outcome.SUCCEEDED, record.error
    run_worker()
    assert statuses(sentry) == ["in_progress", "error"]
    assert sentry.check_ins()[1]["check_in_id"] == check_in_id(record)


def test_tasks_that_finish_before_the_run_ends_are_closed_by_the_runner_once(jobs, sentry):
    @job("0 * * * *", name="t.quick_worker")
    def quick_worker(run):
        with fenced_atomic():
            run.enqueue(tasks.fail, "broke before the run ended")
        run_worker()  # a worker takes the task and fails it while the run still runs

    record = run_slot()
    assert record.outcome == Outcome.SUCCEEDED, record.error
    assert RunTask.objects.get().status == TaskStatus.FAILED
    assert statuses(sentry) == ["in_progress", "error"]
    run_worker()
    assert len(sentry.check_ins()) == 2


def test_on_the_immediate_backend_the_runner_closes_the_check_in_once(jobs, sentry):
    @job("0 * * * *", name="t.immediate")
    def immediate(run):
        with fenced_atomic():
            run.enqueue(tasks.immediate_write, "t.immediate", 1)

    record = run_slot()
    assert record.outcome == Outcome.SUCCEEDED, record.error
    assert RunTask.objects.get().status == TaskStatus.SUCCESSFUL
    started, finished = sentry.check_ins()
    assert (started["status"], finished["status"]) == ("in_progress", "ok")
    assert finished["check_in_id"] == check_in_id(record)


def test_a_run_that_fails_after_enqueueing_is_closed_as_error_at_once(jobs, sentry):
    @job("0 * * * *", name="t.failed_run")
    def failed_run(run):
        with fenced_atomic():
            run.enqueue(tasks.record_write, "t.failed_run", 1)
        raise RuntimeError("the handler failed after its enqueue committed")

    record = run_slot()
    assert record.outcome == Outcome.FAILED
    assert statuses(sentry) == ["in_progress", "error"]
    run_worker()  # its task runs and succeeds: the check-in was closed already
    assert RunTask.objects.get().status == TaskStatus.SUCCESSFUL
    assert statuses(sentry) == ["in_progress", "error"]


def test_a_worker_that_does_not_declare_the_job_closes_the_check_in_without_a_config(jobs, sentry):
    """As a worker process does that imports no jobs module: the record read from the
    database is all it has, and the check-in id comes from it."""

    @job("0 * * * *", name="t.elsewhere")
    def elsewhere(run):
        run.enqueue(tasks.record_write, "t.elsewhere", 1)

    record = run_slot()
    RunTask.objects.update(status=TaskStatus.SUCCESSFUL, finished_at=record.finished_at)
    stored = JobRun.objects.get(pk=record.pk)
    signals.send(signals.run_tasks_finished, job=None, record=stored, failed=False)
    started, finished = sentry.check_ins()
    assert (finished["status"], finished["check_in_id"]) == ("ok", started["check_in_id"])
    assert "monitor_config" not in finished
    assert finished["monitor_slug"] == "t-elsewhere"


def test_the_check_in_id_is_the_runs_alone():
    run = JobRun(pk=7, job="t.id", scheduled_for=T0)
    same = JobRun(pk=7, job="t.id", scheduled_for=T0, outcome=Outcome.SUCCEEDED)
    assert check_in_id(run) == check_in_id(same)
    # A UUID 5 written as Sentry's SDK writes check-in ids (32 lowercase hex digits, no
    # dashes), and the same in every version: a runner and a worker of another release
    # close the same check-in.
    assert re.fullmatch(r"[0-9a-f]{32}", check_in_id(run))
    assert uuid.UUID(check_in_id(run)).version == 5
    assert check_in_id(run) == "d6a84392aaf45532aec75b32705a3a66"
    assert check_in_id(run) != check_in_id(JobRun(pk=8, job="t.id", scheduled_for=T0))
    assert check_in_id(run) != check_in_id(JobRun(pk=7, job="t.other", scheduled_for=T0))
