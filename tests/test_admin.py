"""The admin: jobs with their health, a job's timeline, the run history, and the operations,
with Django permissions respected. Driven through Django's test client; the browser test
(test_admin_browser.py) drives a real Chromium."""

from __future__ import annotations

import ast
import re
from datetime import UTC, datetime, timedelta
from html import unescape
from pathlib import Path

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.sites import site as admin_site
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client, RequestFactory, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.html import escape

from django_fencedjobs import admin as jobs_admin
from django_fencedjobs import fenced_atomic, health, job
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.loop import tick
from django_fencedjobs.models import JobLease, JobRun, Outcome
from django_fencedjobs.registry import registry
from django_fencedjobs.schedule import Schedule
from tests.monitoring_jobs import BROKEN, FINE, STALLED, declare

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
NOW = T0 + timedelta(minutes=45)
PACKAGE = Path(jobs_admin.__file__).resolve().parent.parent


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


def text(html: str) -> str:
    """What a reader sees of some HTML: tags dropped (a ``<wbr>`` without a trace),
    whitespace collapsed."""
    return " ".join(re.sub(r"<[^>]+>", lambda tag: "" if tag[0] == "<wbr>" else " ", html).split())


def badges(html: str) -> list[tuple[str, str]]:
    """(state, job) in the order the rows appear."""
    rows = re.findall(r"<tr>.*?</tr>", html, flags=re.S)
    found = []
    for row in rows:
        state = re.search(r'class="fj-badge fj-([\w-]+)"', row)
        name = re.search(r'<th class="field-job"><a [^>]*><span class="fj-name">(.*?)</span>', row)
        if state and name:
            found.append((state.group(1), text(name.group(1))))
    return found


def slot_marks(html: str) -> list[tuple[str, str]]:
    """(kind, HH:MM:SS UTC) of each mark of a slot timeline, left to right."""
    return [
        (kind, at[11:19])
        for kind, at in re.findall(
            r'<rect class="fj-slot fj-slot-(\w+)[^"]*" data-at="([^"]+)"', html
        )
    ]


def row_of(html: str, name: str) -> str:
    """The jobs list's row of ``name`` (its first cell: the name, then its schedule)."""
    for row in re.findall(r"<tr>.*?</tr>", html, flags=re.S):
        first = re.search(r"<th [^>]*>(.*?)</th>", row, flags=re.S)
        if first and f"{text(first.group(1))} ".startswith(f"{name} "):
            return row
    raise AssertionError(f"no row for {name}")


def cell(row: str, field: str) -> str:
    found = re.search(rf'<td class="field-{field}[^"]*">(.*?)</td>', row, flags=re.S)
    assert found, field
    return found.group(1)


def test_the_job_list_shows_state_badges_with_late_and_failing_first(history, superuser_client):
    response = superuser_client.get(changelist())
    assert response.status_code == 200
    html = response.content.decode()
    assert badges(html) == [
        ("failing-critical", BROKEN),
        ("late", STALLED),
        ("ok", FINE),
        ("ok", "m.rollup"),
    ]
    assert "no successful run since 2026-11-29 09:15:00 UTC; expected by 09:42:30" in html
    assert "every 15 minutes (UTC)" in html
    assert "fencedjobs/admin.css" in html


def test_the_job_list_filters_by_state(history, superuser_client):
    html = superuser_client.get(changelist(), {"state": "late"}).content.decode()
    assert badges(html) == [("late", STALLED)]


