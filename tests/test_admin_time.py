"""The admin's backfills and one-offs: the add-backfill form's dry run and its Backfill
button, the run-once form, errors said on the forms, the read-only backfill pages with their
progress, the add permission they need, and the run list's kind and attempt. Driven through
Django's test client; tests/test_admin_browser_time.py drives the form in Chromium."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from html import unescape

import pytest
from django.contrib.admin.models import ADDITION, LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from django_fencedjobs import job, loop
from django_fencedjobs.models import Backfill, JobLease, JobRun, Outcome, RunKind

pytestmark = pytest.mark.django_db(transaction=True)

ADD = "admin:fencedjobs_backfill_add"
RUN_ONCE = "admin:fencedjobs_backfill_run_once"


def _h(hour: int) -> datetime:
    return datetime(2026, 11, 29, hour, 0, tzinfo=UTC)


@pytest.fixture
def hourly(jobs):
    """At 09:00 UTC (the ``jobs`` fixture's clock): t.hourly, hourly in Berlin; its 06:00
    UTC slot succeeded, its 07:00 one failed; 05:00 and 08:00 have no run."""

    @job("0 * * * *", name="t.hourly", timezone="Europe/Berlin")
    def hourly(run, fmt: str = "pdf"):
        pass

    for hour, outcome in ((6, Outcome.SUCCEEDED), (7, Outcome.FAILED)):
        JobRun.objects.create(job="t.hourly", scheduled_for=_h(hour), outcome=outcome)
    return hourly


def _client(username: str, *codenames: str) -> Client:
    user = User.objects.create_user(username, f"{username}@example.com", "pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def operator() -> Client:
    """May add backfills (and so run once), and view them, the jobs and the runs."""
    return _client("operator", "add_backfill", "view_backfill", "view_joblease", "view_jobrun")


@pytest.fixture
def viewer() -> Client:
    """May view the backfills, the jobs and the runs; may not add a backfill."""
    return _client("viewer", "view_backfill", "view_joblease", "view_jobrun")


def form(start: int | str = 5, end: int | str = 9, **more: str) -> dict[str, str]:
    """The add-backfill form's fields: from ``start`` to ``end`` (hours UTC, or as typed)."""
    return {
        "job": "t.hourly",
        "start": _h(start).isoformat() if isinstance(start, int) else start,
        "end": _h(end).isoformat() if isinstance(end, int) else end,
        "selection": "missing",
        "concurrency": "1",
        **more,
    }


def text(html: str) -> str:
    """The page's text, tags removed, spaces collapsed."""
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


def table(html: str, table_id: str) -> list[str]:
    """Each body row of the table ``table_id``, as text."""
    found = re.search(rf'<table id="{table_id}">.*?<tbody>(.*?)</tbody>', html, re.S)
    assert found, f"no table {table_id}"
    return [text(row) for row in re.findall(r"<tr>(.*?)</tr>", found.group(1), re.S)]


def queued_nothing() -> bool:
    return (
        not Backfill.objects.exists()
        and not JobLease.objects.exclude(kind=RunKind.SCHEDULED).exists()
    )


# -- add backfill --------------------------------------------------------------------------


def test_a_dry_run_lists_the_slots_it_would_queue_and_those_it_leaves_and_queues_nothing(
    hourly, operator
):
    response = operator.post(reverse(ADD), {**form(), "_dry_run": "Dry run"})
    assert response.status_code == 200
    html = response.content.decode()
    assert table(html, "fj-plan-queue") == [
        "2026-11-29 06:00:00 Europe/Berlin 2026-11-29 05:00:00 UTC 1 no run yet",
        "2026-11-29 09:00:00 Europe/Berlin 2026-11-29 08:00:00 UTC 1 no run yet",
    ]
    assert table(html, "fj-plan-left") == [
        "2026-11-29 07:00:00 Europe/Berlin 2026-11-29 06:00:00 UTC has a run (succeeded)",
        "2026-11-29 08:00:00 Europe/Berlin 2026-11-29 07:00:00 UTC has a run (failed)",
    ]
    assert "Dry run: 2 slots of t.hourly would be queued" in text(html)
    assert queued_nothing()


def test_a_dry_run_newest_first_lists_the_latest_slot_first_each_with_its_next_attempt(
    hourly, operator
):
    values = form(selection="all", newest_first="on")
    response = operator.post(reverse(ADD), {**values, "_dry_run": "Dry run"})
    assert table(response.content.decode(), "fj-plan-queue") == [
        "2026-11-29 09:00:00 Europe/Berlin 2026-11-29 08:00:00 UTC 1 no run yet",
        "2026-11-29 08:00:00 Europe/Berlin 2026-11-29 07:00:00 UTC 2 failed",
        "2026-11-29 07:00:00 Europe/Berlin 2026-11-29 06:00:00 UTC 2 succeeded",
        "2026-11-29 06:00:00 Europe/Berlin 2026-11-29 05:00:00 UTC 1 no run yet",
    ]
    assert queued_nothing()


def test_backfill_queues_the_slots_and_opens_the_backfills_page_with_a_message(hourly, operator):
    response = operator.post(reverse(ADD), {**form(concurrency="2"), "_backfill": "Backfill"})
    made = Backfill.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:fencedjobs_backfill_change", args=[made.pk])
    assert (made.job, made.slots, made.concurrency, made.requested_by) == (
        "t.hourly",
        2,
        2,
        "operator",
    )
    assert sorted(JobLease.objects.filter(backfill=made).values_list("run_slot", flat=True)) == [
        _h(5),
        _h(8),
    ]
    assert LogEntry.objects.get(object_id=str(made.pk)).action_flag == ADDITION
    page = text(operator.get(response["Location"]).content.decode())
    assert "Queued 2 slots of t.hourly for the runners." in page
    assert "0 of 2 done, 0 running, 2 queued" in page
    assert "no runs yet" in page


def test_a_backfills_progress_counts_its_slots_done_and_its_runs_by_outcome(hourly, operator):
    operator.post(reverse(ADD), {**form(), "_backfill": "Backfill"})
    while loop.tick().runs:
        pass
    listing = text(operator.get(reverse("admin:fencedjobs_backfill_changelist")).content.decode())
    assert "2 of 2 done, 0 running, 0 queued runs: 2 succeeded, 0 failed" in listing


@pytest.mark.parametrize(
    ("values", "error"),
    [
        (form(5, 10), "to (2026-11-29T10:00:00+00:00) is in the future"),
        (form(9, 5), "must be after from"),
        (form(6, 8), "Nothing to queue: none of the 2 slots of t.hourly in this range"),
        (form(job="t.nope"), "no job named 't.nope' is registered"),
        (form(start="2026-11-29T05:00"), "has no offset"),
        (form(end="tomorrow"), "is not an ISO 8601 instant"),
        (form(concurrency="0"), "greater than or equal to 1"),
    ],
)
def test_what_a_backfill_refuses_is_said_on_the_form_and_queues_nothing(
    hourly, operator, values, error
):
    response = operator.post(reverse(ADD), {**values, "_backfill": "Backfill"})
    assert response.status_code == 200
    assert error in text(response.content.decode())
    assert "errornote" in response.content.decode()
    assert queued_nothing()


def test_the_form_is_prefilled_with_the_job_it_was_opened_for(hourly, operator):
    html = operator.get(reverse(ADD), {"job": "t.hourly"}).content.decode()
    assert re.search(r'<input[^>]*name="job"[^>]*value="t.hourly"', html)
    assert '<option value="t.hourly">' in html  # the declared jobs to pick from


# -- run once ------------------------------------------------------------------------------


def test_run_once_queues_a_one_off_and_opens_its_jobs_one_off_runs(hourly, operator):
    values = {"job": "t.hourly", "at": _h(14).isoformat(), "arguments": '{"fmt": "csv"}'}
    response = operator.post(reverse(RUN_ONCE), values)
    assert response.status_code == 302
    assert response["Location"] == (
        reverse("admin:fencedjobs_jobrun_changelist") + "?job=t.hourly&kind__exact=once"
    )
    row = JobLease.objects.get(kind=RunKind.ONCE)
    assert (row.run_slot, row.kwargs) == (_h(14), {"fmt": "csv"})
    page = text(operator.get(response["Location"]).content.decode())
    assert "Queued a one-off run of t.hourly: it runs at 2026-11-29 15:00:00 Europe/Berlin." in page


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"arguments": '{"size": 3}'}, "the handler cannot take these arguments"),
        ({"arguments": "{size: 3}"}, "not JSON"),
        ({"arguments": "[3]"}, "a JSON object of keyword arguments"),
        ({"at": "14:00"}, "is not an ISO 8601 instant"),
        ({"job": "t.nope"}, "no job named 't.nope' is registered"),
    ],
)
def test_what_a_one_off_refuses_is_said_on_the_form_and_queues_nothing(
    hourly, operator, values, error
):
    response = operator.post(reverse(RUN_ONCE), {"job": "t.hourly", "at": "now", **values})
    assert response.status_code == 200
    assert error in text(response.content.decode())
    assert queued_nothing()


