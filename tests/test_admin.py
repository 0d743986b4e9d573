"""The admin: jobs with their health, a job's timeline, the run history, and the operations,
with Django permissions respected. Driven through Django's test client; the browser test
(test_admin_browser.py) drives a real Chromium."""

from __future__ import annotations

import ast
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_fencedjobs import admin as jobs_admin
from django_fencedjobs import fenced_atomic, job
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.loop import tick
from django_fencedjobs.models import JobLease, JobRun, Outcome
from django_fencedjobs.registry import registry
from tests.monitoring_jobs import BROKEN, FINE, STALLED, declare

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
NOW = T0 + timedelta(minutes=45)
PACKAGE = Path(jobs_admin.__file__).resolve().parent


@pytest.fixture
def history():
    """At 09:45: m.fine healthy, m.broken failing (3 failures), m.stalled late."""
    with (
        registry.isolated(),
        override_settings(FENCEDJOBS={"CLOCK": "django_fencedjobs.clock.fake_clock"}),
    ):
        declare()

        @job("*/15 * * * *", name="m.rollup")
        def rollup(run):
            for window in run.windows(timedelta(minutes=15), start=T0):
                with fenced_atomic():
                    run.advance_watermark(window.end)

        fake_clock.set(T0)
        tick()
        fake_clock.set(T0 + timedelta(minutes=15))
        tick()
        for minutes in (30, 45):
            fake_clock.set(T0 + timedelta(minutes=minutes))
            tick([FINE, BROKEN, "m.rollup"])
        yield


@pytest.fixture
def superuser_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    return client


@pytest.fixture
def viewer_client() -> Client:
    user = User.objects.create_user("viewer", "viewer@example.com", "pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(codename__in=["view_joblease", "view_jobrun"])
    )
    client = Client()
    client.force_login(user)
    return client


def changelist() -> str:
    return reverse("admin:fencedjobs_joblease_changelist")


def change_page(name: str) -> str:
    return reverse("admin:fencedjobs_joblease_change", args=[JobLease.objects.get(name=name).pk])


def operate(name: str, operation: str) -> str:
    pk = JobLease.objects.get(name=name).pk
    return reverse("admin:fencedjobs_joblease_operate", args=[pk, operation])


def badges(html: str) -> list[tuple[str, str]]:
    """(state, job) in the order the rows appear."""
    rows = re.findall(r"<tr>.*?</tr>", html, flags=re.S)
    found = []
    for row in rows:
        state = re.search(r'class="fj-badge fj-(\w+)"', row)
        name = re.search(r'<th class="field-name"><a [^>]*>([^<]+)</a>', row)
        if state and name:
            found.append((state.group(1), name.group(1)))
    return found


def test_the_job_list_shows_state_badges_with_late_and_failing_first(history, superuser_client):
    response = superuser_client.get(changelist())
    assert response.status_code == 200
    html = response.content.decode()
    assert badges(html) == [
        ("failing", BROKEN),
        ("late", STALLED),
        ("ok", FINE),
        ("ok", "m.rollup"),
    ]
    assert "no successful run since 2026-11-29 09:15 UTC; expected by 09:42:30" in html
    assert "every 15 minutes (UTC)" in html
    assert "fencedjobs/admin.css" in html


def test_the_job_list_filters_by_state(history, superuser_client):
    html = superuser_client.get(changelist(), {"state": "late"}).content.decode()
    assert badges(html) == [("late", STALLED)]


def test_a_jobs_page_shows_its_timeline_next_fire_times_and_watermark(history, superuser_client):
    html = superuser_client.get(change_page("m.rollup")).content.decode()
    assert len(re.findall(r'<rect class="fj-bar fj-bar-succeeded"', html)) == 3
    assert '<svg class="fj-timeline"' in html
    fire_times = re.search(r'<ol class="fj-fire-times">(.*?)</ol>', html, flags=re.S)
    assert fire_times and fire_times.group(1).count("<li>") == 10
    assert "2026-11-29 10:00 UTC" in fire_times.group(1)
    assert "2026-11-29 09:45:00+00:00" in html  # the watermark: the last whole window's end
    assert 'name="_save"' not in html  # read-only
    assert "Run now" in html and "Pause" in html

    broken = superuser_client.get(change_page(BROKEN)).content.decode()
    assert len(re.findall(r'<rect class="fj-bar fj-bar-failed"', broken)) == 3