def test_a_jobs_page_shows_its_slots_next_fire_times_and_watermark(history, superuser_client):
    html = superuser_client.get(change_page("m.rollup")).content.decode()
    assert '<svg class="fj-timeline' in html
    # Every slot since the job was first seen (09:00), then the one it now waits for.
    assert slot_marks(html) == [
        ("succeeded", "09:15:00"),
        ("succeeded", "09:30:00"),
        ("succeeded", "09:45:00"),
        ("upcoming", "10:00:00"),
    ]
    fire_times = re.search(r'<ol class="fj-fire-times">(.*?)</ol>', html, flags=re.S)
    assert fire_times and fire_times.group(1).count("<li>") == 10
    assert "2026-11-29 10:00:00 UTC" in text(fire_times.group(1))
    assert "2026-11-29 09:45:00 UTC" in text(html)  # the watermark: the last whole window's end
    assert 'name="_save"' not in html  # read-only
    assert "Run now" in html and "Pause" in html

    broken = superuser_client.get(change_page(BROKEN)).content.decode()
    assert [kind for kind, _ in slot_marks(broken)] == ["failed"] * 3 + ["upcoming"]


def test_a_slot_that_did_not_run_is_drawn_missing_and_the_lateness_window_marked(
    history, superuser_client
):
    html = superuser_client.get(change_page(STALLED)).content.decode()
    # 09:30 never ran and is past its deadline (09:42:30); 09:45 is due, not yet late.
    assert slot_marks(html) == [
        ("succeeded", "09:15:00"),
        ("absent", "09:30:00"),
        ("due", "09:45:00"),
        ("upcoming", "10:00:00"),
    ]
    assert re.search(r'class="fj-window fj-window-awaited"[^>]*data-from="[^"]*T09:30:00', html)
    assert re.search(r'class="fj-window fj-window-late"[^>]*data-from="[^"]*T09:42:30', html)
    assert "did not run" in html  # the missing slot's title says so


def test_the_slots_a_paused_job_did_not_run_are_drawn_paused_not_missing(history, superuser_client):
    superuser_client.post(operate(STALLED, "pause"))
    html = superuser_client.get(change_page(STALLED)).content.decode()
    assert slot_marks(html) == [
        ("succeeded", "09:15:00"),
        ("paused", "09:30:00"),
        ("paused", "09:45:00"),
        ("upcoming", "10:00:00"),
    ]


def test_slots_a_later_run_caught_up_are_drawn_coalesced(superuser_client):
    with (
        registry.isolated(),
        override_settings(FENCEDJOBS={"CLOCK": "django_fencedjobs.clock.fake_clock"}),
    ):

        @job("*/15 * * * *", name="m.napping")
        def napping(run):
            pass

        fake_clock.set(T0)
        tick()
        for minutes in (15, 60):  # the runner was down for 09:30 and 09:45
            fake_clock.set(T0 + timedelta(minutes=minutes))
            tick()
        html = superuser_client.get(change_page("m.napping")).content.decode()
    assert slot_marks(html) == [
        ("succeeded", "09:15:00"),
        ("coalesced", "09:30:00"),
        ("coalesced", "09:45:00"),
        ("succeeded", "10:00:00"),
        ("upcoming", "10:15:00"),
    ]
    assert "caught up by the run of 2026-11-29 10:00:00 UTC" in html


def test_slots_a_failed_run_coalesced_read_caught_up_by_its_successful_retry(superuser_client):
    """The runner was down for 09:30 and 09:45; the run of 10:00 coalesced them and failed,
    its retry redid the same interval and succeeded: the slot reads as its retry, and the two
    slots it covered read caught up by it."""
    with (
        registry.isolated(),
        override_settings(FENCEDJOBS={"CLOCK": "django_fencedjobs.clock.fake_clock"}),
    ):

        @job("*/15 * * * *", name="m.flaky", retries=1, retry_backoff=timedelta(minutes=5))
        def flaky(run):
            if run.attempt == 1 and run.scheduled_for == T0 + timedelta(hours=1):
                raise RuntimeError("attempt 1 fails")

        fake_clock.set(T0)
        tick()
        for minutes in (15, 60, 65):  # 10:00 fails, its retry at 10:05 succeeds
            fake_clock.set(T0 + timedelta(minutes=minutes))
            tick()
        html = superuser_client.get(change_page("m.flaky")).content.decode()
    assert slot_marks(html)[-5:] == [
        ("succeeded", "09:15:00"),
        ("coalesced", "09:30:00"),
        ("coalesced", "09:45:00"),
        ("retried", "10:00:00"),  # its first attempt failed: not drawn as a plain success
        ("upcoming", "10:15:00"),
    ]
    assert "succeeded after failing" in html  # the legend
    titles = slot_titles(html)
    assert titles["09:30:00"] == (
        "2026-11-29 09:30:00 UTC: did not run; caught up by the run of 2026-11-29 10:00:00 UTC"
    )
    assert titles["10:00:00"].endswith("attempt 2, caught up 2 earlier slots")


