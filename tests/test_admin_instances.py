"""The instances admin: instances added and changed through the form (refused with the
system check's message when they are bad), the preview of the next fire times with their
DST transitions, bulk enable and disable, search and filters, and a list that never counts
the whole table. Driven through Django's test client; the browser test
(test_admin_browser.py) drives the form's live preview in Chromium."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from html import unescape

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_fencedjobs import job, loop, runners
from django_fencedjobs.admin.instances import InstancePaginator, JobInstanceAdmin
from django_fencedjobs.checkids import CheckId
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.instances import problem
from django_fencedjobs.models import JobInstance, JobLease, JobRun
from django_fencedjobs.registry import registry
from django_fencedjobs.schedule import Schedule

pytestmark = pytest.mark.django_db(transaction=True)

DIGEST = "t.digest"
#: Thursday before Berlin's clocks go forward (Sunday 2027-03-28, 02:00 to 03:00).
BEFORE_SPRING = datetime(2027, 3, 25, 12, 0, tzinfo=UTC)
#: Thursday before they go back (Sunday 2027-10-31, 03:00 to 02:00).
BEFORE_AUTUMN = datetime(2027, 10, 28, 12, 0, tzinfo=UTC)


@pytest.fixture
def digest(jobs):
    """A job with instances (a tenant's digest) in the test's own registry."""

    @job(instances=True, timeout=timedelta(seconds=30), name=DIGEST)
    def send_digest(run, *, tenant_id: int) -> None:
        pass

    @job("0 * * * *", name="t.hourly")
    def hourly(run) -> None:
        pass

    return send_digest


@pytest.fixture
def superuser_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    return client


def client_with(*codenames: str) -> Client:
    user = User.objects.create_user(
        f"u{User.objects.count()}", "u@example.com", "pw", is_staff=True
    )
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def add_url() -> str:
    return reverse("admin:fencedjobs_jobinstance_add")


def changelist_url() -> str:
    return reverse("admin:fencedjobs_jobinstance_changelist")


def change_url(instance: JobInstance) -> str:
    return reverse("admin:fencedjobs_jobinstance_change", args=[instance.pk])


def preview_url(**values: str) -> str:
    from urllib.parse import urlencode

    return reverse("admin:fencedjobs_jobinstance_preview") + "?" + urlencode(values)


def form_data(**values: str) -> dict[str, str]:
    data = {
        "job": DIGEST,
        "key": "tenant-42",
        "enabled": "on",
        "cron": "0 8 * * 1-5",
        "every": "",
        "timezone": "Europe/Paris",
        "jitter": "0:00:00",
        "kwargs": '{"tenant_id": 42}',
        "_save": "Save",
    }
    data.update(values)
    return data


def keys_listed(html: str) -> list[str]:
    return [
        unescape(key)
        for key in re.findall(r'<th class="field-key"><a [^>]*>([^<]*)</a></th>', html)
    ]


# -- the form --------------------------------------------------------------------------------


def test_an_instance_added_through_the_form_has_its_lease_row(digest, superuser_client):
    page = superuser_client.get(add_url())
    assert page.status_code == 200
    choices = page.context["adminform"].form.fields["job"].choices
    assert [value for value, _label in choices] == ["", DIGEST]  # t.hourly takes none

    response = superuser_client.post(add_url(), form_data())
    assert response.status_code == 302, response.context["adminform"].form.errors

    instance = JobInstance.objects.get(job=DIGEST, key="tenant-42")
    assert (instance.cron, instance.timezone, instance.kwargs) == (
        "0 8 * * 1-5",
        "Europe/Paris",
        {"tenant_id": 42},
    )
    lease = JobLease.objects.get(instance=instance)
    assert lease.name == "t.digest[tenant-42]"
    assert not lease.paused
    schedule = Schedule("0 8 * * 1-5", timezone="Europe/Paris", key=lease.name)
    assert lease.next_run_at == schedule.next_after(fake_clock())
    assert LogEntry.objects.filter(object_id=str(instance.pk)).count() == 1


def test_a_bad_cron_is_refused_with_the_checks_message_and_nothing_is_written(
    digest, superuser_client
):
    response = superuser_client.post(add_url(), form_data(cron="61 * * * *"))
    assert response.status_code == 200
    check_id, message = problem(JobInstance(job=DIGEST, key="tenant-42", cron="61 * * * *"))
    assert check_id == CheckId.CRON
    expected = f"{message} ({CheckId.CRON})"
    assert "minute" in message and "61" in message
    assert response.context["adminform"].form.errors == {"cron": [expected]}
    assert expected in unescape(response.content.decode())
    assert not JobInstance.objects.exists()
    assert not JobLease.objects.filter(name__startswith=DIGEST).exists()


def test_a_zone_and_arguments_are_refused_on_their_fields(digest, superuser_client):
    fixed = superuser_client.post(add_url(), form_data(timezone="+02:00"))
    errors = fixed.context["adminform"].form.errors
    assert list(errors) == ["timezone"] and errors["timezone"][0].endswith(
        f"({CheckId.FIXED_OFFSET})"
    )
    missing = superuser_client.post(add_url(), form_data(kwargs="{}"))
    errors = missing.context["adminform"].form.errors
    assert list(errors) == ["kwargs"] and errors["kwargs"][0].endswith(
        f"({CheckId.HANDLER_SIGNATURE})"
    )
    assert not JobInstance.objects.exists()


def test_the_job_and_key_are_read_only_once_created(digest, superuser_client):
    instance = digest.instances.upsert("tenant-42", cron="0 8 * * *", kwargs={"tenant_id": 42})
    page = superuser_client.get(change_url(instance))
    html = page.content.decode()
    assert 'name="key"' not in html and 'name="job"' not in html
    assert 'name="cron"' in html
    assert "t.digest[tenant-42]" in html  # what its runs are recorded as

    response = superuser_client.post(
        change_url(instance), form_data(key="renamed", job="t.hourly", cron="30 9 * * *")
    )
    assert response.status_code == 302
    instance.refresh_from_db()
    assert (instance.job, instance.key, instance.cron) == (DIGEST, "tenant-42", "30 9 * * *")
    lease = JobLease.objects.get(instance=instance)
    assert lease.name == "t.digest[tenant-42]"
    assert lease.next_run_at == Schedule(
        "30 9 * * *", timezone="Europe/Paris", key=lease.name
    ).next_after(fake_clock())


def test_an_instance_deleted_through_the_admin_takes_its_lease_row_and_keeps_its_runs(
    digest, superuser_client
):
    instance = digest.instances.upsert("a", every=timedelta(minutes=1), kwargs={"tenant_id": 1})
    fake_clock.advance(timedelta(minutes=1))
    assert [r.job for r in loop.tick().runs] == ["t.digest[a]"]
    delete_url = reverse("admin:fencedjobs_jobinstance_delete", args=[instance.pk])
    confirm = superuser_client.get(delete_url)
    assert confirm.context["perms_lacking"] == set()  # the lease row needs no permission
    assert superuser_client.post(delete_url, {"post": "yes"}).status_code == 302
    assert not JobInstance.objects.exists()
    assert not JobLease.objects.filter(name="t.digest[a]").exists()
    assert JobRun.objects.filter(job="t.digest[a]").count() == 1


def test_declared_jobs_stay_read_only_while_instances_are_edited(digest, superuser_client):
    instance = digest.instances.upsert("a", cron="0 8 * * *", kwargs={"tenant_id": 1})
    loop.tick()  # records t.hourly's lease row
    hourly = JobLease.objects.get(name="t.hourly")
    url = reverse("admin:fencedjobs_joblease_change", args=[hourly.pk])
    assert superuser_client.post(url, {"paused": "on"}).status_code == 403
    # An instance's lease row is not on the jobs page at all (its page is the instance's):
    # refused (403), or "does not exist" (a redirect; Django 6.1 looks the row up first).
    lease = JobLease.objects.get(name=instance.name)
    url = reverse("admin:fencedjobs_joblease_change", args=[lease.pk])
    assert superuser_client.post(url, {"paused": "on"}).status_code in (302, 403)
    assert not JobLease.objects.filter(paused=True).exists()
    assert superuser_client.get(reverse("admin:fencedjobs_joblease_add")).status_code == 403
    assert superuser_client.get(add_url()).status_code == 200


def test_instances_need_their_django_permissions(digest):
    instance = digest.instances.upsert("a", cron="0 8 * * *", kwargs={"tenant_id": 1})
    nobody = client_with()
    assert nobody.get(changelist_url()).status_code == 403
    viewer = client_with("view_jobinstance")
    assert viewer.get(changelist_url()).status_code == 200
    assert viewer.get(add_url()).status_code == 403
    assert viewer.post(change_url(instance), form_data(cron="5 8 * * *")).status_code == 403
    editor = client_with("view_jobinstance", "change_jobinstance")
    assert editor.post(change_url(instance), form_data(cron="5 8 * * *")).status_code == 302
    instance.refresh_from_db()
    assert instance.cron == "5 8 * * *"


# -- the preview -----------------------------------------------------------------------------


def test_the_preview_lists_ten_times_in_the_zone_and_marks_the_spring_gap(digest, superuser_client):
    fake_clock.set(BEFORE_SPRING)
    answer = superuser_client.get(
        preview_url(job=DIGEST, key="a", cron="30 2 * * *", timezone="Europe/Berlin")
    ).json()
    assert answer["error"] == ""
    assert answer["timezone"] == "Europe/Berlin"
    local = [t["local"] for t in answer["times"]]
    assert len(local) == 10
    assert all(when.endswith(" Europe/Berlin") for when in local)
    assert local[:4] == [
        "2027-03-26 02:30:00 Europe/Berlin",
        "2027-03-27 02:30:00 Europe/Berlin",
        "2027-03-28 03:00:00 Europe/Berlin",  # 02:30 does not exist that night
        "2027-03-29 02:30:00 Europe/Berlin",
    ]
    assert answer["times"][2]["at"] == "2027-03-28T01:00:00+00:00"
    marked = [(t["kind"], t["note"]) for t in answer["times"] if t["kind"]]
    assert marked == [
        (
            "gap",
            "clocks go forward at 02:00 to 03:00 (CET to CEST): 02:30 does not exist, "
            "runs at 03:00",
        )
    ]
    assert "02:30 does not exist, runs at 03:00" in answer["html"]
    assert answer["html"].count("<li") == 10


def test_the_preview_says_which_occurrence_of_a_repeated_hour_runs(digest, superuser_client):
    fake_clock.set(BEFORE_AUTUMN)
    fixed = superuser_client.get(
        preview_url(job=DIGEST, key="a", cron="30 2 * * *", timezone="Europe/Berlin")
    ).json()
    notes = {t["local"]: t["note"] for t in fixed["times"] if t["kind"] == "repeated"}
    assert notes == {
        "2027-10-31 02:30:00 Europe/Berlin": "02:30 happens twice: clocks go back at 03:00 to "
        "02:00 (CEST to CET); runs once, at the first 02:30 (CEST)"
    }
    fake_clock.set(datetime(2027, 10, 30, 23, 50, tzinfo=UTC))  # 01:50 CEST
    every_half_hour = superuser_client.get(
        preview_url(job=DIGEST, key="a", cron="*/30 * * * *", timezone="Europe/Berlin")
    ).json()
    repeated = [(t["at"][11:16], t["note"]) for t in every_half_hour["times"][:4]]
    assert repeated == [
        (
            "00:00",
            "02:00 happens twice: clocks go back at 03:00 to 02:00 (CEST to CET); this is "
            "the first 02:00 (CEST), the second runs too",
        ),
        (
            "00:30",
            "02:30 happens twice: clocks go back at 03:00 to 02:00 (CEST to CET); this is "
            "the first 02:30 (CEST), the second runs too",
        ),
        (
            "01:00",
            "02:00 again: clocks go back at 03:00 to 02:00 (CEST to CET); this is the "
            "second 02:00 (CET)",
        ),
        (
            "01:30",
            "02:30 again: clocks go back at 03:00 to 02:00 (CEST to CET); this is the "
            "second 02:30 (CET)",
        ),
    ]


def test_an_invalid_schedule_previews_as_the_checks_message(digest, superuser_client):
    answer = superuser_client.get(
        preview_url(job=DIGEST, key="a", cron="61 * * * *", timezone="UTC")
    ).json()
    _check, message = problem(JobInstance(job=DIGEST, key="a", cron="61 * * * *"))
    assert answer["times"] == []
    assert (answer["field"], answer["error"]) == ("cron", f"{message} ({CheckId.CRON})")
    zone = superuser_client.get(
        preview_url(job=DIGEST, key="a", cron="0 8 * * *", timezone="Mars/Olympus")
    ).json()
    assert zone["field"] == "timezone" and zone["error"].endswith(f"({CheckId.ZONE})")
    # The arguments are the form's business, not the preview's: the times still show.
    no_kwargs = superuser_client.get(
        preview_url(job=DIGEST, key="a", cron="0 8 * * *", kwargs="not json")
    ).json()
    assert no_kwargs["error"] == "" and len(no_kwargs["times"]) == 10
    bad_every = superuser_client.get(preview_url(job=DIGEST, key="a", every="soon")).json()
    assert bad_every["field"] == "every" and bad_every["times"] == []


def test_the_preview_needs_a_permission_on_instances(digest):
    url = preview_url(job=DIGEST, key="a", cron="0 8 * * *")
    assert Client().get(url).status_code == 302  # to the login page
    assert client_with("view_joblease").get(url).status_code == 403
    assert client_with("add_jobinstance").get(url).status_code == 200
    assert client_with("view_jobinstance").get(url).status_code == 200


def test_the_change_page_renders_the_preview_with_its_transitions(digest, superuser_client):
    fake_clock.set(BEFORE_SPRING)
    instance = digest.instances.upsert(
        "berlin", cron="30 2 * * *", timezone="Europe/Berlin", kwargs={"tenant_id": 1}
    )
    html = superuser_client.get(change_url(instance)).content.decode()
    box = re.search(r'<div class="fj-preview"[^>]*>(.*?)</div>', html, flags=re.S)
    assert box is not None
    assert box.group(1).count("<li") == 10
    assert 'class="fj-dst fj-dst-gap"' in box.group(1)
    assert "02:30 does not exist, runs at 03:00" in box.group(1)
    assert 'data-key="berlin"' in box.group(0)
    assert "fencedjobs/instance_preview.js" in html


def test_an_instances_page_shows_its_lease_and_links_its_runs(digest, superuser_client):
    instance = digest.instances.upsert("a", every=timedelta(minutes=1), kwargs={"tenant_id": 1})
    fake_clock.advance(timedelta(minutes=1))
    (run,) = loop.tick().runs
    assert run.outcome == "succeeded"
    html = unescape(superuser_client.get(change_url(instance)).content.decode())
    runs_list = reverse("admin:fencedjobs_jobrun_changelist") + "?job=t.digest%5Ba%5D"
    assert f'href="{runs_list}"' in html
    assert (
        reverse("admin:fencedjobs_jobrun_change", args=[JobRun.objects.get(job=run.job).pk]) in html
    )
    lease_box = re.search(r'<dl class="fj-facts">(.*?)</dl>', html, flags=re.S)
    assert lease_box is not None
    assert "last success" in lease_box.group(1) and "2026-11-29 09:01:00 UTC" in lease_box.group(1)
    filtered = superuser_client.get(runs_list)
    assert [r.job for r in filtered.context["cl"].result_list] == ["t.digest[a]"]


# -- the list --------------------------------------------------------------------------------


def make_instances(digest, n: int) -> None:
    for i in range(n):
        digest.instances.upsert(f"tenant-{i:03d}", cron="0 8 * * *", kwargs={"tenant_id": i})


def test_bulk_enable_and_disable_move_the_lease_rows(digest, superuser_client):
    make_instances(digest, 3)
    chosen = list(JobInstance.objects.filter(key__in=["tenant-000", "tenant-002"]))
    selected = [str(i.pk) for i in chosen]

    def act(action: str) -> list[str]:
        response = superuser_client.post(
            changelist_url(), {"action": action, "_selected_action": selected}, follow=True
        )
        return [str(m) for m in response.context["messages"]]

    assert act("disable") == ["Disabled 2: t.digest[tenant-000], t.digest[tenant-002]."]
    paused = dict(JobLease.objects.filter(instance__isnull=False).values_list("name", "paused"))
    assert paused == {
        "t.digest[tenant-000]": True,
        "t.digest[tenant-001]": False,
        "t.digest[tenant-002]": True,
    }
    assert act("disable") == ["Nothing to do: already disabled."]
    assert act("enable") == ["Enabled 2: t.digest[tenant-000], t.digest[tenant-002]."]
    assert not JobLease.objects.filter(instance__isnull=False, paused=True).exists()
    assert LogEntry.objects.filter(change_message__in=["Disabled.", "Enabled."]).count() == 4
    viewer = client_with("view_jobinstance")
    refused = viewer.post(changelist_url(), {"action": "disable", "_selected_action": selected})
    assert refused.status_code == 200  # no such action for a viewer: nothing done
    assert not JobInstance.objects.filter(enabled=False).exists()


def test_the_list_searches_by_key_and_job_and_filters_by_job_and_state(digest, superuser_client):
    make_instances(digest, 3)
    digest.instances.set_enabled(["tenant-001"], False)
    # Forced in by the ORM, as no form or helper would let it: invalid, its lease paused.
    JobInstance.objects.create(job=DIGEST, key="broken", cron="61 * * * *")

    def listed(**query: str) -> list[str]:
        response = superuser_client.get(changelist_url(), query)
        assert response.status_code == 200
        return keys_listed(response.content.decode())

    assert listed() == ["broken", "tenant-000", "tenant-001", "tenant-002"]
    assert listed(q="tenant-00") == ["tenant-000", "tenant-001", "tenant-002"]
    assert listed(q="BROK") == ["broken"]
    assert listed(q="digest") == ["broken", "tenant-000", "tenant-001", "tenant-002"]
    assert listed(job=DIGEST) == ["broken", "tenant-000", "tenant-001", "tenant-002"]
    assert listed(job="t.other") == []
    assert listed(state="enabled") == ["tenant-000", "tenant-002"]
    assert listed(state="disabled") == ["tenant-001"]
    assert listed(state="invalid") == ["broken"]

    html = superuser_client.get(changelist_url(), {"state": "invalid"}).content.decode()
    badge = re.search(r'<span class="fj-badge fj-invalid" title="([^"]*)">invalid</span>', html)
    assert badge is not None and unescape(badge.group(1)).endswith(f"({CheckId.CRON})")


def test_the_list_shows_schedule_next_run_and_state(digest, superuser_client):
    digest.instances.upsert(
        "paris", cron="0 8 * * 1-5", timezone="Europe/Paris", kwargs={"tenant_id": 1}
    )
    html = superuser_client.get(changelist_url()).content.decode()
    row = re.search(r"<tr>.*?</tr>", html.split("<tbody>", 1)[1], flags=re.S)
    assert row is not None
    cells = re.sub(r"<[^>]+>", " ", row.group(0))
    text = " ".join(cells.split())
    # Monday 2026-11-30 08:00 in Paris.
    assert "0 8 * * 1-5 at 08:00 on Mon-Fri (Europe/Paris)" in text
    assert "2026-11-30 08:00:00 Europe/Paris" in text
    # Its state, its health as checkjobs reads it, its last run and last success.
    assert "enabled never run - last success: never" in text


def count_queries(sql_of: list[str]) -> list[str]:
    return [sql for sql in sql_of if "COUNT(" in sql.upper()]


def test_the_list_never_counts_the_whole_table(digest, superuser_client, monkeypatch):
    make_instances(digest, 25)
    with CaptureQueriesContext(connection) as default:
        first = superuser_client.get(changelist_url())
    assert first.context["cl"].result_count == 25
    counts = count_queries([q["sql"] for q in default])
    assert counts and all("LIMIT" in sql.upper() for sql in counts), counts
    # The page in the order of the unique (job, key) index, its lease rows joined.
    (page,) = [
        sql
        for sql in (q["sql"] for q in default)
        if 'FROM "fencedjobs_jobinstance" ' in sql and "COUNT(" not in sql.upper()
    ]
    order = page.upper().rsplit("ORDER BY", 1)[1]
    assert re.sub(r'"\w+"\.', "", order).replace('"', "").split() == ["JOB", "ASC,", "KEY", "ASC"]

    # Past the bound, the count is a lower bound: "more than", and the pager reaches on.
    monkeypatch.setattr(InstancePaginator, "exact_below", 5)
    monkeypatch.setattr(InstancePaginator, "pages_ahead", 0)
    monkeypatch.setattr(JobInstanceAdmin, "list_per_page", 10)
    with CaptureQueriesContext(connection) as bounded:
        response = superuser_client.get(changelist_url(), {"job": DIGEST})
    assert all("LIMIT" in sql.upper() for sql in count_queries([q["sql"] for q in bounded]))
    assert keys_listed(response.content.decode())[-1] == "tenant-009"
    assert "more than 10 instances" in " ".join(response.content.decode().split())
    second = superuser_client.get(changelist_url(), {"job": DIGEST, "p": "2"})
    assert keys_listed(second.content.decode())[0] == "tenant-010"
    last = superuser_client.get(changelist_url(), {"job": DIGEST, "p": "3"})
    assert keys_listed(last.content.decode()) == [f"tenant-{i:03d}" for i in range(20, 25)]
    assert "25 instances" in " ".join(last.content.decode().split())


@pytest.mark.postgres_only
def test_the_unfiltered_list_on_postgresql_uses_the_planners_estimate(
    digest, superuser_client, monkeypatch
):
    make_instances(digest, 12)
    monkeypatch.setattr(InstancePaginator, "exact_below", 5)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE fencedjobs_jobinstance")
    with CaptureQueriesContext(connection) as queries:
        response = superuser_client.get(changelist_url())
    assert response.context["cl"].result_count == 12  # reltuples after ANALYZE
    # No count of the instances' table (the health of the page's rows counts their runs).
    listing = [q["sql"] for q in queries if 'FROM "fencedjobs_jobinstance"' in q["sql"]]
    assert count_queries(listing) == []
    assert "about 12 instances" in " ".join(response.content.decode().split())


def test_the_list_costs_the_same_queries_for_few_instances_or_many(digest, superuser_client):
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert superuser_client.get(changelist_url()).status_code == 200
        return len(captured)

    make_instances(digest, 2)
    few = queries()
    for i in range(2, 40):
        digest.instances.upsert(
            f"tenant-{i:03d}", every=timedelta(hours=1), kwargs={"tenant_id": i}
        )
    assert queries() == few


def test_the_jobs_page_lists_the_jobs_declared_with_a_schedule_not_the_instances(
    digest, superuser_client
):
    digest.instances.upsert("tenant-42", cron="0 8 * * *", kwargs={"tenant_id": 42})
    loop.tick()  # the hourly job's row
    html = superuser_client.get(reverse("admin:fencedjobs_joblease_changelist")).content.decode()
    assert "t.hourly" in html
    assert "tenant-42" not in html


def test_the_run_list_offers_no_instance_as_a_job_to_filter_by_unless_chosen(
    digest, superuser_client
):
    for n in range(3):
        digest.instances.upsert(f"tenant-{n}", cron="0 8 * * *", kwargs={"tenant_id": n})
    runs = reverse("admin:fencedjobs_jobrun_changelist")
    html = superuser_client.get(runs).content.decode()
    assert "tenant-1" not in html
    chosen = superuser_client.get(runs, {"job": "t.digest[tenant-1]"}).content.decode()
    assert "t.digest[tenant-1]" in chosen
    assert "tenant-2" not in chosen


@pytest.mark.postgres_only
def test_saving_while_a_run_holds_the_lease_row_says_so_and_changes_nothing(
    digest, superuser_client
):
    from django.db import connections

    instance = digest.instances.upsert("tenant-42", cron="0 8 * * *", kwargs={"tenant_id": 42})
    holder = connections.create_connection("default")
    holder.set_autocommit(False)
    try:
        with holder.cursor() as cursor:
            cursor.execute(
                "SELECT 1 FROM fencedjobs_joblease WHERE name = %s FOR UPDATE",
                ["t.digest[tenant-42]"],
            )
        # Waits db.LOCK_WAIT (2 s), then gives up.
        response = superuser_client.post(
            change_url(instance), form_data(cron="30 9 * * *"), follow=True
        )
    finally:
        holder.rollback()
        holder.close()
    assert response.status_code == 200
    assert "a run of this instance holds its lease row" in response.content.decode()
    instance.refresh_from_db()
    assert instance.cron == "0 8 * * *"


def test_the_list_shows_each_instances_health_and_filters_the_troubled_by_state(
    jobs, superuser_client
):
    @job(instances=True, name=DIGEST)
    def send_digest(run, *, tenant_id: int) -> None:
        if tenant_id == 2:
            raise RuntimeError("the tenant's mail server said no")

    for tenant in (1, 2, 3):
        send_digest.instances.upsert(
            f"t{tenant}", cron="*/15 * * * *", kwargs={"tenant_id": tenant}
        )
    loop.tick()
    fake_clock.set(datetime(2026, 11, 29, 9, 15, 5, tzinfo=UTC))
    runs = {run.job: run.outcome for run in loop.tick().runs}
    assert runs == {
        f"{DIGEST}[t1]": "succeeded",
        f"{DIGEST}[t2]": "failed",
        f"{DIGEST}[t3]": "succeeded",
    }

    html = superuser_client.get(changelist_url()).content.decode()
    text = " ".join(re.sub(r"<[^>]+>", " ", html).split())
    assert "failures in a row: 1" in text
    assert 'class="fj-badge fj-failing-warning"' in html  # its first failure
    assert keys_listed(
        superuser_client.get(changelist_url(), {"state": "failing"}).content.decode()
    ) == ["t2"]
    assert (
        keys_listed(superuser_client.get(changelist_url(), {"state": "late"}).content.decode())
        == []
    )
    # An hour later nobody ran them: every one is past its stored deadline.
    fake_clock.set(datetime(2026, 11, 29, 10, 30, tzinfo=UTC))
    late = superuser_client.get(changelist_url(), {"state": "late"}).content.decode()
    assert keys_listed(late) == ["t1", "t2", "t3"]
    assert 'class="fj-badge fj-late"' in late
    # No runner was ever seen: none reads no runner (a deployment without runner rows).
    no_runner = {"state": "no runner"}
    assert keys_listed(superuser_client.get(changelist_url(), no_runner).content.decode()) == []
    # The only runner stops: past RUNNER_TIMEOUT, every enabled instance reads no runner.
    presence = runners.Presence(registry.all(), workers=1, owner="host-a:1")
    presence.beat()
    presence.stop()
    fake_clock.advance(timedelta(seconds=31))
    gone = superuser_client.get(changelist_url(), no_runner).content.decode()
    assert keys_listed(gone) == ["t1", "t2", "t3"]
    assert 'class="fj-badge fj-no_runner"' in gone


def test_the_jobs_page_counts_each_jobs_instances_by_state_linking_to_them(jobs, superuser_client):
    @job(instances=True, name=DIGEST)
    def send_digest(run, *, tenant_id: int) -> None:
        if tenant_id == 2:
            raise RuntimeError("the tenant's mail server said no")

    for tenant in (1, 2, 3):
        send_digest.instances.upsert(
            f"t{tenant}", cron="*/15 * * * *", kwargs={"tenant_id": tenant}
        )
    send_digest.instances.upsert("t4", cron="*/15 * * * *", kwargs={"tenant_id": 4}, enabled=False)
    loop.tick()
    fake_clock.set(datetime(2026, 11, 29, 9, 15, 5, tzinfo=UTC))
    loop.tick()
    page = superuser_client.get(reverse("admin:fencedjobs_joblease_changelist"))
    (row,) = page.context["instance_jobs"]
    assert row["name"] == DIGEST
    assert 'class="fj-badge fj-failing"' in row["badge"]  # not ok while one instance is not
    assert [(c["count"], c["state"]) for c in row["counts"]] == [
        (1, "failing"),
        (2, "ok"),
        (1, "disabled"),
    ]
    failing = row["counts"][0]["url"]
    assert failing == f"{changelist_url()}?job={DIGEST}&state=failing"
    assert keys_listed(superuser_client.get(failing).content.decode()) == ["t2"]
    html = " ".join(re.sub(r"<[^>]+>", " ", page.content.decode()).split())
    assert "Jobs with instances" in html
    assert "4: 1 failing , 2 ok , 1 disabled" in html


def test_an_instances_page_runs_it_now_with_the_jobs_operate_permission(digest, superuser_client):
    digest.instances.upsert("paris", cron="0 8 * * *", kwargs={"tenant_id": 1})
    instance = JobInstance.objects.get(key="paris")
    page = superuser_client.get(change_url(instance)).content.decode()
    run_now = reverse("admin:fencedjobs_jobinstance_run_now", args=[instance.pk])
    assert f'action="{run_now}"' in page
    assert "/admin/fencedjobs/backfill/add/?job=t.digest%5Bparis%5D" in page  # Backfill
    assert "Run once" in page

    # Who may view instances but not operate jobs sees no button and cannot post.
    viewer = client_with("view_jobinstance")
    assert f'action="{run_now}"' not in viewer.get(change_url(instance)).content.decode()
    assert viewer.post(run_now).status_code == 403
    assert superuser_client.get(run_now).status_code == 403  # a POST only

    now = fake_clock()
    response = superuser_client.post(run_now, follow=True)
    said = [str(m) for m in response.context["messages"]]
    assert said == ["t.digest[paris]: made due, it will run at the next tick."], said
    assert JobLease.objects.get(name="t.digest[paris]").next_run_at == now
    assert (
        LogEntry.objects.filter(object_id=str(instance.pk))
        .latest("pk")
        .change_message.startswith("Run now: made due at")
    )
    assert "is due already" in superuser_client.post(run_now, follow=True).content.decode()
    (run,) = loop.tick().runs
    assert run.job == "t.digest[paris]"

    JobInstance.objects.filter(pk=instance.pk).update(enabled=False)
    response = superuser_client.post(run_now, follow=True)
    said = [str(m) for m in response.context["messages"]]
    assert said == ["t.digest[paris] is disabled: it does not run."], said