def test_run_now_makes_the_job_due_through_the_lease_and_is_logged(history, superuser_client):
    clicked = fake_clock.advance(timedelta(minutes=2))
    response = superuser_client.post(operate(FINE, "run-now"))
    assert response.status_code == 302
    row = JobLease.objects.get(name=FINE)
    assert row.next_run_at == clicked
    entry = LogEntry.objects.get()
    assert (entry.action_flag, entry.object_repr) == (CHANGE, FINE)
    assert "Run now" in entry.get_change_message()
    fake_clock.advance(timedelta(seconds=1))
    (run,) = tick([FINE]).runs
    assert (run.outcome, run.scheduled_for) == (Outcome.SUCCEEDED, clicked)


def test_pause_and_resume_are_actions_and_are_logged(history, superuser_client):
    pk = JobLease.objects.get(name=STALLED).pk
    response = superuser_client.post(
        changelist(), {"action": "pause", "_selected_action": [pk]}, follow=True
    )
    assert response.status_code == 200
    assert JobLease.objects.get(name=STALLED).paused
    assert badges(response.content.decode())[1:2] == [("paused", STALLED)]
    superuser_client.post(operate(STALLED, "resume"))
    assert not JobLease.objects.get(name=STALLED).paused
    assert [e.get_change_message() for e in LogEntry.objects.order_by("pk")] == [
        "Paused.",
        "Resumed.",
    ]


def test_a_view_only_user_sees_everything_and_can_trigger_nothing(history, viewer_client):
    html = viewer_client.get(changelist()).content.decode()
    assert len(badges(html)) == 4
    assert 'name="action"' not in html  # no actions offered
    page = viewer_client.get(change_page(FINE)).content.decode()
    assert "fj-timeline" in page and "Run now" not in page
    assert viewer_client.post(operate(FINE, "run-now")).status_code == 403
    assert viewer_client.post(operate(FINE, "pause")).status_code == 403
    pk = JobLease.objects.get(name=FINE).pk
    viewer_client.post(changelist(), {"action": "pause", "_selected_action": [pk]})
    row = JobLease.objects.get(name=FINE)
    assert not row.paused and row.next_run_at == T0 + timedelta(hours=1)
    assert not LogEntry.objects.exists()


def test_staff_without_permissions_see_nothing(history):
    user = User.objects.create_user("nobody", "n@example.com", "pw", is_staff=True)
    client = Client()
    client.force_login(user)
    assert client.get(changelist()).status_code == 403
    assert client.post(operate(FINE, "run-now")).status_code == 403


def test_operations_need_a_post(history, superuser_client):
    assert superuser_client.get(operate(FINE, "run-now")).status_code == 405
    assert JobLease.objects.get(name=FINE).next_run_at == T0 + timedelta(hours=1)


def test_jobs_cannot_be_added_edited_or_deleted(history, superuser_client):
    assert superuser_client.get(reverse("admin:fencedjobs_joblease_add")).status_code == 403
    pk = JobLease.objects.get(name=FINE).pk
    fence = JobLease.objects.get(name=FINE).fence
    superuser_client.post(change_page(FINE), {"name": FINE, "fence": 0})
    assert JobLease.objects.get(name=FINE).fence == fence
    delete = reverse("admin:fencedjobs_joblease_delete", args=[pk])
    assert superuser_client.post(delete, {"post": "yes"}).status_code == 403