def slot_titles(html: str) -> dict[str, str]:
    """HH:MM:SS UTC of each mark of a slot timeline: its title."""
    return {
        at[11:19]: title
        for at, title in re.findall(
            r'<rect class="fj-slot[^"]*" data-at="([^"]+)"[^>]*><title>(.*?)</title>', html
        )
    }


def minutely(name: str) -> None:
    """A job every minute whose slot is late 5 min 30 s after it (timeout 30 s, grace 5 min)."""
    job("* * * * *", name=name, timeout=timedelta(seconds=30), grace=timedelta(minutes=5))(
        lambda run: None
    )


def test_every_slot_a_later_run_caught_up_on_reads_so_however_recent(superuser_client):
    """The runner was down from 14:36:45 to 14:44: the run of 14:44 coalesced the seven slots
    14:37 to 14:43, the run of 14:45 ran on time. At 14:46:10 each of the seven reads caught
    up by the run of 14:44 (on the job's page and in the list), none "due": nothing before
    the run of 14:45 is pending, however recent."""
    start = datetime(2026, 11, 29, 14, 0, tzinfo=UTC)
    with (
        registry.isolated(),
        override_settings(FENCEDJOBS={"CLOCK": "django_fencedjobs.clock.fake_clock"}),
    ):
        minutely("m.minutely")
        fake_clock.set(start - timedelta(minutes=1))
        tick()
        for minute in [*range(37), 44, 45]:
            fake_clock.set(start + timedelta(minutes=minute))
            tick()
        (caught_up,) = JobRun.objects.filter(missed_slots__gt=0)
        assert (caught_up.scheduled_for, caught_up.missed_slots) == (
            start + timedelta(minutes=44),
            7,
        )
        fake_clock.set(start + timedelta(minutes=46, seconds=10))
        page = superuser_client.get(change_page("m.minutely")).content.decode()
        jobs = superuser_client.get(changelist()).content.decode()

    expected = [
        ("succeeded", "14:36:00"),
        *(("coalesced", f"14:{minute}:00") for minute in range(37, 44)),
        ("succeeded", "14:44:00"),
        ("succeeded", "14:45:00"),
        ("due", "14:46:00"),  # no run yet, and not late before 14:51:30
        ("upcoming", "14:47:00"),
    ]
    for html in (page, jobs):
        if html is jobs:
            html = row_of(jobs, "m.minutely")
        marks = slot_marks(html)
        first = marks.index(("succeeded", "14:36:00"))
        assert marks[first : first + len(expected)] == expected
        titles = slot_titles(html)
        for minute in range(37, 44):
            assert titles[f"14:{minute}:00"] == (
                f"2026-11-29 14:{minute}:00 UTC: did not run; caught up by the run of "
                "2026-11-29 14:44:00 UTC"
            )
        assert titles["14:44:00"].endswith("caught up 7 earlier slots")