# -- permissions and the read-only pages ---------------------------------------------------


def test_a_user_without_the_add_permission_can_neither_backfill_nor_run_once(hourly, viewer):
    assert viewer.get(reverse(ADD)).status_code == 403
    assert viewer.post(reverse(ADD), {**form(), "_backfill": "Backfill"}).status_code == 403
    assert viewer.get(reverse(RUN_ONCE)).status_code == 403
    assert viewer.post(reverse(RUN_ONCE), {"job": "t.hourly", "at": "now"}).status_code == 403
    assert queued_nothing()
    listing = viewer.get(reverse("admin:fencedjobs_backfill_changelist")).content.decode()
    assert reverse(ADD) not in listing and reverse(RUN_ONCE) not in listing


def test_the_backfill_list_links_to_both_forms_for_a_user_who_may_add(hourly, operator):
    listing = operator.get(reverse("admin:fencedjobs_backfill_changelist")).content.decode()
    assert reverse(ADD) in listing and reverse(RUN_ONCE) in listing


def test_a_jobs_page_links_to_both_forms_for_that_job_for_a_user_who_may_add(
    hourly, operator, viewer
):
    loop.tick()  # the job's row
    row = JobLease.objects.get(name="t.hourly")
    url = reverse("admin:fencedjobs_joblease_change", args=[row.pk])
    page = operator.get(url).content.decode()
    assert f'href="{reverse(ADD)}?job=t.hourly"' in page
    assert f'href="{reverse(RUN_ONCE)}?job=t.hourly"' in page
    assert reverse(ADD) not in viewer.get(url).content.decode()


