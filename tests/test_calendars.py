"""Calendars: holidays and blackout windows as data that a job's slots avoid. The rules
against a model written from the ``holidays`` package and zoneinfo, across both DST
transitions of Europe/Berlin and America/New_York; a job's excluded slots recorded as such
and never late; a calendar that does not exist failing loudly; the checks. In one process
on the fake clock, on every database."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from io import StringIO
from zoneinfo import ZoneInfo

import holidays
import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from django_fencedjobs import calendars, checks, job, loop
from django_fencedjobs.checkids import CheckId
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.health import State, job_health
from django_fencedjobs.models import (
    Calendar,
    CalendarExclusion,
    JobInstance,
    JobLease,
    JobRun,
    Outcome,
)
from django_fencedjobs.schedule import Schedule

pytestmark = pytest.mark.django_db(transaction=True)


def _calendar(name: str, zone: str = "UTC", country: str = "", sub: str = "", **rules):
    calendar = Calendar.objects.create(
        name=name, timezone=zone, holidays_country=country, holidays_subdivision=sub
    )
    for label, fields in rules.items():
        CalendarExclusion.objects.create(calendar=calendar, label=label, **fields)
    return calendar


def test_each_kind_of_rule_matches_the_wall_clock_it_says():
    rule = calendars.Rule
    at = datetime(2026, 12, 24, 23, 30)  # a Thursday
    assert rule("d", on_date=date(2026, 12, 24)).matches(at)
    assert not rule("d", on_date=date(2026, 12, 25)).matches(at)
    assert rule("y", month=12, day=24).matches(at.replace(year=2031))
    assert rule("w", weekday=3).matches(at) and not rule("w", weekday=4).matches(at)
    window = rule("night", starts=time(22), ends=time(2))  # past midnight
    assert window.matches(at) and window.matches(at + timedelta(hours=2, minutes=29))
    assert not window.matches(at + timedelta(hours=2, minutes=30))  # 02:00: over
    assert not window.matches(at.replace(hour=21, minute=59))
    # A window on a weekday: its part after midnight belongs to the day it started on.
    friday_night = rule("fri", weekday=4, starts=time(22), ends=time(2))
    assert friday_night.matches(datetime(2026, 12, 26, 1, 0))  # Saturday 01:00
    assert not friday_night.matches(datetime(2026, 12, 25, 1, 0))  # Friday 01:00: Thursday's


#: The only slots of 2026 that run: where DST moves a slot out of the window
#: ("02:30" in Berlin on 29 March is 03:00, after a 02:00-03:00 window).
_ALLOWED_BY_DST = {
    "Europe/Berlin": [datetime(2026, 3, 29, 1, 0, tzinfo=UTC)],
    "America/New_York": [datetime(2026, 3, 8, 7, 0, tzinfo=UTC)],
}


@pytest.mark.parametrize(
    ("zone", "country", "sub", "cron", "window"),
    [
        ("Europe/Berlin", "DE", "BY", "30 2 * * *", (time(2), time(3))),
        ("America/New_York", "US", "NY", "0 2 * * *", (time(2), time(2, 30))),
        ("Europe/Berlin", "DE", "", "0 */4 * * *", (time(3, 30), time(4, 30))),
    ],
)
def test_a_year_of_slots_is_excluded_exactly_as_the_holidays_and_windows_say(
    zone, country, sub, cron, window
):
    """Every slot of 2026 (both DST transitions included), judged by the calendars and by
    a model written here from the holidays package and zoneinfo alone: the same verdicts.
    A daily slot inside a nightly window runs only where DST moves it out."""
    starts, ends = window
    _calendar(
        "cal",
        zone,
        country,
        sub,
        night={"starts": starts, "ends": ends},
        maintenance={"weekday": 5, "starts": time(23), "ends": time(3)},
        company={"month": 12, "day": 24},
    )
    book = calendars.load(["cal"])
    tz = ZoneInfo(zone)
    public = holidays.country_holidays(country, subdiv=sub or None, years=2026)
    schedule = Schedule(cron=cron, timezone=zone)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    slots = schedule.fire_times(start, start + timedelta(days=365))
    assert len(slots) > 300

    def model(instant: datetime) -> bool:
        wall = instant.astimezone(tz)
        minutes = wall.hour * 60 + wall.minute
        saturday_night = (wall.weekday() == 5 and minutes >= 23 * 60) or (
            wall.weekday() == 6 and minutes < 3 * 60
        )
        return (
            wall.date() in public
            or (wall.month, wall.day) == (12, 24)
            or starts.hour * 60 + starts.minute <= minutes < ends.hour * 60 + ends.minute
            or saturday_night
        )

    verdicts = [book.verdict(["cal"], slot) for slot in slots]
    assert [v is not None for v in verdicts] == [model(slot) for slot in slots]
    assert {v[0] for v in verdicts if v} == {Outcome.EXCLUDED}
    if cron.startswith("0 */4"):
        assert sum(v is not None and "night" in v[1] for v in verdicts) > 300
        noon = datetime(2026, 12, 25, 11, 0, tzinfo=UTC)  # 12:00 in Berlin: no window
        assert book.verdict(["cal"], noon) == (
            Outcome.EXCLUDED,
            "calendar 'cal': Christmas Day",
            None,
        )
    else:
        assert [slot for slot, v in zip(slots, verdicts, strict=True) if v is None] == (
            _ALLOWED_BY_DST[zone]
        )


def _weekday_job(**options):
    seen: list[datetime] = []

    @job("0 6 * * 1-5", name="t.payroll", timezone="Europe/Berlin", **options)
    def payroll(run):
        seen.append(run.scheduled_for)

    return seen


def test_an_excluded_slot_is_recorded_as_such_not_run_and_never_late(jobs):
    _calendar("de", "Europe/Berlin", "DE")
    seen = _weekday_job(exclude=["de"])
    fake_clock.set(datetime(2026, 12, 24, 12, 0, tzinfo=UTC))
    loop.tick()  # its row: next slot Friday 25 December, 06:00 in Berlin
    fake_clock.set(datetime(2026, 12, 25, 5, 0, 5, tzinfo=UTC))
    loop.tick()
    assert seen == []
    (run,) = JobRun.objects.filter(job="t.payroll")
    assert (run.outcome, run.started_at, run.error) == (
        Outcome.EXCLUDED,
        None,
        "calendar 'de': Christmas Day",
    )
    row = JobLease.objects.get(name="t.payroll")
    assert row.next_run_at == datetime(2026, 12, 28, 5, 0, tzinfo=UTC)  # Monday
    assert row.consecutive_failures == 0
    # Long past the excluded slot's deadline: not late, the next slot is awaited.
    fake_clock.set(datetime(2026, 12, 27, 12, 0, tzinfo=UTC))
    health = job_health("t.payroll")
    assert health.state not in (State.LATE, State.FAILING), health.reason
    assert health.awaited_slot == datetime(2026, 12, 28, 5, 0, tzinfo=UTC)
    assert health.reason.endswith("was excluded by calendar 'de': Christmas Day"), health.reason
    fake_clock.set(datetime(2026, 12, 28, 5, 0, 5, tzinfo=UTC))
    loop.tick()
    assert seen == [datetime(2026, 12, 28, 5, 0, tzinfo=UTC)]


def test_an_instance_avoids_its_jobs_calendars_and_its_own(jobs):
    _calendar("de", "Europe/Berlin", "DE")
    _calendar("quiet", "Europe/Berlin", monday={"weekday": 0})
    seen: list[tuple[str, datetime]] = []

    @job(instances=True, name="t.digest", exclude=["de"])
    def digest(run):
        seen.append((run.job.key, run.scheduled_for))

    fake_clock.set(datetime(2026, 12, 24, 12, 0, tzinfo=UTC))
    for key, own in (("a", []), ("b", ["quiet"])):
        JobInstance.objects.create(
            job="t.digest", key=key, cron="0 6 * * *", timezone="Europe/Berlin", exclude=own
        )
    loop.tick()
    for day in (25, 26, 27, 28):
        fake_clock.set(datetime(2026, 12, day, 5, 0, 5, tzinfo=UTC))
        loop.tick()
    assert sorted(seen) == [
        ("a", datetime(2026, 12, 27, 5, 0, tzinfo=UTC)),  # 25, 26: holidays
        ("a", datetime(2026, 12, 28, 5, 0, tzinfo=UTC)),
        ("b", datetime(2026, 12, 27, 5, 0, tzinfo=UTC)),  # 28: a Monday
    ]
    excluded = JobRun.objects.filter(job="t.digest[b]", outcome=Outcome.EXCLUDED)
    assert sorted(excluded.values_list("error", flat=True)) == [
        "calendar 'de': Christmas Day",
        "calendar 'de': Second Day of Christmas",
        "calendar 'quiet': monday",
    ]


def test_an_instance_defers_the_slots_its_own_calendar_excludes_when_its_job_says_so(jobs):
    """A job with instances and no calendar of its own, ``defer_excluded=True``: each
    instance's slot that its own calendar excludes runs at the next allowed time, through
    the batch claim of instances."""
    _calendar("dawn", "Europe/Berlin", early={"starts": time(6), "ends": time(6, 30)})
    seen: list[tuple[str, datetime, int]] = []

    @job(instances=True, name="t.digest", defer_excluded=True)
    def digest(run):
        seen.append((run.job.key, run.scheduled_for, run.attempt))

    fake_clock.set(datetime(2026, 12, 24, 12, 0, tzinfo=UTC))
    for key, own in (("a", []), ("b", ["dawn"])):
        JobInstance.objects.create(
            job="t.digest", key=key, cron="0 6 * * *", timezone="Europe/Berlin", exclude=own
        )
    loop.tick()
    six = datetime(2026, 12, 25, 5, 0, tzinfo=UTC)  # 06:00 in Berlin
    for at in (six, six + timedelta(minutes=30)):
        fake_clock.set(at + timedelta(seconds=5))
        loop.tick()
    assert sorted(seen) == [("a", six, 1), ("b", six, 2)]  # b's at 06:30, the window's end
    (b,) = JobRun.objects.filter(job="t.digest[b]", attempt=2)
    assert b.started_at == six + timedelta(minutes=30, seconds=5)
    (excluded,) = JobRun.objects.filter(job="t.digest[b]", outcome=Outcome.EXCLUDED)
    assert excluded.error == "calendar 'dawn': early; deferred to 2026-12-25 06:30:00 Europe/Berlin"


def test_a_calendar_that_does_not_exist_fails_each_slot_loudly(jobs):
    seen = _weekday_job(exclude=["nowhere"])
    fake_clock.set(datetime(2026, 12, 1, 12, 0, tzinfo=UTC))
    loop.tick()
    fake_clock.set(datetime(2026, 12, 2, 5, 0, 5, tzinfo=UTC))
    loop.tick()
    assert seen == []
    (run,) = JobRun.objects.filter(job="t.payroll")
    assert (run.outcome, run.error) == (
        Outcome.FAILED,
        "Not run: calendar 'nowhere' does not exist.",
    )
    assert JobLease.objects.get(name="t.payroll").consecutive_failures == 1
    # One whose zone is no longer known (written past clean()) fails the same way.
    Calendar.objects.create(name="nowhere", timezone="Mars/Olympus")
    assert calendars.load(["nowhere"]).verdict(["nowhere"], run.scheduled_for)[:2] == (
        Outcome.FAILED,
        "Not run: calendar 'nowhere' has an unknown timezone.",
    )


def test_the_database_check_names_a_missing_calendar_and_one_that_excludes_every_slot(jobs):
    _calendar("weekend", "Europe/Berlin", sat={"weekday": 5}, sun={"weekday": 6})

    @job("0 6 * * 6,0", name="t.never", exclude=["weekend"])
    def never(run):
        pass

    @job("0 6 * * *", name="t.typo", exclude=["weekdn"])
    def typo(run):
        pass

    @job("0 6 * * *", name="t.fine", exclude=["weekend"])
    def fine(run):
        pass

    # Each Sunday's slot is deferred to Monday (Saturday's would reach Sunday's slot): runs.
    @job("0 6 * * 6,0", name="t.deferred", exclude=["weekend"], defer_excluded=True)
    def deferred(run):
        pass

    @job(instances=True, name="t.digest")
    def digest(run):
        pass

    # Written with the ORM, past the form's check.
    JobInstance.objects.create(job="t.digest", key="a", cron="0 6 * * *", exclude=["nope"])
    JobInstance.objects.create(job="t.digest", key="b", cron="0 6 * * *")
    assert checks.check_calendars() == []  # without the database: nothing asked
    found = sorted((m.id, m.msg) for m in checks.check_calendars(databases=["default"]))
    assert [check_id for check_id, _ in found] == [
        CheckId.CALENDAR,
        CheckId.CALENDAR,
        CheckId.CALENDAR_EXCLUDES_ALL,
    ]
    assert found[0][1] == "job 't.digest[a]': calendar 'nope' does not exist."
    assert found[1][1] == "job 't.typo': calendar 'weekdn' does not exist."
    assert found[2][1].startswith("job 't.never': its calendars exclude every one of its next")


def test_a_calendar_and_its_rows_refuse_what_means_nothing():
    with pytest.raises(ValidationError, match="not a known IANA zone"):
        Calendar(name="x", timezone="Mars/Olympus").full_clean()
    with pytest.raises(ValidationError, match="needs its country"):
        Calendar(name="x", holidays_subdivision="BY").full_clean()
    with pytest.raises(ValidationError, match="does not know this country"):
        Calendar(name="x", holidays_country="XX").full_clean()
    calendar = _calendar("ok")
    for fields, message in (
        ({}, "excludes nothing"),
        ({"month": 2}, "needs both its month and its day"),
        ({"month": 2, "day": 30}, "is no date"),
        ({"starts": time(1)}, "needs both its start and its end"),
        ({"starts": time(1), "ends": time(1)}, "ends when it starts"),
    ):
        with pytest.raises(ValidationError, match=message):
            CalendarExclusion(calendar=calendar, **fields).full_clean()
    CalendarExclusion(calendar=calendar, month=2, day=29).full_clean()


def test_the_admin_edits_a_calendar_and_a_jobs_page_names_its_calendars(jobs):
    _calendar("de", "Europe/Berlin", "DE", "BY")
    _weekday_job(exclude=["de"], defer_excluded=True)
    loop.tick()
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw"))
    calendar = Calendar.objects.get(name="de")
    page = client.get(reverse("admin:fencedjobs_calendar_change", args=[calendar.pk]))
    assert page.status_code == 200
    text = page.content.decode()
    assert "Corpus Christi" in text  # a holiday of Bavaria's, not of every German state
    assert "t.payroll" in text  # named by
    lease = JobLease.objects.get(name="t.payroll")
    page = client.get(reverse("admin:fencedjobs_joblease_change", args=[lease.pk]))
    assert page.status_code == 200
    assert ">de</a><br>an excluded slot runs at the next allowed time" in page.content.decode()


def test_the_instance_preview_marks_excluded_slots_and_the_form_refuses_an_unknown_calendar(
    jobs,
):
    _calendar("de", "Europe/Berlin", "DE")

    @job(instances=True, name="t.digest", timeout=timedelta(seconds=30))
    def digest(run):
        pass

    fake_clock.set(datetime(2026, 12, 23, 12, 0, tzinfo=UTC))
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw"))
    fields = {"job": "t.digest", "key": "a", "cron": "0 6 * * *", "timezone": "Europe/Berlin"}
    url = reverse("admin:fencedjobs_jobinstance_preview")
    answer = client.get(url, {**fields, "exclude": '["de"]'}).json()
    marked = [(t["local"][:10], t["kind"], t["note"]) for t in answer["times"][:4]]
    assert marked == [
        ("2026-12-24", "", ""),
        ("2026-12-25", "excluded", "excluded: calendar 'de': Christmas Day"),
        ("2026-12-26", "excluded", "excluded: calendar 'de': Second Day of Christmas"),
        ("2026-12-27", "", ""),
    ]
    assert "Christmas Day" in answer["html"]
    answer = client.get(url, {**fields, "exclude": '["nowhere"]'}).json()
    assert (answer["field"], answer["error"]) == (
        "exclude",
        "calendar 'nowhere' does not exist (fencedjobs.E018)",
    )
    with pytest.raises(ValidationError) as refused:
        JobInstance(exclude=["nowhere"], **fields).full_clean()
    assert refused.value.message_dict == {
        "exclude": ["calendar 'nowhere' does not exist (fencedjobs.E018)"]
    }


def test_runjobs_list_names_the_calendars_and_marks_an_excluded_slot(jobs):
    _calendar("early", "Europe/Berlin", dawn={"starts": time(5), "ends": time(7)})
    _weekday_job(exclude=["early"])
    out = StringIO()
    call_command("runjobs", "--list", stdout=out)
    text = out.getvalue()
    assert "  avoids the calendars: early" in text
    nexts = [line for line in text.splitlines() if line.startswith("  next: ")]
    assert len(nexts) == 3
    assert all(line.endswith("(excluded: calendar 'early': dawn)") for line in nexts), nexts


def test_upsert_gives_an_instance_calendars_of_its_own(jobs):
    _calendar("nl", "Europe/Amsterdam", "NL")

    @job(instances=True, name="t.digest")
    def digest(run):
        pass

    instance = digest.instances.upsert("t-1", cron="0 6 * * *", exclude=["nl"])
    assert instance.exclude == ["nl"]
    with pytest.raises(ValidationError, match=r"fencedjobs\.E018"):
        digest.instances.upsert("t-2", cron="0 6 * * *", exclude=["xx"])
    assert list(JobInstance.objects.values_list("key", flat=True)) == ["t-1"]


def _first_business_day(year: int, month: int, public) -> date:
    day = date(year, month, 1)
    while day.weekday() >= 5 or day in public:
        day += timedelta(days=1)
    return day


def test_a_deferred_slot_runs_on_the_first_business_day_at_its_own_time_as_the_model_says(jobs):
    """``0 6 1 * *`` in Berlin avoiding weekends and Bavaria's holidays, deferred: for every
    month of 2026 and 2027 (both DST changes each year), the 1st runs at 06:00 on the first
    business day on or after it, by a model written from the holidays package alone."""
    _calendar("bavaria", "Europe/Berlin", "DE", "BY", sat={"weekday": 5}, sun={"weekday": 6})

    @job("0 6 1 * *", timezone="Europe/Berlin", exclude=["bavaria"], defer_excluded=True)
    def payroll(run):
        pass

    book = calendars.load(["bavaria"])
    berlin = ZoneInfo("Europe/Berlin")
    public = holidays.country_holidays("DE", subdiv="BY", years=[2026, 2027])
    deferred = 0
    for year in (2026, 2027):
        for month in range(1, 13):
            slot = datetime(year, month, 1, 6, tzinfo=berlin).astimezone(UTC)
            verdict = calendars.judge(book, payroll.job, slot)
            runs_on = _first_business_day(year, month, public)
            if runs_on.day == 1:
                assert verdict is None, slot
                continue
            deferred += 1
            assert verdict.outcome == Outcome.EXCLUDED
            assert verdict.deferred_to == datetime.combine(runs_on, time(6), berlin), slot
            assert verdict.why.endswith(f"deferred to {runs_on} 06:00:00 Europe/Berlin")
    assert deferred >= 8  # New Year's Day, 1 May, weekends


@pytest.mark.parametrize(
    ("zone", "cron", "window"),
    [
        # Sundays 01:00-03:00 in New York; 8 March skips 02:00-03:00, 1 November repeats
        # 01:00-02:00: a 01:30 slot is moved to the window's end, 03:00, both days.
        ("America/New_York", "30 1 * * *", (time(1), time(3))),
        # Sundays 01:00-02:30 in Berlin; on 29 March 02:30 does not exist: the window ends
        # at the first instant after the gap, 03:00 CEST.
        ("Europe/Berlin", "15 1 * * *", (time(1), time(2, 30))),
    ],
)
def test_a_slot_deferred_out_of_a_window_runs_at_the_first_minute_after_it_across_dst(
    zone, cron, window
):
    """Every slot of 2026, judged with ``defer_excluded``: a Sunday slot inside the window
    runs at the first instant after it, by a model that walks the minutes of real time
    and reads each on the wall clock (zoneinfo alone); any other slot runs as scheduled."""
    starts, ends = window
    _calendar("night", zone, sunday={"weekday": 6, "starts": starts, "ends": ends})

    @job(cron, name="t.nightly", timezone=zone, exclude=["night"], defer_excluded=True)
    def nightly(run):
        pass

    from django_fencedjobs.registry import registry

    nightly_job = registry.get("t.nightly")
    tz = ZoneInfo(zone)
    book = calendars.load(["night"])

    def excluded(instant: datetime) -> bool:
        wall = instant.astimezone(tz)
        return wall.weekday() == 6 and starts <= wall.time().replace(tzinfo=None) < ends

    start = datetime(2026, 1, 1, tzinfo=UTC)
    slots = nightly_job.valid_schedule.fire_times(start, start + timedelta(days=365))
    moved = 0
    for slot in slots:
        verdict = calendars.judge(book, nightly_job, slot)
        if not excluded(slot):
            assert verdict is None, slot
            continue
        expected = slot
        while excluded(expected):
            expected += timedelta(minutes=1)
        assert verdict is not None and verdict.deferred_to == expected, slot
        moved += 1
    assert moved == 52
    sundays = {
        "America/New_York": [(date(2026, 3, 8), 7), (date(2026, 11, 1), 8)],
        # 02:30 first happens at 00:30 UTC on 25 October (CEST), the first instant after.
        "Europe/Berlin": [(date(2026, 3, 29), 1), (date(2026, 10, 25), 0.5)],
    }
    for day, utc_hours in sundays[zone]:  # the DST Sundays, spelled out
        (slot,) = [s for s in slots if s.astimezone(tz).date() == day]
        verdict = calendars.judge(book, nightly_job, slot)
        expected = datetime.combine(day, time(0), UTC) + timedelta(hours=utc_hours)
        assert verdict.deferred_to == expected, day


def _payroll_of_the_1st(**options):
    """A job run on the 1st of each month at 06:00 in Berlin, not on weekends, deferred."""
    _calendar("weekend", "Europe/Berlin", sat={"weekday": 5}, sun={"weekday": 6})
    seen: list[tuple[datetime, int]] = []

    @job(
        "0 6 1 * *",
        name="t.payroll",
        timezone="Europe/Berlin",
        exclude=["weekend"],
        defer_excluded=True,
        **options,
    )
    def payroll(run):
        seen.append((run.scheduled_for, run.attempt))
        if options.get("retries") and len(seen) == 1:
            raise RuntimeError("the bank's server is down")

    return seen


AUG_1 = datetime(2026, 8, 1, 4, 0, tzinfo=UTC)  # a Saturday, 06:00 in Berlin
AUG_3 = datetime(2026, 8, 3, 4, 0, tzinfo=UTC)  # the Monday after


def test_a_deferred_slot_runs_at_its_new_time_is_awaited_there_and_its_retry_follows(jobs):
    """The 1st is a Saturday: the slot is recorded excluded, naming where it went; its run
    comes on Monday at 06:00 as the slot's next attempt (not missed by a starting deadline
    counted from Saturday), health awaits it there, and its failure is retried."""
    seen = _payroll_of_the_1st(starting_deadline=timedelta(minutes=10), retries=1)
    fake_clock.set(datetime(2026, 7, 31, 12, 0, tzinfo=UTC))
    loop.tick()
    fake_clock.set(AUG_1 + timedelta(seconds=5))
    loop.tick()
    assert seen == []
    (excluded,) = JobRun.objects.filter(job="t.payroll")
    assert (excluded.outcome, excluded.attempt, excluded.error) == (
        Outcome.EXCLUDED,
        1,
        "calendar 'weekend': sat; deferred to 2026-08-03 06:00:00 Europe/Berlin",
    )
    assert JobLease.objects.get(name="t.payroll").next_run_at == AUG_3

    fake_clock.set(datetime(2026, 8, 2, 12, 0, tzinfo=UTC))
    health = job_health("t.payroll")
    assert health.state not in (State.LATE, State.FAILING), health.reason
    assert health.awaited_slot == AUG_3, health.reason
    assert "deferred to 2026-08-03" in health.reason
    late = job_health("t.payroll", now=health.expected_by + timedelta(seconds=1))
    assert late.state == State.LATE, late.reason  # its deferred run is what is awaited

    fake_clock.set(AUG_3 + timedelta(minutes=5))  # two days after the slot, 5 min after its run
    loop.tick()
    assert seen == [(AUG_1, 2)]
    fake_clock.advance(timedelta(minutes=1))  # the retry's backoff (30 s) is over
    loop.tick()
    assert seen == [(AUG_1, 2), (AUG_1, 3)]
    runs = JobRun.objects.filter(job="t.payroll").order_by("attempt")
    assert [(r.scheduled_for, r.attempt, r.outcome) for r in runs] == [
        (AUG_1, 1, Outcome.EXCLUDED),
        (AUG_1, 2, Outcome.FAILED),
        (AUG_1, 3, Outcome.SUCCEEDED),
    ]
    row = JobLease.objects.get(name="t.payroll")
    assert row.next_run_at == datetime(2026, 9, 1, 4, 0, tzinfo=UTC)
    assert row.consecutive_failures == 0
    assert job_health("t.payroll").state == State.OK


def test_a_deferred_run_the_runners_come_to_late_still_runs_then_the_slots_due_since(jobs):
    """The runners are down from the Saturday until after the next 1st: the deferred run of
    1 August still runs, its slot accounted by its own record (it has no other), then
    1 September's; neither counts a slot missed, nor a failure."""
    seen = _payroll_of_the_1st()
    fake_clock.set(datetime(2026, 7, 31, 12, 0, tzinfo=UTC))
    loop.tick()
    fake_clock.set(AUG_1 + timedelta(seconds=5))
    loop.tick()
    september = datetime(2026, 9, 1, 4, 0, tzinfo=UTC)  # a Tuesday
    fake_clock.set(september + timedelta(seconds=5))
    while loop.tick().runs:
        pass
    assert seen == [(AUG_1, 2), (september, 1)]
    runs = JobRun.objects.filter(job="t.payroll").order_by("scheduled_for", "attempt")
    assert [(r.scheduled_for, r.attempt, r.outcome, r.missed_slots) for r in runs] == [
        (AUG_1, 1, Outcome.EXCLUDED, 0),
        (AUG_1, 2, Outcome.SUCCEEDED, 0),
        (september, 1, Outcome.SUCCEEDED, 0),
    ]
    row = JobLease.objects.get(name="t.payroll")
    assert (row.next_run_at, row.run_slot, row.consecutive_failures) == (
        datetime(2026, 10, 1, 4, 0, tzinfo=UTC),
        None,
        0,
    )


