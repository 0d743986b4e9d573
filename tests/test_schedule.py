"""Schedule: validation, boundaries, jitter, every= alignment, value semantics.

Pure unit tests: no database, no Django. DST behaviour is in
test_schedule_dst.py, generated cases in test_schedule_properties.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from django_fencedjobs.exceptions import ScheduleError
from django_fencedjobs.instants import UTC_NAMES
from django_fencedjobs.listing import describe_schedule
from django_fencedjobs.schedule import Schedule

REPO_ROOT = Path(__file__).resolve().parent.parent


def z(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)


# --------------------------------------------------------------------------- validation


def test_cron_and_every_together_are_refused_naming_both() -> None:
    with pytest.raises(ScheduleError, match=r"exactly one.*'\*/5 \* \* \* \*'"):
        Schedule("*/5 * * * *", every=timedelta(minutes=5))


def test_neither_cron_nor_every_is_refused() -> None:
    with pytest.raises(ScheduleError, match="every=timedelta"):
        Schedule()


@pytest.mark.parametrize(
    ("cron", "fragment"),
    [
        ("* * * *", "4 fields"),
        ("0 * * * * *", "seconds"),
        ("0 0 * * * * 2030", "7 fields"),
        ("", "0 fields"),
        ("60 * * * *", "60"),
        ("0 24 * * *", "24"),
        ("0 0 0 * *", "0 is outside 1-31"),
        ("0 0 * 13 *", "13"),
        ("0 0 * * 8", "8"),
        ("*/0 * * * *", "step '0'"),
        ("5-1 * * * *", "reversed"),
        ("1,,2 * * * *", "empty"),
        ("x * * * *", "'x'"),
        ("0 0 * foo *", "'foo' is not a number"),
        ("0 0 ? * *", "?"),
        ("H * * * *", "H (hashed)"),
        ("@reboot", "@reboot"),
        ("@fortnightly", "@fortnightly"),
    ],
)
def test_bad_cron_is_refused_naming_the_bad_value(cron: str, fragment: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        Schedule(cron)
    message = str(caught.value)
    assert repr(" ".join(cron.split()).lower() if cron.startswith("@") else cron) in message
    assert fragment in message


def test_cron_that_never_fires_is_refused() -> None:
    with pytest.raises(ScheduleError, match=r"'0 0 30 2 \*' never fires"):
        Schedule("0 0 30 2 *")
    with pytest.raises(ScheduleError, match="never fires"):
        Schedule("0 0 31 4,6,9,11 *")


def test_rare_but_real_cron_is_accepted() -> None:
    leap = Schedule("0 0 29 2 *")
    assert leap.next_after(z("2025-01-01 00:00:00")) == z("2028-02-29 00:00:00")
    # 2100 is not a leap year: eight years between runs, inside the horizon.
    assert leap.next_after(z("2096-03-01 00:00:00")) == z("2104-02-29 00:00:00")


def test_a_date_on_a_given_weekday_may_be_eleven_years_apart_and_is_still_found() -> None:
    # 1 January on a Sunday: 2023, then 2034.
    schedule = Schedule("0 0 1 1 */7")
    assert schedule.next_after(z("2023-01-02 00:00:00")) == z("2034-01-01 00:00:00")


def test_cron_must_be_a_string() -> None:
    with pytest.raises(ScheduleError, match="900"):
        Schedule(900)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("every", "fragment"),
    [
        (timedelta(0), "at least 1 second"),
        (timedelta(minutes=-5), "at least 1 second"),
        (timedelta(milliseconds=500), "at least 1 second"),
        (timedelta(seconds=90, milliseconds=500), "whole number of seconds"),
    ],
)
def test_bad_every_is_refused_naming_the_bad_value(every: timedelta, fragment: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        Schedule(every=every)
    assert repr(every) in str(caught.value)
    assert fragment in str(caught.value)


def test_every_must_be_a_timedelta() -> None:
    with pytest.raises(ScheduleError, match=r"every=300 must be a datetime.timedelta"):
        Schedule(every=300)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "zone",
    [
        "+02:00",
        "-0500",
        "+2",
        "UTC+2",
        "GMT-5",
        "utc-03:00",
        "Etc/GMT+5",
        "Etc/GMT-14",
        "EST",
        "MST",
        "HST",
    ],
)
def test_fixed_offset_zone_is_refused_with_its_own_message(zone: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        Schedule("0 9 * * *", timezone=zone)
    message = str(caught.value)
    assert repr(zone) in message
    assert "fixed UTC offset" in message
    assert "'Europe/Berlin'" in message


@pytest.mark.parametrize(
    "zone", ["Mars/Olympus_Mons", "America", "", "../../etc/passwd", "Europe/"]
)
def test_unknown_zone_is_refused_naming_it(zone: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        Schedule("0 9 * * *", timezone=zone)
    assert repr(zone) in str(caught.value)
    assert "not a known IANA zone" in str(caught.value)


def test_timezone_must_be_a_name() -> None:
    with pytest.raises(ScheduleError, match="must be the name of an IANA zone"):
        Schedule("0 9 * * *", timezone=ZoneInfo("Europe/Berlin"))  # type: ignore[arg-type]


@pytest.mark.parametrize("zone", ["UTC", "Etc/UTC", "GMT", "Europe/Berlin", "Australia/Lord_Howe"])
def test_utc_names_and_named_zones_are_accepted(zone: str) -> None:
    schedule = Schedule("0 9 * * *", timezone=zone)
    assert schedule.timezone == zone
    assert schedule.tz == ZoneInfo(zone)


@pytest.mark.parametrize("zone", sorted(UTC_NAMES))
def test_a_name_of_utc_keeps_its_wall_time_all_year(zone: str) -> None:
    # A schedule in one of these names looks for no transitions: each must be UTC indeed.
    schedule = Schedule("30 2 * * *", timezone=zone)
    fires = schedule.fire_times(z("2026-01-01 00:00:00"), z("2027-01-01 00:00:00"))
    assert len(fires) == 365
    assert {t.astimezone(ZoneInfo(zone)).strftime("%H:%M%z") for t in fires} == {"02:30+0000"}


def test_timezone_is_validated_for_every_schedules_too() -> None:
    with pytest.raises(ScheduleError, match="fixed UTC offset"):
        Schedule(every=timedelta(minutes=5), timezone="+01:00")


def test_negative_jitter_is_refused_naming_it() -> None:
    with pytest.raises(ScheduleError, match=r"jitter=datetime.timedelta\(days=-1, seconds=86340\)"):
        Schedule("* * * * *", jitter=timedelta(minutes=-1))


def test_jitter_must_be_a_timedelta() -> None:
    with pytest.raises(ScheduleError, match="jitter=30"):
        Schedule("* * * * *", jitter=30)  # type: ignore[arg-type]


def test_naive_datetimes_are_refused_everywhere() -> None:
    schedule = Schedule("* * * * *")
    naive = datetime(2026, 1, 1, 12, 0)
    with pytest.raises(ScheduleError, match="2026-01-01T12:00:00 is naive"):
        schedule.next_after(naive)
    with pytest.raises(ScheduleError, match="naive"):
        schedule.fire_times(naive, naive + timedelta(hours=1))
    with pytest.raises(ScheduleError, match="naive"):
        schedule.iter_after(naive)
    with pytest.raises(ScheduleError, match="naive"):
        Schedule(every=timedelta(minutes=1)).next_after(naive)


@pytest.mark.parametrize(
    ("arguments", "argument", "fixed_offset"),
    [
        ({"cron": "61 * * * *"}, "cron", False),
        ({"cron": "0 0 * * 1#6"}, "cron", False),
        ({"cron": "0 0 30 2 *"}, "cron", False),
        ({}, "cron", False),
        ({"cron": "* * * * *", "every": timedelta(minutes=1)}, "cron", False),
        ({"every": timedelta(0)}, "every", False),
        ({"every": 300}, "every", False),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus_Mons"}, "timezone", False),
        ({"cron": "* * * * *", "timezone": 3}, "timezone", False),
        ({"cron": "* * * * *", "timezone": "UTC+2"}, "timezone", True),
        ({"every": timedelta(minutes=1), "timezone": "EST"}, "timezone", True),
        ({"cron": "* * * * *", "jitter": timedelta(minutes=-1)}, "jitter", False),
        ({"cron": "* * * * *", "key": 5}, "key", False),
    ],
)
def test_schedule_error_names_the_argument_that_failed(
    arguments: dict[str, object], argument: str, fixed_offset: bool
) -> None:
    with pytest.raises(ScheduleError) as caught:
        Schedule(**arguments)  # type: ignore[arg-type]
    assert caught.value.argument == argument
    assert caught.value.fixed_offset is fixed_offset


def test_schedule_error_of_a_method_names_its_argument() -> None:
    schedule = Schedule("* * * * *")
    naive = datetime(2026, 1, 1, 12, 0)
    aware = naive.replace(tzinfo=UTC)
    for call, argument in (
        (lambda: schedule.next_after(naive), "after"),
        (lambda: schedule.fire_times(naive, aware), "start"),
        (lambda: schedule.fire_times(aware, naive), "end"),
        (lambda: schedule.fire_times(aware, aware, limit=-1), "limit"),
    ):
        with pytest.raises(ScheduleError) as caught:
            call()
        assert caught.value.argument == argument
    assert ScheduleError("anything").argument is None
    assert ScheduleError().fixed_offset is False


# --------------------------------------------------------------------------- L, W and #


def dates(cron: str, year: int) -> list[str]:
    """The dates ("MM-DD") on which ``cron`` fires in ``year``, in UTC."""
    start = datetime(year, 1, 1, tzinfo=UTC) - timedelta(microseconds=1)
    end = datetime(year + 1, 1, 1, tzinfo=UTC) - timedelta(microseconds=1)
    return [f"{t:%m-%d}" for t in Schedule(cron).fire_times(start, end)]


def test_l_is_the_last_day_of_every_month_february_included() -> None:
    assert dates("0 0 L * *", 2026) == [
        "01-31", "02-28", "03-31", "04-30", "05-31", "06-30",
        "07-31", "08-31", "09-30", "10-31", "11-30", "12-31",
    ]  # fmt: skip
    assert dates("0 0 L 2 *", 2028) == ["02-29"]
    assert dates("0 0 L 2 *", 2100) == ["02-28"]  # not a leap year


def test_lw_is_the_last_weekday_moving_back_from_a_weekend() -> None:
    # 2026: Jan 31 and Oct 31 are Saturdays, May 31 a Sunday, Feb 28 a Saturday.
    assert dates("0 18 LW * *", 2026) == [
        "01-30", "02-27", "03-31", "04-30", "05-29", "06-30",
        "07-31", "08-31", "09-30", "10-30", "11-30", "12-31",
    ]  # fmt: skip


def test_15w_is_the_weekday_nearest_the_15th() -> None:
    # 2026: the 15th is a Sunday in February, March and November (so Monday the
    # 16th) and a Saturday in August (so Friday the 14th).
    assert dates("0 9 15W * *", 2026) == [
        "01-15", "02-16", "03-16", "04-15", "05-15", "06-15",
        "07-15", "08-14", "09-15", "10-15", "11-16", "12-15",
    ]  # fmt: skip


def test_1w_never_moves_into_the_previous_month() -> None:
    # 1 August 2026 is a Saturday: the nearest weekday in August is Monday the 3rd
    # (Friday 31 July is nearer, but in another month). Sundays the 1st go to the 2nd.
    assert dates("0 9 1W * *", 2026) == [
        "01-01", "02-02", "03-02", "04-01", "05-01", "06-01",
        "07-01", "08-03", "09-01", "10-01", "11-02", "12-01",
    ]  # fmt: skip


def test_31w_never_moves_into_the_next_month_and_skips_shorter_months() -> None:
    # 31 May 2026 is a Sunday: Friday the 29th, not Monday 1 June. A month
    # without a 31st has no run, as for plain "31".
    assert dates("0 9 31W * *", 2026) == [
        "01-30", "03-31", "05-29", "07-31", "08-31", "10-30", "12-31",
    ]  # fmt: skip


def test_nth_weekday_of_the_month() -> None:
    assert dates("0 9 * 1-4 1#2", 2026) == ["01-12", "02-09", "03-09", "04-13"]
    assert dates("0 9 * 1-4 MON#1", 2026) == ["01-05", "02-02", "03-02", "04-06"]


def test_a_fifth_weekday_fires_only_in_months_that_have_one() -> None:
    # 2026 has five Fridays in January, May, July and October only.
    assert dates("0 0 * * 5#5", 2026) == ["01-30", "05-29", "07-31", "10-30"]


def test_dl_is_the_last_such_weekday_of_the_month() -> None:
    assert dates("0 17 * * 5L", 2026) == [
        "01-30", "02-27", "03-27", "04-24", "05-29", "06-26",
        "07-31", "08-28", "09-25", "10-30", "11-27", "12-25",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("cron", "same_as"),
    [
        ("0 0 * * 7#1", "0 0 * * 0#1"),
        ("0 0 * * sun#1", "0 0 * * 0#1"),
        ("0 0 * * 7L", "0 0 * * 0L"),
        ("0 0 * * SUNL", "0 0 * * 0L"),
        ("0 0 * * fril", "0 0 * * 5L"),
        ("0 0 l * *", "0 0 L * *"),
        ("0 0 lw * *", "0 0 LW * *"),
        ("0 0 15w * *", "0 0 15W * *"),
    ],
)
def test_l_w_and_hash_take_names_sunday_as_seven_and_any_case(cron: str, same_as: str) -> None:
    assert dates(cron, 2026) == dates(same_as, 2026)
    assert len(dates(cron, 2026)) == 12


def test_l_w_and_hash_combine_in_lists() -> None:
    assert dates("0 0 1,L 1-3 *", 2026) == ["01-01", "01-31", "02-01", "02-28", "03-01", "03-31"]
    assert dates("0 0 1W,15W 2-3 *", 2026) == ["02-02", "02-16", "03-02", "03-16"]
    assert dates("0 0 LW,1 1-2 *", 2026) == ["01-01", "01-30", "02-01", "02-27"]
    assert dates("0 0 * 1 1#1,5L", 2026) == ["01-05", "01-30"]
    # A plain day and an nth day in one list: any Wednesday, or the second Monday.
    assert dates("0 0 * 1 1#2,3", 2026) == ["01-07", "01-12", "01-14", "01-21", "01-28"]


def test_day_fields_with_l_w_and_hash_combine_as_for_plain_values() -> None:
    # Both restricted: the last day OR any Friday.
    assert dates("0 0 L 1 5", 2026) == ["01-02", "01-09", "01-16", "01-23", "01-30", "01-31"]
    # "*/2" starts with a star: the last Friday AND an odd date.
    assert dates("0 0 */2 * 5L", 2026) == [
        "02-27", "03-27", "05-29", "07-31", "09-25", "11-27", "12-25",
    ]  # fmt: skip
    assert dates("0 0 * 1 5L", 2026) == ["01-30"]


def test_the_fifth_monday_of_february_is_rare_but_real() -> None:
    # 29 February on a Monday: 2044, 2072, then not until 2112 (2100 is not a
    # leap year). The search horizon covers that 40-year gap.
    schedule = Schedule("0 0 * 2 1#5")
    assert schedule.next_after(z("2025-01-01 00:00:00")) == z("2044-02-29 00:00:00")
    assert schedule.next_after(z("2072-02-29 00:00:00")) == z("2112-02-29 00:00:00")
    assert schedule.min_interval() == z("2072-02-29 00:00:00") - z("2044-02-29 00:00:00")


@pytest.mark.parametrize(
    "cron",
    [
        "0 0 30W 2 *",  # February has no 30th, so no weekday nearest it
        "0 0 */31 * 0#5",  # the 1st is never the fifth Sunday
        "0 0 */31 2 1L",  # nor the last Monday of February
    ],
)
def test_l_w_and_hash_that_never_fire_are_refused(cron: str) -> None:
    with pytest.raises(ScheduleError, match="never fires"):
        Schedule(cron)


@pytest.mark.parametrize(
    ("cron", "fragments"),
    [
        ("L * * * *", ["minute field 'L'", "only in the day-of-month field"]),
        ("0 L * * *", ["hour field 'L'", "only in the day-of-month field", "day-of-week"]),
        ("0 0 * L *", ["month field 'L'", "only in the day-of-month field"]),
        ("0 15W * * *", ["hour field '15W'", "only in the day-of-month field"]),
        ("0 0 * 1#2 *", ["month field '1#2'", "only in the day-of-week field"]),
        ("0 0 1#2 * *", ["day-of-month field '1#2'", "only in the day-of-week field"]),
        ("0 0 * * 1W", ["day-of-week field '1W'", "only in the day-of-month field"]),
        ("0 0 1-15W * *", ["day-of-month field '1-15W'", "a single day", "15W"]),
        ("0 0 L/2 * *", ["day-of-month field 'L/2'", "a single day"]),
        ("0 0 */2W * *", ["day-of-month field '*/2W'", "a single day"]),
        ("0 0 L-3 * *", ["day-of-month field 'L-3'", "a single day"]),
        ("0 0 W * *", ["day-of-month field 'W'", "a single day"]),
        ("0 0 WL * *", ["day-of-month field 'WL'", "a single day"]),
        ("0 0 0W * *", ["day-of-month field '0W'", "0 is outside 1-31"]),
        ("0 0 32W * *", ["day-of-month field '32W'", "32 is outside 1-31"]),
        ("0 0 * * L", ["day-of-week field 'L'", "a single day", "5L"]),
        ("0 0 * * 1-5#2", ["day-of-week field '1-5#2'", "a single day", "1#2"]),
        ("0 0 * * 1-5L", ["day-of-week field '1-5L'", "a single day"]),
        ("0 0 * * 5L/2", ["day-of-week field '5L/2'", "a single day"]),
        ("0 0 * * #2", ["day-of-week field '#2'", "a single day"]),
        ("0 0 * * 1#2#3", ["day-of-week field '1#2#3'"]),
        ("0 0 * * 1#6", ["day-of-week field '1#6'", "1 to 5"]),
        ("0 0 * * 1#0", ["day-of-week field '1#0'", "1 to 5"]),
        ("0 0 * * 1#x", ["day-of-week field '1#x'", "1 to 5"]),
        ("0 0 * * 8#1", ["day-of-week field '8#1'", "8 is outside 0-7"]),
        ("0 0 * * 8L", ["day-of-week field '8L'", "8 is outside 0-7"]),
    ],
)
def test_a_bad_use_of_l_w_or_hash_names_the_field_and_what_is_allowed(
    cron: str, fragments: list[str]
) -> None:
    with pytest.raises(ScheduleError) as caught:
        Schedule(cron)
    message = str(caught.value)
    assert repr(cron) in message
    for fragment in fragments:
        assert fragment in message
    assert caught.value.argument == "cron"


# --------------------------------------------------------------------------- normalization


def test_cron_whitespace_is_normalized() -> None:
    assert Schedule("  */15\t*  * *\n* ").cron == "*/15 * * * *"


@pytest.mark.parametrize(
    ("alias", "equivalent"),
    [
        ("@hourly", "0 * * * *"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@weekly", "0 0 * * 0"),
        ("@monthly", "0 0 1 * *"),
        ("@yearly", "0 0 1 1 *"),
        ("@ANNUALLY", "0 0 1 1 *"),
    ],
)
def test_aliases_fire_like_their_expansion(alias: str, equivalent: str) -> None:
    start = z("2025-06-15 10:20:00")
    end = start + timedelta(days=800)
    assert Schedule(alias, timezone="Europe/Berlin").fire_times(start, end, limit=50) == Schedule(
        equivalent, timezone="Europe/Berlin"
    ).fire_times(start, end, limit=50)
    assert Schedule(alias).cron == alias.lower()


def test_names_and_sunday_as_seven_work() -> None:
    start, end = z("2026-01-01 00:00:00"), z("2026-03-01 00:00:00")
    assert Schedule("0 9 * jan,FEB Sun").fire_times(start, end) == Schedule(
        "0 9 * 1-2 7"
    ).fire_times(start, end)
    assert Schedule("0 9 * * 0").fire_times(start, end) == Schedule("0 9 * * 7").fire_times(
        start, end
    )


def test_day_fields_are_or_unless_one_starts_with_a_star() -> None:
    start, end = z("2026-01-01 00:00:00"), z("2026-02-01 00:00:00")
    # Both restricted: the 13th OR any Friday.
    days = {t.day for t in Schedule("0 0 13 * 5").fire_times(start, end)}
    assert days == {2, 9, 13, 16, 23, 30}
    # "*/2" starts with a star: odd days AND Mondays (croniter would OR them).
    days = {t.day for t in Schedule("0 0 */2 * 1").fire_times(start, end)}
    assert days == {5, 19}
    # "1-31" does not: every day OR Monday, i.e. every day.
    assert len(Schedule("0 0 1-31 * 1").fire_times(start, end)) == 31


def test_single_value_with_step_runs_to_the_end_of_the_range() -> None:
    start = z("2026-01-01 00:00:00")
    minutes = [
        t.minute for t in Schedule("5/20 * * * *").fire_times(start, start + timedelta(hours=1))
    ]
    assert minutes == [5, 25, 45]
    minutes = [
        t.minute for t in Schedule("5-5/2 * * * *").fire_times(start, start + timedelta(hours=1))
    ]
    assert minutes == [5]


# --------------------------------------------------------------------------- boundaries


def test_next_after_an_exact_fire_time_returns_the_next_one() -> None:
    schedule = Schedule("*/15 * * * *")
    assert schedule.next_after(z("2026-05-01 10:15:00")) == z("2026-05-01 10:30:00")
    assert schedule.next_after(z("2026-05-01 10:14:59")) == z("2026-05-01 10:15:00")
    just_before = z("2026-05-01 10:15:00") - timedelta(microseconds=1)
    assert schedule.next_after(just_before) == z("2026-05-01 10:15:00")


def test_fire_times_is_open_at_the_start_and_closed_at_the_end() -> None:
    schedule = Schedule("0 * * * *")
    got = schedule.fire_times(z("2026-05-01 10:00:00"), z("2026-05-01 13:00:00"))
    assert got == [z("2026-05-01 11:00:00"), z("2026-05-01 12:00:00"), z("2026-05-01 13:00:00")]


def test_fire_times_of_consecutive_windows_never_overlap() -> None:
    schedule = Schedule("*/7 * * * *", timezone="America/New_York")
    a, b, c = z("2026-11-01 04:00:00"), z("2026-11-01 06:03:00"), z("2026-11-01 08:00:00")
    assert schedule.fire_times(a, b) + schedule.fire_times(b, c) == schedule.fire_times(a, c)


def test_fire_times_with_an_empty_or_reversed_window_is_empty() -> None:
    schedule = Schedule("* * * * *")
    t = z("2026-05-01 10:00:00")
    assert schedule.fire_times(t, t) == []
    assert schedule.fire_times(t, t - timedelta(hours=1)) == []


class CountingSchedule(Schedule):
    """Counts the fire times its iterator hands out."""

    produced = 0

    def iter_after(self, after: datetime) -> Iterator[datetime]:
        for fire in super().iter_after(after):
            self.produced += 1
            yield fire


def test_fire_times_stops_at_the_limit_without_walking_the_whole_window() -> None:
    schedule = CountingSchedule("* * * * *")
    t = z("2026-05-01 10:00:00")
    # A full walk of ten years would be ~5 million fire times.
    got = schedule.fire_times(t, t + timedelta(days=3650), limit=3)
    assert schedule.produced == 3
    assert got == [t + timedelta(minutes=1), t + timedelta(minutes=2), t + timedelta(minutes=3)]
    assert schedule.fire_times(t, t + timedelta(days=1), limit=0) == []
    with pytest.raises(ScheduleError, match="limit=-1"):
        schedule.fire_times(t, t + timedelta(days=1), limit=-1)


def test_results_are_aware_utc_whatever_the_input_zone() -> None:
    schedule = Schedule("0 9 * * *", timezone="Europe/Berlin")
    after = datetime(2026, 7, 1, 12, 0, tzinfo=ZoneInfo("Asia/Tokyo"))  # 03:00 UTC
    fire = schedule.next_after(after)
    assert fire.tzinfo is UTC
    assert fire == z("2026-07-01 07:00:00")  # 09:00 CEST
    assert all(t.tzinfo is UTC for t in schedule.fire_times(after, after + timedelta(days=3)))


def test_iter_after_is_an_endless_ascending_stream_matching_next_after() -> None:
    schedule = Schedule(
        "0 9 * * 1-5", timezone="Europe/Berlin", jitter=timedelta(minutes=5), key="k"
    )
    stream = schedule.iter_after(z("2026-03-20 00:00:00"))
    first = [next(stream) for _ in range(300)]
    assert first == sorted(set(first))
    walked = []
    t = z("2026-03-20 00:00:00")
    for _ in range(300):
        t = schedule.next_after(t)
        walked.append(t)
    assert walked == first


# --------------------------------------------------------------------------- jitter


def test_jitter_offset_is_within_range_and_whole_seconds() -> None:
    for i in range(200):
        schedule = Schedule("*/15 * * * *", jitter=timedelta(minutes=3), key=f"job.{i}")
        assert timedelta(0) <= schedule.offset < timedelta(minutes=3)
        assert schedule.offset.microseconds == 0


def test_jitter_offset_differs_for_different_keys() -> None:
    offsets = {
        Schedule("*/15 * * * *", jitter=timedelta(minutes=10), key=f"billing.job{i}").offset
        for i in range(50)
    }
    assert len(offsets) > 40


def test_zero_jitter_means_zero_offset_and_a_short_jitter_too() -> None:
    assert Schedule("* * * * *", key="x").offset == timedelta(0)
    assert Schedule("* * * * *", jitter=timedelta(milliseconds=900), key="x").offset == timedelta(0)


def test_key_defaults_to_the_expression() -> None:
    assert Schedule("*/15 * * * *").key == "*/15 * * * *"
    assert Schedule(every=timedelta(minutes=5)).key == "every=300s"
    assert Schedule("*/15 * * * *", key="billing.sync").key == "billing.sync"


def test_fire_times_are_base_times_plus_the_offset() -> None:
    plain = Schedule("*/15 * * * *")
    jittered = Schedule("*/15 * * * *", jitter=timedelta(minutes=3), key="billing.sync")
    start, end = z("2026-05-01 10:00:00"), z("2026-05-01 12:00:00")
    base = plain.fire_times(start - timedelta(minutes=15), end)
    expected = [t + jittered.offset for t in base if start < t + jittered.offset <= end]
    assert jittered.fire_times(start, end) == expected


def test_next_after_with_jitter_is_strictly_after_even_between_base_and_offset() -> None:
    jittered = Schedule("0 * * * *", jitter=timedelta(minutes=30), key="k")
    offset = jittered.offset
    assert offset > timedelta(0)  # this key's offset is not zero (fixed by the hash)
    fire = z("2026-05-01 10:00:00") + offset
    # Between the base time and the jittered time: this hour's run is still ahead.
    assert jittered.next_after(z("2026-05-01 10:00:00")) == fire
    assert jittered.next_after(fire - timedelta(seconds=1)) == fire
    assert jittered.next_after(fire) == fire + timedelta(hours=1)


_OFFSET_SCRIPT = (
    "from datetime import timedelta; from django_fencedjobs.schedule import Schedule; "
    "print(int(Schedule('*/15 * * * *', jitter=timedelta(hours=1), key='billing.sync')"
    ".offset.total_seconds()), Schedule(every=timedelta(minutes=5), jitter=timedelta(minutes=5))"
    ".offset.total_seconds(), Schedule('0 9 * * *', timezone='Europe/Berlin').fingerprint())"
)


def test_jitter_and_fingerprint_are_stable_across_processes_and_hash_seeds() -> None:
    outputs = set()
    for seed in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(REPO_ROOT))
        result = subprocess.run(
            [sys.executable, "-c", _OFFSET_SCRIPT],
            env=env,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        outputs.add(result.stdout.strip())
    here = Schedule("*/15 * * * *", jitter=timedelta(hours=1), key="billing.sync")
    assert len(outputs) == 1
    assert outputs.pop().split()[0] == str(int(here.offset.total_seconds()))


# --------------------------------------------------------------------------- every=


def test_every_fires_on_multiples_of_the_interval_since_the_epoch() -> None:
    schedule = Schedule(every=timedelta(minutes=5))
    got = schedule.fire_times(z("2026-05-01 10:02:30"), z("2026-05-01 10:20:00"))
    assert got == [
        z("2026-05-01 10:05:00"),
        z("2026-05-01 10:10:00"),
        z("2026-05-01 10:15:00"),
        z("2026-05-01 10:20:00"),
    ]
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    assert all((t - epoch).total_seconds() % 300 == 0 for t in got)


def test_every_odd_interval_is_aligned_to_the_epoch_not_to_the_hour() -> None:
    schedule = Schedule(every=timedelta(minutes=7))
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    fire = schedule.next_after(z("2026-05-01 10:00:00"))
    assert (fire - epoch) % timedelta(minutes=7) == timedelta(0)
    assert timedelta(0) < fire - z("2026-05-01 10:00:00") <= timedelta(minutes=7)


def test_every_next_after_an_exact_fire_time_returns_the_next_one() -> None:
    schedule = Schedule(every=timedelta(hours=1))
    assert schedule.next_after(z("2026-05-01 10:00:00")) == z("2026-05-01 11:00:00")
    assert schedule.next_after(z("1969-12-31 23:30:00")) == z("1970-01-01 00:00:00")


def test_every_with_jitter_adds_the_offset() -> None:
    schedule = Schedule(every=timedelta(minutes=5), jitter=timedelta(minutes=5), key="sync")
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    for fire in schedule.fire_times(z("2026-05-01 10:00:00"), z("2026-05-01 11:00:00")):
        assert (fire - epoch - schedule.offset) % timedelta(minutes=5) == timedelta(0)


def test_every_ignores_the_zone_for_fire_times() -> None:
    start, end = z("2026-03-08 00:00:00"), z("2026-03-09 00:00:00")
    assert Schedule(every=timedelta(hours=1), timezone="America/New_York").fire_times(
        start, end
    ) == Schedule(every=timedelta(hours=1)).fire_times(start, end)


# --------------------------------------------------------------------------- min_interval


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        (Schedule(every=timedelta(minutes=7)), timedelta(minutes=7)),
        (Schedule("*/15 * * * *"), timedelta(minutes=15)),
        (Schedule("0,45 * * * *"), timedelta(minutes=15)),
        (Schedule("0 9 * * 1-5", timezone="Europe/Berlin"), timedelta(days=1)),
        (Schedule("0 9 1 * *"), timedelta(days=28)),
        (Schedule("0 0 L * *"), timedelta(days=28)),  # 31 January to 28 February
        (Schedule("0 0 * * 5L"), timedelta(days=28)),
        # 2028-02-29 to 2032-02-29: fewer than two runs in the sampled year.
        (Schedule("0 0 29 2 *"), timedelta(days=1461)),
        (Schedule("* * * * *", timezone="America/New_York"), timedelta(minutes=1)),
    ],
)
def test_min_interval_is_the_shortest_gap(schedule: Schedule, expected: timedelta) -> None:
    assert schedule.min_interval() == expected


def test_min_interval_is_computed_once() -> None:
    schedule = Schedule("*/5 * * * *", timezone="Europe/London")
    # A walk of the schedule builds new timedeltas: the very object of the first call again
    # means it was kept, not recomputed.
    assert schedule.min_interval() is schedule.min_interval()


# --------------------------------------------------------------------------- value semantics


def test_equal_arguments_make_equal_hashable_schedules() -> None:
    a = Schedule("*/15  * * * *", timezone="Europe/Berlin", jitter=timedelta(minutes=3), key="x")
    b = Schedule("*/15 * * * *", timezone="Europe/Berlin", jitter=timedelta(minutes=3), key="x")
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1
    assert a != Schedule("*/15 * * * *", timezone="Europe/Berlin", jitter=timedelta(minutes=3))
    assert a != Schedule(
        "*/15 * * * *", timezone="Europe/Paris", jitter=timedelta(minutes=3), key="x"
    )
    assert a != "*/15 * * * *"


def test_repr_shows_the_arguments() -> None:
    assert repr(Schedule("*/15 * * * *")) == "Schedule(cron='*/15 * * * *')"
    assert (
        repr(
            Schedule(
                every=timedelta(minutes=5),
                timezone="Europe/Berlin",
                jitter=timedelta(seconds=30),
                key="k",
            )
        )
        == "Schedule(every=datetime.timedelta(seconds=300), timezone='Europe/Berlin', "
        "jitter=datetime.timedelta(seconds=30), key='k')"
    )


def test_fingerprint_is_short_hex_and_changes_with_what_matters() -> None:
    base = Schedule("0 9 * * *", timezone="Europe/Berlin")
    fingerprint = base.fingerprint()
    assert len(fingerprint) == 16
    int(fingerprint, 16)
    assert Schedule("0  9 * * *", timezone="Europe/Berlin").fingerprint() == fingerprint
    assert Schedule("0 9 * * *", timezone="Europe/Berlin", key="other").fingerprint() == fingerprint
    assert Schedule("0 10 * * *", timezone="Europe/Berlin").fingerprint() != fingerprint
    assert Schedule("0 9 * * *", timezone="Europe/Paris").fingerprint() != fingerprint
    assert (
        Schedule("0 9 * * *", timezone="Europe/Berlin", jitter=timedelta(seconds=1)).fingerprint()
        != fingerprint
    )
    assert (
        Schedule(every=timedelta(minutes=1)).fingerprint()
        != Schedule(every=timedelta(minutes=2)).fingerprint()
    )
    # Pinned: a stored fingerprint must keep matching after an upgrade.
    assert fingerprint == _pinned_fingerprint()


def _pinned_fingerprint() -> str:
    import hashlib

    return hashlib.sha256(b"v1|cron=0 9 * * *|tz=Europe/Berlin|jitter_us=0").hexdigest()[:16]


@pytest.mark.parametrize(
    ("schedule", "words"),
    [
        (Schedule("*/15 * * * *"), "every 15 minutes (UTC)"),
        (Schedule("* * * * *"), "every minute (UTC)"),
        (Schedule("0 * * * *"), "every hour at :00 (UTC)"),
        (Schedule("@hourly"), "every hour at :00 (UTC)"),
        (Schedule("30 */2 * * *"), "every 2 hours at :30 (UTC)"),
        (Schedule("0 9 * * *", timezone="Europe/Berlin"), "at 09:00 every day (Europe/Berlin)"),
        (Schedule("0 9 * * 1-5", timezone="Europe/Berlin"), "at 09:00 on Mon-Fri (Europe/Berlin)"),
        (Schedule("30 8 * * mon,wed"), "at 08:30 on Mon,Wed (UTC)"),
        (Schedule("0 9,17 * * *"), "at 09:00, 17:00 every day (UTC)"),
        (Schedule("0 6 1 * *"), "at 06:00 on day 1 of the month (UTC)"),
        (Schedule("0 6 1,15 * *"), "at 06:00 on days 1,15 of the month (UTC)"),
        (Schedule("0 9 * 1 *"), "cron '0 9 * 1 *' (UTC)"),
        (
            Schedule("0 9 * * 1-5", timezone="Europe/Berlin", jitter=timedelta(minutes=3)),
            "at 09:00 on Mon-Fri (Europe/Berlin), jitter 3m",
        ),
        (Schedule("0 0 L * *"), "at 00:00 on the last day of the month (UTC)"),
        (Schedule("0 18 LW * *"), "at 18:00 on the last weekday of the month (UTC)"),
        (Schedule("0 9 15W * *"), "at 09:00 on the weekday nearest the 15th of the month (UTC)"),
        (
            Schedule("0 9 1W,22W * *"),
            "at 09:00 on the weekday nearest the 1st and the weekday nearest the 22nd of the "
            "month (UTC)",
        ),
        (Schedule("0 9 1,L * *"), "at 09:00 on day 1 and the last day of the month (UTC)"),
        (Schedule("0 9 * * 1#2"), "at 09:00 on the second Monday of the month (UTC)"),
        (Schedule("0 9 * * sun#1"), "at 09:00 on the first Sunday of the month (UTC)"),
        (Schedule("0 9 * * 7#3"), "at 09:00 on the third Sunday of the month (UTC)"),
        (Schedule("0 17 * * 5L"), "at 17:00 on the last Friday of the month (UTC)"),
        (
            Schedule("0 9 * * 1#1,3#5"),
            "at 09:00 on the first Monday and the fifth Wednesday of the month (UTC)",
        ),
        (Schedule("0 9 * * 1#2,3"), "cron '0 9 * * 1#2,3' (UTC)"),
        (Schedule("0 9 L * 5"), "cron '0 9 L * 5' (UTC)"),
        (Schedule(every=timedelta(minutes=15)), "every 15 minutes (UTC)"),
        (Schedule(every=timedelta(hours=1)), "every hour (UTC)"),
        (Schedule(every=timedelta(days=2)), "every 2 days (UTC)"),
        (Schedule(every=timedelta(seconds=30)), "every 30 seconds (UTC)"),
        (
            Schedule(every=timedelta(seconds=90), jitter=timedelta(seconds=75)),
            "every 1m30s (UTC), jitter 1m15s",
        ),
    ],
)
def test_describe_reads_as_words(schedule: Schedule, words: str) -> None:
    assert describe_schedule(schedule) == words


def test_schedule_module_and_describe_do_not_import_django() -> None:
    code = (
        "import sys; from django_fencedjobs.schedule import Schedule; "
        "from django_fencedjobs.listing import describe_schedule; "
        "describe_schedule(Schedule('0 9 * * 5L', timezone='Europe/Berlin')); "
        "print(any(m == 'django' or m.startswith('django.') for m in sys.modules))"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == "False"