def test_a_young_jobs_timeline_starts_when_it_was_first_seen_and_says_so(superuser_client):
    """A job first seen at 12:44:30 and two minutes old: its timeline spans those two minutes
    and what it waits for, not the 96 minutes an older job every minute shows (mostly "before
    the job was first seen"), and its caption says since when."""
    first_seen = datetime(2026, 11, 29, 12, 44, 30, tzinfo=UTC)
    with (
        registry.isolated(),
        override_settings(FENCEDJOBS={"CLOCK": "django_fencedjobs.clock.fake_clock"}),
    ):
        minutely("m.young")
        fake_clock.set(first_seen)
        tick()
        for minute in (45, 46):
            fake_clock.set(first_seen.replace(minute=minute, second=0))
            tick()
        fake_clock.set(first_seen.replace(minute=46, second=40))
        html = superuser_client.get(change_page("m.young")).content.decode()

    assert slot_marks(html)[:3] == [
        ("succeeded", "12:45:00"),
        ("succeeded", "12:46:00"),
        ("upcoming", "12:47:00"),
    ]
    legend = text(re.search(r'<p class="fj-legend">(.*?)</p>', html, flags=re.S).group(1))
    assert legend.startswith(
        "Since the job was first seen, 2026-11-29 12:44:30 UTC: 2 expected slots, each at its time."
    )
    assert "The last expected slot" not in html
    assert "before the job was first seen" not in html and "fj-window-unseen" not in html
    # The axis starts when the job was first seen: its first tick, 12:45, is near the left.
    first_tick = re.search(r'<text class="fj-tick-label" x="([\d.]+)"[^>]*>(\d\d:\d\d)<', html)
    assert first_tick and first_tick.group(2) == "12:45"
    assert float(first_tick.group(1)) < timeline_width() / 4


def timeline_width() -> int:
    from django_fencedjobs.admin import timeline

    return timeline.PAGE.width


@pytest.mark.parametrize(
    ("schedule", "age", "past_slots"),
    [
        (Schedule("* * * * *"), timedelta(minutes=2), 2),
        (Schedule("*/15 * * * *"), timedelta(hours=20), 80),  # younger than the day shown
        (Schedule("30 6 * * *"), timedelta(hours=2), 0),  # its first slot is tomorrow
        (Schedule("30 6 * * *"), timedelta(days=3), 3),
    ],
)
def test_a_young_jobs_window_starts_when_it_was_first_seen_and_reaches_what_it_waits_for(
    schedule, age, past_slots
):
    from django_fencedjobs.admin import timeline

    now = datetime(2026, 11, 29, 12, 0, 30, tzinfo=UTC)
    first_seen = now - age
    awaited = schedule.next_after(first_seen)
    expected_by = awaited + timedelta(minutes=5)
    window = timeline.expected_slots(
        schedule,
        now,
        first_seen=first_seen,
        expected_by=expected_by if expected_by > now else None,
        late_after=lambda slot: slot + timedelta(minutes=5),
        size=timeline.PAGE,
    )
    assert window.start == first_seen
    assert sum(slot <= now for slot in window.slots) == past_slots
    assert window.since_first_seen
    assert window.end >= schedule.next_after(now)  # the slot it runs next is drawn
    assert window.end - window.start <= age + schedule.min_interval() + timedelta(minutes=5)


def test_a_runs_page_says_capped_only_of_a_run_that_was(history, superuser_client):
    def capped_field(run: JobRun) -> str:
        html = superuser_client.get(
            reverse("admin:fencedjobs_jobrun_change", args=[run.pk])
        ).content.decode()
        found = re.search(
            r'fieldBox field-capped[^"]*">.*?<div class="readonly">(.*?)</div>', html, flags=re.S
        )
        assert found, "no capped field"
        assert "Stopped at max_batches with work left." not in html  # no alarm as help text
        return text(found.group(1))

    run = JobRun.objects.filter(job=FINE).first()
    assert capped_field(run) == "no"
    JobRun.objects.filter(pk=run.pk).update(capped=True)
    assert capped_field(run) == (
        "capped stopped at max_batches with work left; the next run goes on from there"
    )


