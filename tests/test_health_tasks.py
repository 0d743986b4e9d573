"""Absence covers the workers: the tasks a job's runs enqueued make it late when they have
not finished by their slot's deadline, and failing when the latest task outcome is a
failure. Runs come from loop.tick (fake clock); the tasks' rows are written directly, in
the states the runner and the workers leave them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_fencedjobs import job
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.health import Severity, State, all_health, job_health
from django_fencedjobs.integrations.tasks import schedule_task
from django_fencedjobs.loop import tick
from django_fencedjobs.models import JobLease, JobRun, RunTask, TaskStatus
from tests.taskapp.tasks import record_write

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)  # where the `jobs` fixture sets the fake clock
SLOT = T0 + timedelta(minutes=15)
# "*/15 * * * *" with no declared timeout: half the interval, 7.5 minutes; grace 5 minutes.
DEADLINE_AFTER_SLOT = timedelta(minutes=7, seconds=30) + timedelta(minutes=5)
TASKS_DUE = SLOT + DEADLINE_AFTER_SLOT  # 09:27:30
SECOND = timedelta(seconds=1)
PATH = "tests.taskapp.tasks.record_write"
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "tests/taskapp/tasks.py", line 30, in fail\n'
    "    raise RuntimeError(message)\n"
    "RuntimeError: upstream said no\n"
)


def quarterly(name: str) -> None:
    """A job every 15 minutes whose run succeeds (its tasks are added by the test)."""
    job("*/15 * * * *", name=name)(lambda run: None)


def run_at(name: str, at: datetime) -> JobRun:
    """Run ``name`` for the slot ``at`` (it succeeds) and return its record."""
    fake_clock.set(at)
    (record,) = tick([name]).runs
    assert record.outcome == "succeeded"
    return record


def add_task(record: JobRun, status: str, **fields) -> RunTask:
    return RunTask.objects.create(
        run=record,
        job=record.job,
        fence=record.fence,
        task_path=fields.pop("task_path", PATH),
        backend="default",
        result_id=fields.pop("result_id", f"{record.pk}-{RunTask.objects.count()}"),
        status=status,
        enqueued_at=record.started_at,
        **fields,
    )


@pytest.fixture
def slot_run(jobs) -> JobRun:
    """h.work, declared every 15 minutes, succeeded at its 09:15 slot: the run whose tasks
    each test sets. Its own next deadline (09:30 + 12:30) is far past the tasks' (09:27:30)."""
    quarterly("h.work")
    tick()  # the job is seen at 09:00: first slot 09:15
    return run_at("h.work", SLOT)


@pytest.mark.parametrize(
    ("status", "meaning"),
    [
        (
            TaskStatus.PENDING,
            "1 pending on backend 'default': not taken by the task backend yet (it refused "
            "the hand-over, or the runner stopped before it; a runner's relay hands it over)",
        ),
        (
            TaskStatus.READY,
            "1 ready on backend 'default': not started by any worker (is a worker running for "
            "its queue?)",
        ),
    ],
)
def test_an_unfinished_task_makes_the_job_late_strictly_after_its_slots_deadline(
    slot_run, status, meaning
):
    add_task(slot_run, status)
    at_deadline = job_health("h.work", now=TASKS_DUE)
    assert at_deadline.state == State.OK
    assert at_deadline.tasks is not None and at_deadline.tasks.unfinished is not None
    assert at_deadline.tasks.unfinished.scheduled_for == SLOT

    late = job_health("h.work", now=TASKS_DUE + SECOND)
    assert (late.state, late.severity) == (State.LATE, Severity.CRITICAL)
    assert late.reason == (
        f"1 task of the slot 2026-11-29 09:15:00 UTC has not finished by 09:27:30: {meaning}"
    )


def test_a_running_task_past_the_deadline_says_when_it_started_and_that_its_worker_may_have_died(
    slot_run,
):
    add_task(slot_run, TaskStatus.RUNNING, started_at=SLOT + timedelta(seconds=2))
    late = job_health("h.work", now=TASKS_DUE + SECOND)
    assert late.state == State.LATE
    assert late.reason == (
        "1 task of the slot 2026-11-29 09:15:00 UTC has not finished by 09:27:30: 1 running on "
        "backend 'default': started at 09:15:02 and not finished (its worker may have died)"
    )