def test_a_backfill_slot_or_a_backlog_slot_a_calendar_excludes_is_not_deferred_and_says_so(jobs):
    """Deferral is for a slot of the schedule as it comes: a backfill's excluded slot is
    recorded excluded, and so is one of a backlog run slot by slot whose next slot is due
    already; neither record speaks of a deferral that never happens."""
    from django_fencedjobs.backfills import backfill

    seen = _payroll_of_the_1st(catchup="each")
    fake_clock.set(datetime(2026, 7, 31, 12, 0, tzinfo=UTC))
    loop.tick()
    fake_clock.set(datetime(2026, 9, 1, 4, 0, 5, tzinfo=UTC))  # down since July: a backlog
    while loop.tick().runs:
        pass
    september = datetime(2026, 9, 1, 4, 0, tzinfo=UTC)
    assert seen == [(september, 1)]
    (august,) = JobRun.objects.filter(scheduled_for=AUG_1)
    assert (august.outcome, august.error) == (
        Outcome.EXCLUDED,
        "calendar 'weekend': sat; not deferred: the next slot is due already",
    )
    february = datetime(2026, 2, 1, 5, 0, tzinfo=UTC)  # a Sunday, never run: backfilled
    backfill("t.payroll", february - timedelta(days=1), february + timedelta(days=1))
    while loop.tick().runs:
        pass
    filled = JobRun.objects.get(scheduled_for=february, kind="backfill")
    assert (filled.outcome, filled.error) == (Outcome.EXCLUDED, "calendar 'weekend': sun")
    assert seen == [(september, 1)]


def test_defer_excluded_is_refused_without_calendars_and_the_list_shows_where_a_slot_goes(jobs):
    from django_fencedjobs.registry import registry

    @job("0 6 1 * *", name="t.nothing", defer_excluded=True)
    def nothing(run):
        pass

    problem = registry.get("t.nothing")
    assert problem.check_id == CheckId.ARGUMENT
    assert "defer_excluded=True" in str(problem.schedule_error)
    _calendar("early", "Europe/Berlin", dawn={"weekday": 0, "starts": time(5), "ends": time(7)})

    @job(
        "0 6 * * 1",
        name="t.weekly",
        timezone="Europe/Berlin",
        exclude=["early"],
        defer_excluded=True,
    )
    def weekly(run):
        pass

    out = StringIO()
    call_command("runjobs", "--list", stdout=out)
    nexts = [line for line in out.getvalue().splitlines() if line.startswith("  next: ")]
    assert len(nexts) == 3
    assert all(
        "(excluded: calendar 'early': dawn; deferred to " in line
        and line.endswith(" 07:00:00 Europe/Berlin)")
        for line in nexts
    ), nexts