def test_counts_read_as_counts_one_item_one_batch_one_earlier_slot(superuser_client):
    with (
        registry.isolated(),
        override_settings(FENCEDJOBS={"CLOCK": "django_fencedjobs.clock.fake_clock"}),
    ):

        @job("*/15 * * * *", name="m.one")
        def one(run):
            with fenced_atomic():
                run.add_items(1)

        fake_clock.set(T0)
        tick()
        for minutes in (15, 45):  # the slot of 09:30 is caught up by the run of 09:45
            fake_clock.set(T0 + timedelta(minutes=minutes))
            tick()
        JobRun.objects.filter(scheduled_for=T0 + timedelta(minutes=45)).update(batches=1)
        runs = superuser_client.get(reverse("admin:fencedjobs_jobrun_changelist")).content.decode()
        page = superuser_client.get(change_page("m.one")).content.decode()
    outcomes = [
        text(found) for found in re.findall(r'<td class="field-outcome_badge">(.*?)</td>', runs)
    ]
    assert outcomes == ["succeeded 1 item, 1 batch", "succeeded 1 item, 0 batches"]
    assert "caught up 1 earlier slot" in text(runs)
    assert slot_titles(page)["09:45:00"] == (
        "2026-11-29 09:45:00 UTC: succeeded, in 0.0s, 1 item, caught up 1 earlier slot"
    )


def test_a_long_reason_is_shortened_in_the_list_with_the_whole_a_click_away(
    history, superuser_client
):
    """The jobs list shows a reason's first clauses; the whole reason is in the same cell,
    one click away (a <details>, no script), and whole on the job's page."""
    whole = health.all_health([BROKEN])[0].reason
    assert len(whole) > 70 and whole.startswith("3 consecutive failures (threshold 3); ")
    row = row_of(superuser_client.get(changelist()).content.decode(), BROKEN)
    state = cell(row, "job_state") if "field-job_state" in row else cell(row, "reason")
    shown = re.search(r"<summary>(.*?)</summary>", state, flags=re.S)
    assert shown and text(shown.group(1)).startswith("3 consecutive failures (threshold 3)… more")
    hidden = re.search(r'<div class="fj-full">(.*?)</div>', state, flags=re.S)
    assert hidden and text(hidden.group(1)) == text(escape(whole))
    page = superuser_client.get(change_page(BROKEN)).content.decode()
    reason = re.search(r'field-reason">.*?<div class="readonly">(.*?)</div>', page, flags=re.S)
    assert reason and text(reason.group(1)) == text(escape(whole))


@pytest.mark.parametrize(
    ("schedule", "slots", "whole_day"),
    [
        (Schedule("*/15 * * * *"), 96, True),  # a day of a job every 15 minutes
        (Schedule("0 * * * *", timezone="Europe/Berlin"), 24, True),
        (Schedule(every=timedelta(minutes=1)), 96, False),  # the last 96 minutes
        (Schedule("30 6 * * *"), 30, False),  # the last month of a daily job
        (Schedule("0 9 * * 1-5", timezone="America/New_York"), 30, False),
    ],
)
def test_a_timeline_shows_the_last_day_or_the_last_slots_whichever_reads_better(
    schedule, slots, whole_day
):
    from django_fencedjobs.admin import timeline

    window = timeline.expected_slots(
        schedule,
        NOW,
        first_seen=NOW - timedelta(days=400),
        expected_by=None,
        late_after=lambda slot: slot + timedelta(minutes=5),
        size=timeline.PAGE,
    )
    past = [slot for slot in window.slots if slot <= NOW]
    assert (len(past), window.day) == (slots, whole_day)
    assert past == schedule.fire_times(window.start, NOW)  # every slot, none invented
    assert window.start < past[0] and window.end >= NOW
    # Slots before the job was first seen are not expected.
    recent = timeline.expected_slots(
        schedule,
        NOW,
        first_seen=past[-3],
        expected_by=None,
        late_after=lambda slot: slot + timedelta(minutes=5),
        size=timeline.PAGE,
    )
    assert [slot for slot in recent.slots if slot <= NOW] == past[-2:]


def test_the_job_list_shows_a_compact_slot_timeline_per_job(history, superuser_client):
    html = superuser_client.get(changelist()).content.decode()
    stalled = row_of(html, STALLED)
    assert '<svg class="fj-timeline fj-compact' in stalled
    assert [kind for kind, _ in slot_marks(stalled)] == ["succeeded", "absent", "due", "upcoming"]
    assert [kind for kind, _ in slot_marks(row_of(html, FINE))] == ["succeeded"] * 3 + ["upcoming"]


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
    # The admin capitalises a message's first letter: it must not be a job's name.
    assert f"Paused: {STALLED}." in response.content.decode()
    superuser_client.post(operate(STALLED, "resume"))
    assert not JobLease.objects.get(name=STALLED).paused
    assert [e.get_change_message() for e in LogEntry.objects.order_by("pk")] == [
        "Paused.",
        "Resumed.",
    ]