def test_the_late_reason_counts_the_oldest_unfinished_slots_tasks_by_status(slot_run):
    add_task(slot_run, TaskStatus.PENDING)
    add_task(slot_run, TaskStatus.RUNNING, started_at=SLOT + timedelta(seconds=9))
    add_task(slot_run, TaskStatus.RUNNING, started_at=SLOT + timedelta(seconds=4))
    add_task(slot_run, TaskStatus.SUCCESSFUL, finished_at=SLOT + timedelta(seconds=5))
    later = run_at("h.work", SLOT + timedelta(minutes=15))
    add_task(later, TaskStatus.READY)  # a later slot's unfinished task: not yet due

    late = job_health("h.work", now=TASKS_DUE + SECOND)
    assert late.state == State.LATE
    assert late.reason == (
        "3 tasks of the slot 2026-11-29 09:15:00 UTC have not finished by 09:27:30: "
        "1 pending on backend 'default': not taken by the task backend yet (it refused the "
        "hand-over, or the runner stopped before it; a runner's relay hands it over); 2 running "
        "on backend 'default': the first started at 09:15:04 and not finished (their worker "
        "may have died)"
    )
    unfinished = late.tasks.unfinished
    assert (unfinished.run_pk, unfinished.pending, unfinished.running) == (slot_run.pk, 1, 2)
    assert (unfinished.successful, unfinished.unfinished, unfinished.total) == (1, 3, 4)


def test_tasks_that_finished_leave_the_job_ok(slot_run):
    add_task(slot_run, TaskStatus.SUCCESSFUL, finished_at=SLOT + timedelta(seconds=5))
    add_task(slot_run, TaskStatus.SUCCESSFUL, finished_at=SLOT + timedelta(seconds=6))
    health = job_health("h.work", now=TASKS_DUE + timedelta(minutes=10))
    assert health.state == State.OK
    assert health.tasks.unfinished is None
    assert (health.tasks.last_outcome.successful, health.tasks.last_outcome.failed) == (2, 0)


def test_a_job_whose_latest_task_outcome_is_a_failure_is_failing_with_the_task_and_its_error(
    slot_run,
):
    add_task(slot_run, TaskStatus.SUCCESSFUL, finished_at=SLOT + timedelta(seconds=5))
    add_task(
        slot_run,
        TaskStatus.FAILED,
        task_path="tests.taskapp.tasks.fail",
        finished_at=SLOT + timedelta(seconds=6),
        error=TRACEBACK,
    )
    failing = job_health("h.work", now=SLOT + timedelta(minutes=1))
    assert (failing.state, failing.severity) == (State.FAILING, Severity.CRITICAL)
    assert failing.reason == (
        "the latest task outcome is a failure: 1 of 2 tasks of the slot 2026-11-29 09:15:00 "
        "UTC failed; tests.taskapp.tasks.fail: RuntimeError: upstream said no"
    )
    outcome = failing.tasks.last_outcome
    assert (outcome.failed_task, outcome.error_excerpt) == (
        "tests.taskapp.tasks.fail",
        "RuntimeError: upstream said no",
    )


def test_a_later_slot_whose_tasks_all_succeeded_clears_a_task_failure(slot_run):
    add_task(slot_run, TaskStatus.FAILED, finished_at=SLOT, error=TRACEBACK)
    later = run_at("h.work", SLOT + timedelta(minutes=15))
    add_task(later, TaskStatus.SUCCESSFUL, finished_at=later.started_at)
    assert job_health("h.work", now=later.started_at + SECOND).state == State.OK

    latest = run_at("h.work", SLOT + timedelta(minutes=30))
    add_task(latest, TaskStatus.FAILED, finished_at=latest.started_at, error=TRACEBACK)
    failing = job_health("h.work", now=latest.started_at + SECOND)
    assert failing.state == State.FAILING
    assert "its task of the slot 2026-11-29 09:45:00 UTC failed" in failing.reason


