"""Tasks scheduled in settings, ``FENCEDJOBS["TASK_SCHEDULE"]``: each entry is the job
``schedule_task`` declares in a ``jobs.py`` (the same path: once per slot, fenced, its
record), declared by the app at start-up, and checked by ``manage.py check`` with the ids of
``@job`` (an entry whose path names no task: ``fencedjobs.E017``)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from django_tasks_db.models import DBTaskResult

from django_fencedjobs import clock, job
from django_fencedjobs.declared import sync as sync_rows
from django_fencedjobs.integrations.tasks import schedule_settings
from django_fencedjobs.loop import tick
from django_fencedjobs.models import FINISHED_TASK, JobRun, Outcome, RunTask, TaskStatus
from django_fencedjobs.registry import registry
from tests.conftest import JOBS_T0 as T0
from tests.faults.harness import make_due, wait_until
from tests.test_checks import manage, reported
from tests.test_tasks import run_slot, run_worker
from tests.test_tasks_rq import run_jobs
from tests.testapp.models import Write

pytestmark = pytest.mark.django_db(transaction=True)

HOUR = timedelta(hours=1)
FAKE_CLOCK = "django_fencedjobs.clock.fake_clock"
RECORD_WRITE = "tests.taskapp.tasks.record_write"


def test_a_task_in_the_settings_schedule_is_enqueued_once_per_slot_and_runs_fenced(jobs):
    schedule = {
        RECORD_WRITE: {
            "cron": "0 * * * *",
            "args": ["t.settings"],
            "kwargs": {"seq": 7},
            "timeout": timedelta(minutes=10),
        },
        "tests.taskapp.tasks.plain_write": "30 3 * * 1-5",
    }
    with override_settings(FENCEDJOBS={"CLOCK": FAKE_CLOCK, "TASK_SCHEDULE": schedule}):
        hourly, weekdays = schedule_settings()
        assert (hourly.name, hourly.valid) == (RECORD_WRITE, True)
        assert hourly.timeout == timedelta(minutes=10)
        assert (weekdays.name, weekdays.cron) == ("tests.taskapp.tasks.plain_write", "30 3 * * 1-5")
        tick()  # the jobs are seen: the hourly one's first slot is the next hour
        for slot in (T0 + HOUR, T0 + 2 * HOUR, T0 + 3 * HOUR):
            runs = run_slot(slot + timedelta(seconds=1))
            assert [(r.job, r.outcome) for r in runs] == [(RECORD_WRITE, Outcome.SUCCEEDED)]
            # The same slot, ticked again (another runner, a restart): nothing more.
            assert run_slot(slot + timedelta(minutes=20)) == []
            run_worker()  # before the next slot's run: a later run's fence refuses it

    results = list(DBTaskResult.objects.order_by("enqueued_at"))
    assert [r.args_kwargs for r in results] == [{"args": ["t.settings"], "kwargs": {"seq": 7}}] * 3
    records = list(RunTask.objects.select_related("run").order_by("run__scheduled_for"))
    assert [r.run.scheduled_for for r in records] == [T0 + HOUR, T0 + 2 * HOUR, T0 + 3 * HOUR]
    assert {(r.job, r.fence, r.status) for r in records} == {
        (RECORD_WRITE, r.run.fence, TaskStatus.SUCCESSFUL) for r in records
    }
    # Each task's fenced write committed once, under its own run's fence.
    assert list(Write.objects.values_list("job", "seq")) == [("t.settings", 7)] * 3


def test_the_app_declares_the_settings_schedule_and_a_slot_runs_once_across_runners(child_env):
    schedule = {RECORD_WRITE: {"every": HOUR, "args": ["t.started", 1]}}
    with registry.isolated(), override_settings(FENCEDJOBS={"TASK_SCHEDULE": schedule}):
        sync_rows(schedule_settings(), clock.now())
    make_due(RECORD_WRITE)

    fencedjobs = _expression({"TASK_SCHEDULE": schedule})
    for _ in range(2):  # two runner processes, one after the other, at the same slot
        result = manage(
            "runjobs",
            "--once",
            "--job",
            RECORD_WRITE,
            base=child_env,
            FENCEDJOBS_CHECK_SETTINGS=fencedjobs,
        )
        assert result.returncode == 0, result.stdout + result.stderr
    (run,) = JobRun.objects.filter(job=RECORD_WRITE)
    assert run.outcome == Outcome.SUCCEEDED, run.error
    run_worker()
    (record,) = RunTask.objects.all()
    assert (record.run_id, record.status) == (run.pk, TaskStatus.SUCCESSFUL)
    assert list(Write.objects.values_list("job", "seq")) == [("t.started", 1)]


def test_a_task_in_the_settings_schedule_runs_on_rq_once_under_its_runs_fence(rq_env, rq_worker):
    # The runner's settings (tests.rq_settings) schedule tests.rq_tasks.fenced_write as
    # "rq.scheduled"; its lease row is made due here, under that name.
    name = "rq.scheduled"
    with registry.isolated():
        sync_rows([job(every=HOUR, name=name)(lambda run: None).job], clock.now())
    make_due(name)
    rq_worker("W0")

    env = {**rq_env, "FENCEDJOBS_TEST_RQ_SCHEDULE": "1"}
    for _ in range(2):  # two runner processes, one after the other, at the same slot
        runner = run_jobs(env, name)
        assert runner.returncode == 0, runner.stdout + runner.stderr
    (run,) = JobRun.objects.filter(job=name)
    assert run.outcome == Outcome.SUCCEEDED, run.error
    (record,) = RunTask.objects.filter(run=run)
    assert (record.backend, record.task_path) == ("rq", "tests.rq_tasks.fenced_write")
    wait_until(
        lambda: RunTask.objects.filter(pk=record.pk, status__in=FINISHED_TASK).exists(),
        what="the RQ worker to run the task and report its end",
        diagnostics=rq_worker.logs,
    )
    record.refresh_from_db()
    assert record.status == TaskStatus.SUCCESSFUL, record.error + rq_worker.logs()
    assert list(Write.objects.values_list("job", "seq")) == [("rq.scheduled", 1)]


def test_a_wrong_settings_schedule_entry_is_refused_by_check_with_the_id_of_its_mistake():
    schedule = {
        "tests.taskapp.tasks.no_such_task": "0 * * * *",
        "tests.no_such_module.send": "0 * * * *",
        "tests.taskapp.tasks.NOTES": "0 * * * *",
        "tests.taskapp.tasks.plain_write": "61 * * * *",
        RECORD_WRITE: {"cron": "0 8 * * *", "timezone": "Mars/Olympus_Mons"},
        "tests.taskapp.tasks.fail": {"cron": "0 8 * * *", "retry": 3},
        "tests.taskapp.tasks.immediate_write": {"every": HOUR, "timeout": 30},
    }
    result = manage("check", FENCEDJOBS_CHECK_SETTINGS=_expression({"TASK_SCHEDULE": schedule}))
    assert result.returncode == 1, result.stderr
    out = result.stderr
    assert set(reported(out, "fencedjobs.E017")) == {
        "tests.taskapp.tasks.no_such_task",
        "tests.no_such_module.send",
        "tests.taskapp.tasks.NOTES",
    }
    assert (
        "'tests.taskapp.tasks.no_such_task'"
        in reported(out, "fencedjobs.E017")["tests.taskapp.tasks.no_such_task"]
    )
    assert "not a django.tasks task" in out
    assert set(reported(out, "fencedjobs.E001")) == {"tests.taskapp.tasks.plain_write"}
    assert "61 * * * *" in out
    assert set(reported(out, "fencedjobs.E002")) == {RECORD_WRITE}
    assert set(reported(out, "fencedjobs.E013")) == {
        "tests.taskapp.tasks.fail",
        "tests.taskapp.tasks.immediate_write",
    }
    assert "unknown option(s) retry" in out
    assert "timeout must be" in out


def test_a_settings_schedule_that_is_not_a_dict_of_paths_is_a_settings_error():
    result = manage(
        "check", FENCEDJOBS_CHECK_SETTINGS='{"TASK_SCHEDULE": ["tests.taskapp.tasks.fail"]}'
    )
    assert result.returncode == 1
    assert "fencedjobs.E014" in result.stderr and "TASK_SCHEDULE" in result.stderr


def test_a_valid_settings_schedule_passes_check_and_is_listed():
    schedule = {
        RECORD_WRITE: {"cron": "0 8 * * *", "timezone": "Europe/Paris", "kwargs": {"seq": 1}},
        "tests.taskapp.tasks.plain_write": "30 3 * * 1-5",
    }
    fencedjobs = _expression({"TASK_SCHEDULE": schedule})
    check = manage("check", FENCEDJOBS_CHECK_SETTINGS=fencedjobs)
    assert check.returncode == 0, check.stderr
    listed = manage("runjobs", "--list", FENCEDJOBS_CHECK_SETTINGS=fencedjobs)
    assert listed.returncode == 0, listed.stderr
    names = [line for line in listed.stdout.splitlines() if not line.startswith(" ")]
    assert RECORD_WRITE in names and "tests.taskapp.tasks.plain_write" in names
    assert "(Europe/Paris)" in listed.stdout


def _expression(value: object) -> str:
    """``value`` as tests.check_settings evaluates ``FENCEDJOBS_CHECK_SETTINGS``."""
    return repr(value).replace("datetime.timedelta", "timedelta")