def messages_of(response) -> list[str]:
    """The admin's messages on the page, as the user reads them."""
    return [
        unescape(" ".join(message.split()))
        for message in re.findall(
            r'<li class="(?:success|warning|error)">(.*?)</li>',
            response.content.decode(),
            flags=re.S,
        )
    ]


@pytest.mark.parametrize(
    ("operation", "verb"), [("run-now", "made due"), ("pause", "paused"), ("resume", "resumed")]
)
def test_an_operation_on_a_busy_row_says_busy_not_that_nothing_was_to_do(
    history, superuser_client, operation, verb
):
    """A run inside a fenced transaction keeps the job's lease row locked: the operation
    waits db.LOCK_WAIT, changes nothing, and says so; it is not "already due", nor
    silence."""
    from tests.test_operations_command import RowLock

    if operation == "resume":
        superuser_client.post(operate(FINE, "pause"), follow=True)
    before = JobLease.objects.get(name=FINE)
    with RowLock(FINE):
        response = superuser_client.post(operate(FINE, operation), follow=True)
    assert messages_of(response) == [
        f"Busy, not {verb}: {FINE} (a run kept the job's lease row locked inside a fenced "
        "transaction for 2s); try again."
    ]
    after = JobLease.objects.get(name=FINE)
    assert (after.paused, after.next_run_at) == (before.paused, before.next_run_at)
    assert LogEntry.objects.filter(change_message__contains="Run now").count() == 0


def test_run_now_on_a_due_job_and_pause_on_a_paused_one_say_there_was_nothing_to_do(
    history, superuser_client
):
    superuser_client.post(operate(FINE, "run-now"), follow=True)
    response = superuser_client.post(operate(FINE, "run-now"), follow=True)
    assert messages_of(response) == [f"Nothing to do for {FINE} (already due)."]
    superuser_client.post(operate(FINE, "pause"), follow=True)
    response = superuser_client.post(operate(FINE, "pause"), follow=True)
    assert messages_of(response) == [f"Nothing to do for {FINE} (already paused)."]


def test_skip_the_next_slot_is_an_action_and_is_logged(history, superuser_client):
    pk = JobLease.objects.get(name=FINE).pk
    response = superuser_client.post(
        changelist(), {"action": "skip_next_slot", "_selected_action": [pk]}, follow=True
    )
    assert messages_of(response) == [f"Skipped the next slot: {FINE}."]
    assert JobLease.objects.get(name=FINE).next_run_at == T0 + timedelta(hours=1, minutes=15)
    (entry,) = LogEntry.objects.all()
    assert entry.get_change_message().startswith(
        f"Skip: skipped the slot 2026-11-29 10:00:00 UTC of {FINE}: next run "
        "2026-11-29 10:15:00 UTC"
    )


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
    assert html.count('class="field-slot') == JobRun.objects.count() == 10
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
    assert by_job.count('class="field-slot') == 3
    by_outcome = superuser_client.get(url, {"outcome__exact": "failed"}).content.decode()
    assert by_outcome.count('class="field-slot') == 3
    today = superuser_client.get(
        url,
        {
            "scheduled_for__gte": "2026-11-29 00:00:00+00:00",
            "scheduled_for__lt": "2026-11-30 00:00:00+00:00",
        },
    )
    assert today.content.decode().count('class="field-slot') == 10