def test_the_run_history_is_read_only_and_filterable(history, superuser_client):
    url = reverse("admin:fencedjobs_jobrun_changelist")
    html = superuser_client.get(url).content.decode()
    assert html.count('class="field-scheduled_for') == JobRun.objects.count() == 10
    assert "RuntimeError: upstream said no" in html
    assert 'value="delete_selected"' not in html
    assert superuser_client.get(reverse("admin:fencedjobs_jobrun_add")).status_code == 403
    run = JobRun.objects.filter(job=BROKEN).first()
    page = superuser_client.get(reverse("admin:fencedjobs_jobrun_change", args=[run.pk]))
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    assert 'class="fj-error"' in page.content.decode()
    delete = reverse("admin:fencedjobs_jobrun_delete", args=[run.pk])
    assert superuser_client.post(delete, {"post": "yes"}).status_code == 403

    by_job = superuser_client.get(url, {"job": BROKEN}).content.decode()
    assert by_job.count('class="field-scheduled_for') == 3
    by_outcome = superuser_client.get(url, {"outcome__exact": "failed"}).content.decode()
    assert by_outcome.count('class="field-scheduled_for') == 3
    today = superuser_client.get(
        url,
        {
            "scheduled_for__gte": "2026-11-29 00:00:00+00:00",
            "scheduled_for__lt": "2026-11-30 00:00:00+00:00",
        },
    )
    assert today.content.decode().count('class="field-scheduled_for') == 10


def test_the_run_list_counts_exactly_below_the_estimate_threshold(history, superuser_client):
    with CaptureQueriesContext(connection) as queries:
        response = superuser_client.get(reverse("admin:fencedjobs_jobrun_changelist"))
    assert response.context["cl"].result_count == 10
    counts = [q["sql"] for q in queries if "COUNT(" in q["sql"].upper() and "jobrun" in q["sql"]]
    assert len(counts) == 1 and "LIMIT" in counts[0].upper()  # bounded; no full count


@pytest.mark.postgres_only
def test_the_unfiltered_run_list_on_postgresql_uses_the_planners_estimate(
    history, superuser_client, monkeypatch
):
    monkeypatch.setattr(jobs_admin.EstimatedCountPaginator, "exact_below", 2)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE fencedjobs_jobrun")
    url = reverse("admin:fencedjobs_jobrun_changelist")
    with CaptureQueriesContext(connection) as queries:
        response = superuser_client.get(url)
    assert response.context["cl"].result_count == 10  # reltuples after ANALYZE
    counts = [q["sql"] for q in queries if "COUNT(" in q["sql"].upper() and "jobrun" in q["sql"]]
    assert counts == []  # the estimate is past the bound: nothing is counted
    assert any("reltuples" in q["sql"] for q in queries)
    filtered = superuser_client.get(url, {"job": FINE})
    assert filtered.context["cl"].result_count == 3  # filtered: counted in full


def test_neither_the_admin_nor_any_module_imports_across_the_rules():
    def imports(path: Path) -> set[str]:
        tree = ast.parse(path.read_text())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        return found

    admin_imports = imports(PACKAGE / "admin.py")
    assert not any(name.startswith("django_fencedjobs.management") for name in admin_imports)
    for path in PACKAGE.rglob("*.py"):
        if path.name != "admin.py":
            assert "django_fencedjobs.admin" not in imports(path), path


def test_a_running_job_shows_its_owner_fence_and_lease_expiry(superuser_client):
    pages = []
    with (
        registry.isolated(),
        override_settings(
            FENCEDJOBS={"CLOCK": "django_fencedjobs.clock.fake_clock", "OWNER": "worker-1"}
        ),
    ):

        @job("*/15 * * * *", name="m.busy")
        def busy(run):
            pages.append(superuser_client.get(changelist()).content.decode())

        fake_clock.set(T0)
        tick()
        fake_clock.set(T0 + timedelta(minutes=15))
        tick()
    (html,) = pages
    assert badges(html) == [("running", "m.busy")]
    assert "worker-1 (fence 1)" in html
    assert "until" in html and "09:17 UTC" in html  # lease_ttl 2 minutes


def test_a_job_removed_from_code_is_listed_as_removed_and_cannot_be_run(history, superuser_client):
    JobLease.objects.create(name="m.retired", next_run_at=T0, created_at=T0 - timedelta(days=30))
    html = superuser_client.get(changelist()).content.decode()
    assert ("removed", "m.retired") in badges(html)
    response = superuser_client.post(operate("m.retired", "run-now"), follow=True)
    assert "not declared in code" in response.content.decode()
    assert not LogEntry.objects.exists()