def test_a_backfill_cannot_be_changed_or_deleted(hourly, operator):
    superuser = Client()
    superuser.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    superuser.post(reverse(ADD), {**form(), "_backfill": "Backfill"})
    made = Backfill.objects.get()
    change = reverse("admin:fencedjobs_backfill_change", args=[made.pk])
    page = superuser.get(change).content.decode()
    assert 'name="_save"' not in page  # shown read-only
    assert superuser.post(change, {"job": "t.other"}).status_code == 403
    delete = reverse("admin:fencedjobs_backfill_delete", args=[made.pk])
    assert superuser.post(delete, {"post": "yes"}).status_code == 403
    assert Backfill.objects.get().job == "t.hourly"


# -- the run list: kind and attempt ------------------------------------------------------------


def test_the_run_list_shows_each_runs_kind_and_attempt_and_filters_by_kind(hourly, operator):
    operator.post(reverse(ADD), {**form(3, 9, selection="failed"), "_backfill": "Backfill"})
    while loop.tick().runs:
        pass
    url = reverse("admin:fencedjobs_jobrun_changelist")

    def kinds(html: str) -> list[str]:
        return [
            text(cell) for cell in re.findall(r'<td class="field-kind_attempt">(.*?)</td>', html)
        ]

    # The 07:00 slot's second attempt; the 06:00 and 07:00 slots' scheduled runs.
    assert kinds(operator.get(url, {"kind__exact": "backfill"}).content.decode()) == [
        "backfill attempt 2"
    ]
    everything = operator.get(url).content.decode()
    assert 'href="?kind__exact=backfill"' in everything  # the filter is offered
    assert sorted(kinds(everything)) == [
        "backfill attempt 2",
        "scheduled attempt 1",
        "scheduled attempt 1",
    ]