def test_every_instant_is_shown_to_the_second_in_the_jobs_zone_and_a_utc_one_once(
    superuser_client,
):
    slot = datetime(2026, 12, 1, 5, 38, tzinfo=UTC)
    with (
        registry.isolated(),
        # The project's zone is not the jobs': the admin must not use it.
        override_settings(
            FENCEDJOBS={"CLOCK": "django_fencedjobs.clock.fake_clock"},
            TIME_ZONE="America/New_York",
        ),
    ):
        job("*/15 * * * *", name="m.berlin", timezone="Europe/Berlin")(lambda run: None)
        job("*/15 * * * *", name="m.utc")(lambda run: None)
        fake_clock.set(slot - timedelta(hours=1))
        tick()
        for name, start in (("m.berlin", slot), ("m.berlin", slot + timedelta(seconds=30))):
            JobRun.objects.create(
                job=name,
                scheduled_for=start,
                started_at=start + timedelta(seconds=1),
                finished_at=start + timedelta(seconds=3),
                outcome=Outcome.SUCCEEDED,
            )
        JobRun.objects.create(
            job="m.utc",
            scheduled_for=slot,
            started_at=slot + timedelta(seconds=2),
            finished_at=slot + timedelta(seconds=3),
            outcome=Outcome.SUCCEEDED,
        )
        runs = superuser_client.get(reverse("admin:fencedjobs_jobrun_changelist")).content.decode()
        jobs = superuser_client.get(changelist()).content.decode()
        run = JobRun.objects.get(job="m.berlin", scheduled_for=slot)
        run_page = superuser_client.get(
            reverse("admin:fencedjobs_jobrun_change", args=[run.pk])
        ).content.decode()

    assert "a.m." not in runs and "Dec." not in runs
    # Two runs 30 seconds apart read differently, in the job's zone, with UTC below.
    slots = [text(cell) for cell in re.findall(r'<th class="field-slot">(.*?)</th>', runs, re.S)]
    assert "2026-12-01 06:38:00 Europe/Berlin 2026-12-01 05:38:00 UTC" in slots
    assert "2026-12-01 06:38:30 Europe/Berlin 2026-12-01 05:38:30 UTC" in slots
    assert re.search(
        r'<span class="fj-utc"><span class="fj-nw">2026-12-01 05:38:30</span> UTC', runs
    )
    # A UTC job's instant is written once.
    assert "2026-12-01 05:38:00 UTC" in slots  # m.utc's slot
    # A start on its slot's day is its time (the slot beside it has the date), in the
    # job's zone and in UTC; a UTC job's once.
    starts = [
        text(cell) for cell in re.findall(r'<td class="field-started">(.*?)</td>', runs, re.S)
    ]
    assert sorted(starts) == ["05:38:02", "06:38:01 05:38:01 UTC", "06:38:31 05:38:31 UTC"]
    # The jobs list: the next run in each job's zone, once for a UTC job.
    berlin_next = cell(row_of(jobs, "m.berlin"), "next_run")
    assert "2026-12-01 05:45:00 Europe/Berlin" in text(berlin_next)
    assert re.search(
        r'<span class="fj-utc"><span class="fj-nw">2026-12-01 04:45:00</span> UTC', berlin_next
    )
    utc_next = cell(row_of(jobs, "m.utc"), "next_run")
    assert text(utc_next) == "2026-12-01 04:45:00 UTC"
    assert 'class="fj-utc"' not in utc_next
    # A run's own page: every instant whole.
    assert "a.m." not in run_page
    assert "2026-12-01 06:38:01 Europe/Berlin" in text(run_page)  # started
    assert "2026-12-01 06:38:03 Europe/Berlin" in text(run_page)  # finished


def test_an_abandoned_run_shows_no_duration(history, superuser_client):
    JobRun.objects.create(
        job=FINE,
        scheduled_for=T0 - timedelta(minutes=15),
        started_at=T0 - timedelta(minutes=15),
        finished_at=T0,
        outcome=Outcome.ABANDONED,
    )
    html = superuser_client.get(
        reverse("admin:fencedjobs_jobrun_changelist"), {"outcome__exact": "abandoned"}
    ).content.decode()
    assert re.search(r'<td class="field-duration_text">-</td>', html)
    assert "900.000s" not in html


