"""Schedules across both DST transitions, as exact lists of UTC instants.

The rule (ISC/Debian cron, docs/schedules.md):

* fixed time (minute and hour fields do not start with "*"): a wall time in
  the spring-forward gap fires once, at the first instant after the gap; a wall
  time that happens twice fires once, at its first occurrence;
* wildcard or stepped hour: every real instant whose wall time matches fires;
  nothing is invented in the gap, and both occurrences of a repeated wall time
  fire.

2026 transitions used below (checked against zoneinfo in
test_the_transitions_used_here_are_the_real_ones):

=====================  ======================================  ===========================
zone                   spring forward (gap)                    fall back (repeated)
=====================  ======================================  ===========================
America/New_York       Sun 2026-03-08 02:00-03:00 (07:00Z)     Sun 2026-11-01 01:00-02:00
Europe/London          Sun 2026-03-29 01:00-02:00 (01:00Z)     Sun 2026-10-25 01:00-02:00
Australia/Lord_Howe    Sun 2026-10-04 02:00-02:30 (Oct 3       Sun 2026-04-05 01:30-02:00
                       15:30Z), a 30-minute shift              (Apr 4 15:00Z)
Europe/Dublin          as London (Irish "negative DST": winter is the offset that differs)
America/Santiago       Sun 2026-09-06 00:00-01:00 (04:00Z)     Sat 2026-04-04 23:00-24:00
=====================  ======================================  ===========================
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from django_fencedjobs.schedule import Schedule


def z(text: str) -> datetime:
    """An aware UTC instant from "YYYY-MM-DD HH:MM"."""
    return datetime.strptime(text, "%Y-%m-%d %H:%M").replace(tzinfo=UTC)


def fires(cron: str, zone: str, start: str, end: str) -> list[datetime]:
    """Fire times in (start, end], both given as UTC "YYYY-MM-DD HH:MM"."""
    return Schedule(cron, timezone=zone).fire_times(z(start), z(end))


def local(instants: list[datetime], zone: str) -> list[str]:
    """Instants as local wall times with their offset, for readable failure messages."""
    tz = ZoneInfo(zone)
    return [t.astimezone(tz).strftime("%m-%d %H:%M%z") for t in instants]


@pytest.mark.parametrize(
    ("zone", "before_utc", "offset_before", "offset_after"),
    [
        ("America/New_York", "2026-03-08 07:00", -5, -4),
        ("America/New_York", "2026-11-01 06:00", -4, -5),
        ("Europe/London", "2026-03-29 01:00", 0, 1),
        ("Europe/London", "2026-10-25 01:00", 1, 0),
        ("Europe/Dublin", "2026-03-29 01:00", 0, 1),
        ("Europe/Dublin", "2026-10-25 01:00", 1, 0),
        ("Australia/Lord_Howe", "2026-04-04 15:00", 11, 10.5),
        ("Australia/Lord_Howe", "2026-10-03 15:30", 10.5, 11),
        ("America/Santiago", "2026-04-05 03:00", -3, -4),
        ("America/Santiago", "2026-09-06 04:00", -4, -3),
    ],
)
def test_the_transitions_used_here_are_the_real_ones(
    zone: str, before_utc: str, offset_before: float, offset_after: float
) -> None:
    tz = ZoneInfo(zone)
    at = z(before_utc)
    assert (at - timedelta(seconds=1)).astimezone(tz).utcoffset() == timedelta(hours=offset_before)
    assert at.astimezone(tz).utcoffset() == timedelta(hours=offset_after)


# --------------------------------------------------------------------------- America/New_York

NY = "America/New_York"


def test_fixed_time_in_spring_gap_runs_once_after_the_gap_in_new_york() -> None:
    got = fires("30 2 * * *", NY, "2026-03-07 00:00", "2026-03-10 00:00")
    # Sat 02:30 EST, Sun (02:30 does not exist) 03:00 EDT, Mon 02:30 EDT.
    assert got == [z("2026-03-07 07:30"), z("2026-03-08 07:00"), z("2026-03-09 06:30")], local(
        got, NY
    )


def test_fixed_time_in_repeated_hour_runs_once_at_the_first_occurrence_in_new_york() -> None:
    got = fires("30 1 * * *", NY, "2026-10-31 00:00", "2026-11-03 00:00")
    # Sat 01:30 EDT, Sun 01:30 EDT (not again at 01:30 EST), Mon 01:30 EST.
    assert got == [z("2026-10-31 05:30"), z("2026-11-01 05:30"), z("2026-11-02 06:30")], local(
        got, NY
    )


def test_fixed_time_in_the_gap_hour_on_fall_back_day_is_unaffected_in_new_york() -> None:
    # 02:30 happens once on fall-back day (the repeated hour is 01:00-02:00).
    got = fires("30 2 * * *", NY, "2026-10-31 12:00", "2026-11-01 12:00")
    assert got == [z("2026-11-01 07:30")], local(got, NY)


def test_fixed_time_outside_the_shifted_hour_is_unchanged_in_new_york() -> None:
    spring = fires("30 4 * * *", NY, "2026-03-07 00:00", "2026-03-10 00:00")
    assert spring == [z("2026-03-07 09:30"), z("2026-03-08 08:30"), z("2026-03-09 08:30")]
    fall = fires("30 4 * * *", NY, "2026-10-31 00:00", "2026-11-03 00:00")
    assert fall == [z("2026-10-31 08:30"), z("2026-11-01 09:30"), z("2026-11-02 09:30")]


def test_weekday_schedule_keeps_local_time_across_the_transition_weekend_in_new_york() -> None:
    spring = fires("0 9 * * 1-5", NY, "2026-03-06 00:00", "2026-03-10 00:00")
    # Fri 09:00 EST, Mon 09:00 EDT: the UTC instant moves by an hour.
    assert spring == [z("2026-03-06 14:00"), z("2026-03-09 13:00")], local(spring, NY)
    fall = fires("0 9 * * 1-5", NY, "2026-10-30 00:00", "2026-11-03 00:00")
    assert fall == [z("2026-10-30 13:00"), z("2026-11-02 14:00")], local(fall, NY)


def test_day_of_week_schedule_inside_the_shifted_hour_follows_the_fixed_time_rule() -> None:
    # US transitions are on Sundays, so a Sunday-only job meets them.
    spring = fires("30 2 * * sun", NY, "2026-03-01 00:00", "2026-03-16 00:00")
    assert spring == [z("2026-03-01 07:30"), z("2026-03-08 07:00"), z("2026-03-15 06:30")]
    fall = fires("30 1 * * 0", NY, "2026-10-25 00:00", "2026-11-09 00:00")
    assert fall == [z("2026-10-25 05:30"), z("2026-11-01 05:30"), z("2026-11-08 06:30")]
    # ...and a Monday-to-Friday job at 02:30 simply skips the transition Sunday.
    weekdays = fires("30 2 * * 1-5", NY, "2026-03-06 00:00", "2026-03-10 00:00")
    assert weekdays == [z("2026-03-06 07:30"), z("2026-03-09 06:30")]


def test_several_wall_times_in_the_gap_collapse_into_one_run_in_new_york() -> None:
    got = fires("0,20,40 2 * * *", NY, "2026-03-08 00:00", "2026-03-09 00:00")
    assert got == [z("2026-03-08 07:00")], local(got, NY)
    # A stepped-but-fixed hour field (does not start with "*") is fixed time too.
    got = fires("0 1-23/1 * * *", NY, "2026-03-08 05:30", "2026-03-08 09:30")
    assert got == [
        z("2026-03-08 06:00"),
        z("2026-03-08 07:00"),
        z("2026-03-08 08:00"),
        z("2026-03-08 09:00"),
    ], local(got, NY)


def test_fixed_hours_list_in_repeated_hour_runs_each_wall_time_once_in_new_york() -> None:
    got = fires("0 0-3 * * *", NY, "2026-11-01 03:00", "2026-11-01 09:00")
    # 00:00 EDT, 01:00 EDT (first), 02:00 EST, 03:00 EST.
    assert got == [
        z("2026-11-01 04:00"),
        z("2026-11-01 05:00"),
        z("2026-11-01 07:00"),
        z("2026-11-01 08:00"),
    ], local(got, NY)


def test_quarter_hour_wildcard_runs_every_real_instant_in_spring_in_new_york() -> None:
    got = fires("*/15 * * * *", NY, "2026-03-08 06:00", "2026-03-08 07:30")
    # 01:15, 01:30, 01:45 EST, then 03:00, 03:15, 03:30 EDT: nothing invented at 02:xx.
    assert got == [
        z("2026-03-08 06:15"),
        z("2026-03-08 06:30"),
        z("2026-03-08 06:45"),
        z("2026-03-08 07:00"),
        z("2026-03-08 07:15"),
        z("2026-03-08 07:30"),
    ]
    assert local(got, NY)[3] == "03-08 03:00-0400"


def test_quarter_hour_wildcard_runs_both_repeated_hours_in_fall_in_new_york() -> None:
    got = fires("*/15 * * * *", NY, "2026-11-01 04:45", "2026-11-01 07:00")
    assert got == [z("2026-11-01 05:00") + timedelta(minutes=15 * i) for i in range(9)]
    assert local(got, NY) == [
        "11-01 01:00-0400",
        "11-01 01:15-0400",
        "11-01 01:30-0400",
        "11-01 01:45-0400",
        "11-01 01:00-0500",
        "11-01 01:15-0500",
        "11-01 01:30-0500",
        "11-01 01:45-0500",
        "11-01 02:00-0500",
    ]


def test_hourly_wildcard_skips_the_gap_and_runs_both_one_oclocks_in_new_york() -> None:
    spring = fires("0 * * * *", NY, "2026-03-08 04:30", "2026-03-08 08:30")
    # 00:00 EST, 01:00 EST, 03:00 EDT, 04:00 EDT (there is no 02:00).
    assert spring == [
        z("2026-03-08 05:00"),
        z("2026-03-08 06:00"),
        z("2026-03-08 07:00"),
        z("2026-03-08 08:00"),
    ]
    fall = fires("0 * * * *", NY, "2026-11-01 03:30", "2026-11-01 07:30")
    # 00:00 EDT, 01:00 EDT, 01:00 EST, 02:00 EST.
    assert fall == [
        z("2026-11-01 04:00"),
        z("2026-11-01 05:00"),
        z("2026-11-01 06:00"),
        z("2026-11-01 07:00"),
    ]


def test_wildcard_minute_in_a_fixed_hour_runs_both_passes_and_skips_the_gap_in_new_york() -> None:
    fall = fires("*/30 1 * * *", NY, "2026-11-01 00:00", "2026-11-01 12:00")
    assert local(fall, NY) == [
        "11-01 01:00-0400",
        "11-01 01:30-0400",
        "11-01 01:00-0500",
        "11-01 01:30-0500",
    ]
    spring = fires("*/30 2 * * *", NY, "2026-03-07 12:00", "2026-03-09 12:00")
    assert local(spring, NY) == ["03-09 02:00-0400", "03-09 02:30-0400"]


def test_stepped_hour_never_invents_the_missing_hour_in_new_york() -> None:
    got = fires("0 */2 * * *", NY, "2026-03-08 04:30", "2026-03-08 10:30")
    # 00:00 EST, then 04:00 EDT: 02:00 never happened, so it never runs.
    assert local(got, NY) == ["03-08 00:00-0500", "03-08 04:00-0400", "03-08 06:00-0400"]


# --------------------------------------------------------------------------- Europe/London

LONDON = "Europe/London"


def test_fixed_time_in_spring_gap_runs_once_after_the_gap_in_london() -> None:
    got = fires("30 1 * * *", LONDON, "2026-03-28 00:00", "2026-03-31 00:00")
    # Sat 01:30 GMT, Sun 02:00 BST (first instant after the gap), Mon 01:30 BST.
    assert got == [z("2026-03-28 01:30"), z("2026-03-29 01:00"), z("2026-03-30 00:30")], local(
        got, LONDON
    )


def test_fixed_time_in_repeated_hour_runs_once_at_the_first_occurrence_in_london() -> None:
    got = fires("30 1 * * *", LONDON, "2026-10-24 00:00", "2026-10-27 00:00")
    # Sat 01:30 BST, Sun 01:30 BST (first of two), Mon 01:30 GMT.
    assert got == [z("2026-10-24 00:30"), z("2026-10-25 00:30"), z("2026-10-26 01:30")], local(
        got, LONDON
    )


def test_fixed_time_outside_the_shifted_hour_is_unchanged_in_london() -> None:
    got = fires("0 3 * * *", LONDON, "2026-03-28 00:00", "2026-03-30 00:00")
    assert got == [z("2026-03-28 03:00"), z("2026-03-29 02:00")]
    got = fires("0 3 * * *", LONDON, "2026-10-24 00:00", "2026-10-26 00:00")
    assert got == [z("2026-10-24 02:00"), z("2026-10-25 03:00")]


def test_weekday_schedule_keeps_local_time_across_the_transition_weekend_in_london() -> None:
    got = fires("0 9 * * 1-5", LONDON, "2026-03-27 00:00", "2026-03-31 00:00")
    assert got == [z("2026-03-27 09:00"), z("2026-03-30 08:00")]
    got = fires("0 9 * * mon-fri", LONDON, "2026-10-23 00:00", "2026-10-27 00:00")
    assert got == [z("2026-10-23 08:00"), z("2026-10-26 09:00")]
    # Sunday-only, inside the shifted hour: the fixed-time rule.
    got = fires("30 1 * * 0", LONDON, "2026-03-22 00:00", "2026-04-06 00:00")
    assert got == [z("2026-03-22 01:30"), z("2026-03-29 01:00"), z("2026-04-05 00:30")]


def test_wildcards_run_every_real_instant_in_london() -> None:
    spring = fires("0 * * * *", LONDON, "2026-03-28 23:30", "2026-03-29 02:30")
    # 00:00 GMT, 02:00 BST, 03:00 BST: 01:00 never happened.
    assert spring == [z("2026-03-29 00:00"), z("2026-03-29 01:00"), z("2026-03-29 02:00")]
    assert local(spring, LONDON) == ["03-29 00:00+0000", "03-29 02:00+0100", "03-29 03:00+0100"]
    fall = fires("0 * * * *", LONDON, "2026-10-24 22:30", "2026-10-25 02:30")
    # 00:00 BST, 01:00 BST, 01:00 GMT, 02:00 GMT.
    assert fall == [
        z("2026-10-24 23:00"),
        z("2026-10-25 00:00"),
        z("2026-10-25 01:00"),
        z("2026-10-25 02:00"),
    ]
    quarter = fires("*/15 * * * *", LONDON, "2026-10-24 23:45", "2026-10-25 02:00")
    assert quarter == [z("2026-10-25 00:00") + timedelta(minutes=15 * i) for i in range(9)]


# --------------------------------------------------------------------------- Australia/Lord_Howe

LORD_HOWE = "Australia/Lord_Howe"


def test_fixed_time_in_half_hour_gap_runs_once_after_the_gap_on_lord_howe() -> None:
    got = fires("15 2 * * *", LORD_HOWE, "2026-10-02 00:00", "2026-10-05 00:00")
    # Sat 02:15 +10:30, Sun 02:30 +11 (02:00-02:30 was skipped), Mon 02:15 +11.
    assert got == [z("2026-10-02 15:45"), z("2026-10-03 15:30"), z("2026-10-04 15:15")], local(
        got, LORD_HOWE
    )


def test_fixed_time_after_the_half_hour_gap_is_unchanged_on_lord_howe() -> None:
    # 02:45 is in the shifted clock hour but exists: it runs at 02:45.
    got = fires("45 2 * * *", LORD_HOWE, "2026-10-02 00:00", "2026-10-04 00:00")
    assert got == [z("2026-10-02 16:15"), z("2026-10-03 15:45")], local(got, LORD_HOWE)


def test_fixed_time_in_repeated_half_hour_runs_once_on_lord_howe() -> None:
    got = fires("45 1 * * *", LORD_HOWE, "2026-04-03 00:00", "2026-04-06 00:00")
    # Sat 01:45 +11, Sun 01:45 +11 (not again at 01:45 +10:30), Mon 01:45 +10:30.
    assert got == [z("2026-04-03 14:45"), z("2026-04-04 14:45"), z("2026-04-05 15:15")], local(
        got, LORD_HOWE
    )
    # 01:15 is before the repeated half hour: once, unchanged.
    got = fires("15 1 * * *", LORD_HOWE, "2026-04-04 00:00", "2026-04-05 00:00")
    assert got == [z("2026-04-04 14:15")]


def test_weekday_schedule_keeps_local_time_on_lord_howe() -> None:
    got = fires("0 9 * * 1-5", LORD_HOWE, "2026-10-01 00:00", "2026-10-05 00:00")
    # Fri 09:00 +10:30, Mon 09:00 +11.
    assert got == [z("2026-10-01 22:30"), z("2026-10-04 22:00")]
    got = fires("15 2 * * sun", LORD_HOWE, "2026-09-26 00:00", "2026-10-12 00:00")
    assert got == [z("2026-09-26 15:45"), z("2026-10-03 15:30"), z("2026-10-10 15:15")]


def test_quarter_hour_wildcard_on_lord_howe() -> None:
    spring = fires("*/15 * * * *", LORD_HOWE, "2026-10-03 15:00", "2026-10-03 16:00")
    assert local(spring, LORD_HOWE) == [
        "10-04 01:45+1030",
        "10-04 02:30+1100",
        "10-04 02:45+1100",
        "10-04 03:00+1100",
    ]
    fall = fires("*/15 * * * *", LORD_HOWE, "2026-04-04 14:15", "2026-04-04 15:30")
    assert local(fall, LORD_HOWE) == [
        "04-05 01:30+1100",
        "04-05 01:45+1100",
        "04-05 01:30+1030",
        "04-05 01:45+1030",
        "04-05 02:00+1030",
    ]


def test_hourly_wildcard_has_ninety_minute_gaps_on_lord_howe() -> None:
    spring = fires("0 * * * *", LORD_HOWE, "2026-10-03 13:00", "2026-10-03 17:00")
    # 01:00 +10:30 then 03:00 +11: 02:00 never happened.
    assert local(spring, LORD_HOWE) == [
        "10-04 00:00+1030",
        "10-04 01:00+1030",
        "10-04 03:00+1100",
        "10-04 04:00+1100",
    ]
    fall = fires("0 * * * *", LORD_HOWE, "2026-04-04 12:30", "2026-04-04 16:30")
    # 01:00 +11, then 02:00 +10:30, 90 minutes later: no whole hour was repeated.
    assert fall == [
        z("2026-04-04 13:00"),
        z("2026-04-04 14:00"),
        z("2026-04-04 15:30"),
        z("2026-04-04 16:30"),
    ]
    assert Schedule("0 * * * *", timezone=LORD_HOWE).min_interval() == timedelta(hours=1)


def test_stepped_hour_finds_the_half_shifted_hour_on_lord_howe() -> None:
    # 02:13 +10:30 exists once on fall-back day (after the repeated 01:30-02:00).
    got = fires("13 */2 * * *", LORD_HOWE, "2026-04-04 12:00", "2026-04-04 18:00")
    assert local(got, LORD_HOWE) == ["04-05 00:13+1100", "04-05 02:13+1030", "04-05 04:13+1030"]


# --------------------------------------------------------------------------- L and #
# European clocks change on the last Sunday of March and October (0L), American
# ones on the second Sunday of March (0#2) and the first of November (0#1): a
# job on such a day meets the transition, with the same rule as any other.


def test_last_sunday_at_a_fixed_time_follows_the_fixed_time_rule_in_london() -> None:
    spring = fires("30 1 * 3 0L", LONDON, "2026-01-01 00:00", "2028-01-01 00:00")
    # 01:30 does not exist on either day: 02:00 BST, the end of the gap.
    assert spring == [z("2026-03-29 01:00"), z("2027-03-28 01:00")], local(spring, LONDON)
    fall = fires("30 1 * 10 0L", LONDON, "2026-01-01 00:00", "2028-01-01 00:00")
    # 01:30 happens twice: once, at the first (BST).
    assert fall == [z("2026-10-25 00:30"), z("2027-10-31 00:30")], local(fall, LONDON)


def test_last_sunday_with_wildcards_runs_every_real_instant_in_london() -> None:
    spring = fires("0 * * 3 SUNL", LONDON, "2026-03-28 23:30", "2026-03-29 02:30")
    assert local(spring, LONDON) == ["03-29 00:00+0000", "03-29 02:00+0100", "03-29 03:00+0100"]
    fall = fires("*/30 1 * 10 7L", LONDON, "2026-10-24 12:00", "2026-10-26 00:00")
    assert local(fall, LONDON) == [
        "10-25 01:00+0100",
        "10-25 01:30+0100",
        "10-25 01:00+0000",
        "10-25 01:30+0000",
    ]


def test_nth_sunday_at_a_fixed_time_follows_the_fixed_time_rule_in_new_york() -> None:
    spring = fires("30 2 * 3 0#2", NY, "2026-01-01 00:00", "2027-01-01 00:00")
    # Sun 8 March: 02:30 does not exist, so 03:00 EDT.
    assert spring == [z("2026-03-08 07:00")], local(spring, NY)
    fall = fires("30 1 * 11 sun#1", NY, "2026-01-01 00:00", "2027-01-01 00:00")
    # Sun 1 November: 01:30 EDT only, not again at 01:30 EST.
    assert fall == [z("2026-11-01 05:30")], local(fall, NY)
    stepped = fires("0 */2 * 3 0#2", NY, "2026-01-01 00:00", "2027-01-01 00:00")
    assert local(stepped, NY)[:3] == ["03-08 00:00-0500", "03-08 04:00-0400", "03-08 06:00-0400"]


# --------------------------------------------------------------------------- other zones


def test_negative_dst_in_dublin_behaves_like_any_other_transition() -> None:
    got = fires("30 1 * * *", "Europe/Dublin", "2026-03-28 00:00", "2026-03-31 00:00")
    assert got == [z("2026-03-28 01:30"), z("2026-03-29 01:00"), z("2026-03-30 00:30")]
    got = fires("30 1 * * *", "Europe/Dublin", "2026-10-24 00:00", "2026-10-27 00:00")
    assert got == [z("2026-10-24 00:30"), z("2026-10-25 00:30"), z("2026-10-26 01:30")]
    got = fires("0 * * * *", "Europe/Dublin", "2026-10-24 23:30", "2026-10-25 02:00")
    assert got == [z("2026-10-25 00:00"), z("2026-10-25 01:00"), z("2026-10-25 02:00")]


def test_midnight_gap_in_santiago_moves_the_run_to_one_oclock_the_same_day() -> None:
    got = fires("0 0 * * *", "America/Santiago", "2026-09-05 00:00", "2026-09-08 00:00")
    # Sat 00:00 -04, Sun 01:00 -03 (00:00-01:00 was skipped), Mon 00:00 -03.
    assert local(got, "America/Santiago") == [
        "09-05 00:00-0400",
        "09-06 01:00-0300",
        "09-07 00:00-0300",
    ]


def test_repeated_evening_hour_in_santiago_runs_fixed_time_once() -> None:
    got = fires("30 23 * * *", "America/Santiago", "2026-04-03 12:00", "2026-04-06 12:00")
    # Saturday's 23:30 happens twice (-03, then -04): it runs at the first.
    assert local(got, "America/Santiago") == [
        "04-03 23:30-0300",
        "04-04 23:30-0300",
        "04-05 23:30-0400",
    ]
    assert got == [z("2026-04-04 02:30"), z("2026-04-05 02:30"), z("2026-04-06 03:30")]


def test_utc_has_no_transitions() -> None:
    got = fires("30 2 * * *", "UTC", "2026-03-07 00:00", "2026-03-10 00:00")
    assert got == [z("2026-03-07 02:30"), z("2026-03-08 02:30"), z("2026-03-09 02:30")]


def test_jitter_shifts_the_dst_substitute_like_any_other_fire_time() -> None:
    plain = Schedule("30 2 * * *", timezone=NY)
    jittered = Schedule("30 2 * * *", timezone=NY, jitter=timedelta(minutes=10), key="a.job")
    base = plain.fire_times(z("2026-03-07 00:00"), z("2026-03-10 00:00"))
    assert jittered.fire_times(z("2026-03-07 00:00"), z("2026-03-10 00:00")) == [
        t + jittered.offset for t in base
    ]


def test_next_after_inside_the_second_pass_finds_the_remaining_second_pass_instants() -> None:
    s = Schedule("*/15 * * * *", timezone=NY)
    # 06:20Z is 01:20 EST, in the second pass of 01:00-02:00.
    assert s.next_after(z("2026-11-01 06:20")) == z("2026-11-01 06:30")
    fixed = Schedule("45 1 * * *", timezone=NY)
    # The day's 01:45 already ran (EDT); the next is tomorrow's.
    assert fixed.next_after(z("2026-11-01 06:20")) == z("2026-11-02 06:45")
    # Just before the fall back, the day's 01:45 EDT is still ahead.
    assert fixed.next_after(z("2026-11-01 04:50")) == z("2026-11-01 05:45")


def test_min_interval_sees_the_spring_forward_shortening() -> None:
    # Every three hours on the wall clock: 00:00 EST to 03:00 EDT is 2 real hours.
    assert Schedule("0 */3 * * *", timezone=NY).min_interval() == timedelta(hours=2)
    # A frequent schedule reaches the 3000-fire cap in January but still sees
    # the March and November transitions.
    assert Schedule("0,30 */3 * * *", timezone=NY).min_interval() == timedelta(minutes=30)
    assert Schedule("30 1 * * *", timezone=NY).min_interval() == timedelta(hours=23)
    assert Schedule("30 2 * * *", timezone=NY).min_interval() == timedelta(hours=23, minutes=30)