def test_unfinished_tasks_past_their_deadline_outrank_a_task_failure(slot_run):
    add_task(slot_run, TaskStatus.FAILED, finished_at=SLOT, error=TRACEBACK)
    add_task(slot_run, TaskStatus.READY)
    assert job_health("h.work", now=TASKS_DUE).state == State.FAILING
    assert job_health("h.work", now=TASKS_DUE + SECOND).state == State.LATE


def test_the_runs_own_late_outranks_its_tasks(slot_run):
    add_task(slot_run, TaskStatus.READY)
    run_deadline = SLOT + timedelta(minutes=15) + DEADLINE_AFTER_SLOT
    late = job_health("h.work", now=run_deadline + SECOND)
    assert late.state == State.LATE
    assert late.reason.startswith("no successful run since 2026-11-29 09:15:00 UTC")


def test_a_scheduled_task_no_worker_takes_makes_the_job_late(jobs):
    """End to end: schedule_task on django-tasks-db's backend, and no db_worker running."""
    schedule_task(record_write, "*/15 * * * *", name="h.digest", args=["h.digest", 1])
    tick()
    fake_clock.set(SLOT)
    (record,) = tick(["h.digest"]).runs
    assert record.outcome == "succeeded"
    (task,) = RunTask.objects.filter(run=record)
    assert task.status == TaskStatus.READY

    assert job_health("h.digest", now=TASKS_DUE).state == State.OK
    late = job_health("h.digest", now=TASKS_DUE + SECOND)
    assert late.state == State.LATE
    assert late.reason.endswith(
        "1 ready on backend 'default', queue 'default': not started by any worker (is a "
        "worker running for its queue?)"
    )


def test_reading_the_tasks_costs_one_query_whatever_the_number_of_jobs(jobs):
    now = SLOT + timedelta(minutes=30)  # past every task's deadline below

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            all_health(now=now)
        return len(captured)

    for n in range(2):
        quarterly(f"h.q{n}")
    tick()
    fake_clock.set(SLOT)
    runs = tick().runs
    without_tasks = queries()  # the lease rows and the latest runs
    for record in runs:
        add_task(record, TaskStatus.READY)
        add_task(record, TaskStatus.FAILED, error=TRACEBACK)
    few = queries()
    for n in range(2, 12):
        quarterly(f"h.q{n}")
    tick()  # the new jobs are seen: their first slot is 09:30
    fake_clock.set(SLOT + timedelta(minutes=15))
    for record in tick().runs:
        add_task(record, TaskStatus.RUNNING, started_at=record.started_at)
        add_task(record, TaskStatus.SUCCESSFUL)
    assert RunTask.objects.count() == 4 + 24
    many = queries()
    assert few == many == without_tasks + 1
    assert {h.state for h in all_health(now=now)} == {State.LATE}


def checkjobs(*args: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("checkjobs", *args, stdout=out, stderr=StringIO())
    except CommandError as exc:
        return exc.returncode, out.getvalue()
    return 0, out.getvalue()


def test_checkjobs_exits_2_for_a_job_late_by_its_tasks_and_reports_them_in_json(slot_run):
    add_task(slot_run, TaskStatus.RUNNING, started_at=SLOT + timedelta(seconds=2))
    fake_clock.set(TASKS_DUE)
    assert checkjobs()[0] == 0

    fake_clock.set(TASKS_DUE + SECOND)
    status, out = checkjobs()
    assert status == 2
    assert "h.work  LATE" in out and "(its worker may have died)" in out

    status, out = checkjobs("--json")
    assert status == 2
    (work,) = json.loads(out)["jobs"]
    assert (work["state"], work["severity"]) == ("late", "critical")
    assert work["tasks"] == {
        "unfinished": {
            "scheduled_for": "2026-11-29T09:15:00+00:00",
            "pending": 0,
            "ready": 0,
            "running": 1,
            "successful": 0,
            "failed": 0,
            "running_since": "2026-11-29T09:15:02+00:00",
            "failed_task": "",
            "error": "",
        },
        "last_outcome": None,
    }


def test_a_job_without_tasks_reports_none(slot_run):
    assert JobLease.objects.filter(name="h.work").exists()
    assert job_health("h.work").tasks is None
    status, out = checkjobs("--json")
    assert status == 0
    assert json.loads(out)["jobs"][0]["tasks"] is None