def test_the_jobs_views_decide_health_once_and_render_lazily(history, monkeypatch):
    """Django renders a TemplateResponse after the view returns (middleware may still change
    its context): the columns must not depend on anything that ends with the view."""
    calls = []
    real = health.all_health

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(health, "all_health", counted)
    user = User.objects.create_superuser("lazy", "lazy@example.com", "pw")
    model_admin = admin_site._registry[JobLease]
    request = RequestFactory().get(changelist())
    request.user = user
    request._messages = None  # no message is expected
    response = model_admin.changelist_view(request)
    assert not response.is_rendered
    html = response.render().content.decode()
    assert badges(html) == [
        ("failing-critical", BROKEN),
        ("late", STALLED),
        ("ok", FINE),
        ("ok", "m.rollup"),
    ]
    assert len(calls) == 1

    calls.clear()
    request = RequestFactory().get(change_page(STALLED))
    request.user = user
    pk = str(JobLease.objects.get(name=STALLED).pk)
    response = model_admin.change_view(request, pk)
    assert not response.is_rendered
    html = response.render().content.decode()
    assert 'class="fj-badge fj-late"' in html
    assert len(calls) == 1


def test_the_lists_cost_the_same_queries_for_few_jobs_and_runs_or_many(superuser_client):
    def queries(url: str) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert superuser_client.get(url).status_code == 200
        return len(captured)

    runs_url = reverse("admin:fencedjobs_jobrun_changelist")
    with (
        registry.isolated(),
        override_settings(FENCEDJOBS={"CLOCK": "django_fencedjobs.clock.fake_clock"}),
    ):
        job("*/15 * * * *", name="m.q00")(lambda run: None)
        fake_clock.set(T0)
        tick()
        fake_clock.set(T0 + timedelta(minutes=15))
        tick()
        few = queries(changelist()), queries(runs_url)
        for n in range(1, 20):
            job("*/15 * * * *", name=f"m.q{n:02d}")(lambda run: None)
        for minutes in (30, 45, 60):
            fake_clock.set(T0 + timedelta(minutes=minutes))
            tick()
        assert JobRun.objects.count() > 40
        many = queries(changelist()), queries(runs_url)
    assert many == few


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
    from django_fencedjobs.admin.paginator import EstimatedCountPaginator

    monkeypatch.setattr(EstimatedCountPaginator, "exact_below", 2)
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

    admin_package = PACKAGE / "admin"
    admin_modules = sorted(admin_package.glob("*.py"))
    assert {path.name for path in admin_modules} >= {"__init__.py", "paginator.py", "timeline.py"}
    for path in admin_modules:
        assert not any(name.startswith("django_fencedjobs.management") for name in imports(path))
    for path in PACKAGE.rglob("*.py"):
        if admin_package not in path.parents:
            assert not any(name.startswith("django_fencedjobs.admin") for name in imports(path)), (
                path
            )
    # The paginator is generic: it knows nothing of jobs or runs.
    assert not any(
        name.startswith("django_fencedjobs") for name in imports(admin_package / "paginator.py")
    )
    # No request-scoped cache: the health of a row comes with the row.
    source = "\n".join(path.read_text() for path in admin_modules)
    assert "ContextVar" not in source


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
    last_run = text(cell(row_of(html, "m.busy"), "last_outcome"))
    # Started at 09:15:00; lease_ttl 2 minutes.
    fence = JobRun.objects.get(job="m.busy").fence
    assert last_run == (
        f"running 2026-11-29 09:15:00 UTC worker-1 (fence {fence}), lease until 09:17:00"
    )


def test_a_job_removed_from_code_is_listed_as_removed_and_cannot_be_run(history, superuser_client):
    JobLease.objects.create(name="m.retired", next_run_at=T0, created_at=T0 - timedelta(days=30))
    html = superuser_client.get(changelist()).content.decode()
    assert ("removed", "m.retired") in badges(html)
    response = superuser_client.post(operate("m.retired", "run-now"), follow=True)
    assert "not declared in code" in response.content.decode()
    assert not LogEntry.objects.exists()
