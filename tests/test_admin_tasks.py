"""The admin shows the tasks a run enqueued: one by one on the run's page, counted by status
in the run list (one query per page, whatever the number of runs). Driven through Django's
test client; runs come from loop.tick, their tasks' rows are written directly."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_fencedjobs import job
from django_fencedjobs.admin import runs as runs_admin
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.loop import tick
from django_fencedjobs.models import JobLease, JobRun, RunTask, TaskStatus
from django_fencedjobs.registry import registry

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
SLOT = T0 + timedelta(minutes=15)
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "tests/taskapp/tasks.py", line 30, in fail\n'
    "    raise RuntimeError(message)\n"
    "RuntimeError: <b>upstream</b> said no\n"
)


@pytest.fixture
def declared():
    """t.digest (Europe/Berlin) and t.plain, every 15 minutes, seen at 09:00 UTC."""
    with (
        registry.isolated(),
        override_settings(FENCEDJOBS={"CLOCK": "django_fencedjobs.clock.fake_clock"}),
    ):
        job("*/15 * * * *", name="t.digest", timezone="Europe/Berlin")(lambda run: None)
        job("*/15 * * * *", name="t.plain")(lambda run: None)
        fake_clock.set(T0)
        tick()
        yield


def run_slot(at: datetime) -> dict[str, JobRun]:
    fake_clock.set(at)
    return {record.job: record for record in tick().runs}


def add_task(record: JobRun, status: str, n: int, **fields) -> RunTask:
    return RunTask.objects.create(
        run=record,
        job=record.job,
        fence=record.fence,
        task_path=fields.pop("task_path", "tests.taskapp.tasks.record_write"),
        backend="default",
        result_id=f"result-{record.pk}-{n}",
        status=status,
        **fields,
    )


@pytest.fixture
def superuser_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    return client


def run_page(record: JobRun) -> str:
    return reverse("admin:fencedjobs_jobrun_change", args=[record.pk])


def task_rows(html: str) -> list[list[str]]:
    """The cells of the run page's tasks table, tags stripped (a ``<wbr>`` without a
    trace), whitespace collapsed."""
    table = re.search(r'<table class="fj-tasks">.*?</table>', html, flags=re.S)
    assert table is not None, "no tasks table on the page"
    rows = re.findall(r"<tr>(.*?)</tr>", table.group(0), flags=re.S)
    return [
        [
            " ".join(re.sub(r"<[^>]+>", " ", cell.replace("<wbr>", "")).split())
            for cell in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, flags=re.S)
        ]
        for row in rows
    ]


def test_a_runs_page_lists_its_tasks_read_only_with_their_times_and_error(
    declared, superuser_client
):
    record = run_slot(SLOT)["t.digest"]
    add_task(
        record,
        TaskStatus.FAILED,
        1,
        task_path="tests.taskapp.tasks.fail",
        enqueued_at=SLOT,
        started_at=SLOT + timedelta(seconds=1),
        finished_at=SLOT + timedelta(seconds=2),
        error=TRACEBACK,
    )
    add_task(record, TaskStatus.READY, 2, enqueued_at=SLOT)
    response = superuser_client.get(run_page(record))
    assert response.status_code == 200
    html = response.content.decode()
    header, failed, ready = task_rows(html)
    assert header == [
        "task",
        "backend",
        "result id",
        "status",
        "enqueued",
        "started",
        "finished",
        "error",
    ]
    assert failed[:7] == [
        "tests.taskapp.tasks.fail",
        "default",
        f"result-{record.pk}-1",
        "failed",
        # In the job's zone, and below it in UTC; on the run's slot's day, as times.
        "10:15:00 09:15:00 UTC",
        "10:15:01 09:15:01 UTC",
        "10:15:02 09:15:02 UTC",
    ]
    # The exception's line, and its traceback a click away.
    error = failed[7]
    assert error.startswith("RuntimeError: &lt;b&gt;upstream&lt;/b&gt; said no traceback")
    assert "Traceback (most recent call last):" in error
    assert ready[2:5] == [
        f"result-{record.pk}-2",
        "enqueued",
        "10:15:00 09:15:00 UTC",
    ]
    assert ready[5:] == ["-", "-", "-"]
    assert "<b>upstream</b>" not in html  # the error is text, escaped
    assert 'name="_save"' not in html  # nothing is editable


def test_a_run_without_tasks_says_so_and_a_viewer_sees_the_tasks_without_a_task_permission(
    declared,
):
    runs = run_slot(SLOT)
    add_task(runs["t.digest"], TaskStatus.SUCCESSFUL, 1)
    user = User.objects.create_user("viewer", "viewer@example.com", "pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="view_jobrun"))
    client = Client()
    client.force_login(user)

    html = client.get(run_page(runs["t.digest"])).content.decode()
    (_, task) = task_rows(html)
    assert task[:4] == [
        "tests.taskapp.tasks.record_write",
        "default",
        f"result-{runs['t.digest'].pk}-1",
        "successful",
    ]
    html = client.get(run_page(runs["t.plain"])).content.decode()
    assert 'class="fj-tasks"' not in html
    assert re.search(r'field-tasks_table">.*?<div class="readonly">-</div>', html, flags=re.S)


def test_a_run_with_more_tasks_than_shown_says_how_many_more(
    declared, superuser_client, monkeypatch
):
    monkeypatch.setattr(runs_admin, "TASKS_SHOWN", 2)
    record = run_slot(SLOT)["t.plain"]
    for n in range(5):
        add_task(record, TaskStatus.READY, n)
    html = superuser_client.get(run_page(record)).content.decode()
    assert len(task_rows(html)) == 1 + 2
    assert "… and 3 more" in html


def tasks_column(html: str) -> list[str]:
    return [
        " ".join(cell.split())
        for cell in re.findall(r'<td class="field-tasks_summary">(.*?)</td>', html, flags=re.S)
    ]


def test_the_run_list_counts_each_runs_tasks_by_status(declared, superuser_client):
    first = run_slot(SLOT)
    add_task(first["t.digest"], TaskStatus.SUCCESSFUL, 1)
    add_task(first["t.digest"], TaskStatus.SUCCESSFUL, 2)
    add_task(first["t.digest"], TaskStatus.FAILED, 3, error=TRACEBACK)
    add_task(first["t.plain"], TaskStatus.PENDING, 1)
    second = run_slot(SLOT + timedelta(minutes=15))
    add_task(second["t.digest"], TaskStatus.RUNNING, 1)
    add_task(second["t.digest"], TaskStatus.READY, 2)
    html = superuser_client.get(reverse("admin:fencedjobs_jobrun_changelist")).content.decode()
    assert 'class="column-tasks_summary"' in html
    summaries = tasks_column(html)
    assert sorted(summaries) == sorted(
        [
            "3 tasks: 2 ok, 1 failed",
            "1 task: 1 not dispatched",
            "2 tasks: 1 running, 1 enqueued",
            "-",  # t.plain's second run enqueued none
        ]
    )


def test_the_tasks_column_costs_one_query_per_page_whatever_the_number_of_runs(
    declared, superuser_client
):
    url = reverse("admin:fencedjobs_jobrun_changelist")

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert superuser_client.get(url).status_code == 200
        return len(captured)

    for record in run_slot(SLOT).values():
        add_task(record, TaskStatus.SUCCESSFUL, 1)
    few = queries()
    for minutes in range(30, 30 + 15 * 10, 15):
        for record in run_slot(T0 + timedelta(minutes=minutes)).values():
            add_task(record, TaskStatus.SUCCESSFUL, 1)
            add_task(record, TaskStatus.FAILED, 2)
    assert JobRun.objects.count() == 22
    many = queries()
    assert few == many
    html = superuser_client.get(url).content.decode()
    assert tasks_column(html).count("2 tasks: 1 ok, 1 failed") == 20


def test_a_jobs_page_shows_its_oldest_unfinished_tasks_and_latest_task_outcome(
    declared, superuser_client
):
    first = run_slot(SLOT)
    add_task(first["t.digest"], TaskStatus.SUCCESSFUL, 1)
    add_task(first["t.digest"], TaskStatus.FAILED, 2, error=TRACEBACK)
    add_task(first["t.digest"], TaskStatus.RUNNING, 3, started_at=SLOT)
    add_task(first["t.digest"], TaskStatus.PENDING, 4)
    second = run_slot(SLOT + timedelta(minutes=15))
    add_task(second["t.digest"], TaskStatus.READY, 1)

    def job_page(name: str) -> str:
        pk = JobLease.objects.get(name=name).pk
        url = reverse("admin:fencedjobs_joblease_change", args=[pk])
        return superuser_client.get(url).content.decode()

    def field(html: str, name: str) -> str:
        found = re.search(rf'field-{name}">.*?<div class="readonly">(.*?)</div>', html, flags=re.S)
        assert found is not None, f"no {name} on the page"
        return " ".join(re.sub(r"<[^>]+>", " ", found.group(1)).split())

    html = job_page("t.digest")
    assert 'class="fieldset-heading">Tasks</h2>' in html
    assert field(html, "tasks_unfinished") == (
        "2026-11-29 10:15:00 Europe/Berlin 2026-11-29 09:15:00 UTC : 1 pending, 1 running"
    )
    assert reverse("admin:fencedjobs_jobrun_change", args=[first["t.digest"].pk]) in html
    assert field(html, "tasks_last_outcome") == (
        "2026-11-29 10:15:00 Europe/Berlin 2026-11-29 09:15:00 UTC : 1 successful, 1 failed "
        "tests.taskapp.tasks.record_write: RuntimeError: &lt;b&gt;upstream&lt;/b&gt; said no"
    )
    assert "field-tasks_unfinished" not in job_page("t.plain")
