"""Schedules across both DST transitions, as exact lists of instants.

The rule (ISC/Debian cron, docs/schedules.md):

* fixed time (minute and hour fields do not start with "*"): a wall time in
  the spring-forward gap fires once, at the first instant after the gap; a wall
  time that happens twice fires once, at its first occurrence;
* wildcard or stepped hour: every real instant whose wall time matches fires;
  nothing is invented in the gap, and both occurrences of a repeated wall time
  fire.

Each case of ``FIRE_TIMES`` is a zone, an expression, a window ``(start, end]`` in UTC and
every fire time in it, written as the wall clock of the zone with its UTC offset
(``2026-03-08 03:00-0400``): the offset makes each one an exact instant, and the wall time
is what the rule speaks of.

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
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from django_fencedjobs.schedule import Schedule

NY = "America/New_York"
LONDON = "Europe/London"
LORD_HOWE = "Australia/Lord_Howe"
DUBLIN = "Europe/Dublin"
SANTIAGO = "America/Santiago"

#: How an expected fire time is written: the zone's wall clock and its UTC offset.
WALL = "%Y-%m-%d %H:%M%z"


def z(text: str) -> datetime:
    """An aware UTC instant from "YYYY-MM-DD HH:MM"."""
    return datetime.strptime(text, "%Y-%m-%d %H:%M").replace(tzinfo=UTC)


def local(instants: list[datetime], zone: str) -> list[str]:
    """Instants as wall times of ``zone`` with their offset (``WALL``)."""
    tz = ZoneInfo(zone)
    return [t.astimezone(tz).strftime(WALL) for t in instants]


def instants(walls: list[str]) -> list[datetime]:
    """The instants that wall times written as ``WALL`` name."""
    return [datetime.strptime(wall, WALL) for wall in walls]


def case(zone: str, cron: str, start: str, end: str, behaviour: str, expected: list[str]) -> Any:
    """One row: its id reads as the zone, the expression and what it does."""
    city = "UTC" if zone == "UTC" else zone.rsplit("/", 1)[1].replace("_", " ")
    return pytest.param(zone, cron, start, end, expected, id=f"{city}, {cron}: {behaviour}")


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


FIRE_TIMES = [
    # ------------------------------------------------------------------- America/New_York
    # Sat 02:30 EST, Sun (02:30 does not exist) 03:00 EDT, Mon 02:30 EDT.
    case(NY, "30 2 * * *", "2026-03-07 00:00", "2026-03-10 00:00",
         "on 03-08 02:30 is in the spring gap, so it runs once, at 03:00 EDT",
         ["2026-03-07 02:30-0500", "2026-03-08 03:00-0400", "2026-03-09 02:30-0400"]),
    # Sat 01:30 EDT, Sun 01:30 EDT (not again at 01:30 EST), Mon 01:30 EST.
    case(NY, "30 1 * * *", "2026-10-31 00:00", "2026-11-03 00:00",
         "on 11-01 01:30 happens twice and runs once, at the first (EDT)",
         ["2026-10-31 01:30-0400", "2026-11-01 01:30-0400", "2026-11-02 01:30-0500"]),
    # 02:30 happens once on fall-back day (the repeated hour is 01:00-02:00).
    case(NY, "30 2 * * *", "2026-10-31 12:00", "2026-11-01 12:00",
         "on 11-01 02:30 is after the repeated hour and runs as on any day",
         ["2026-11-01 02:30-0500"]),
    # A fixed time outside the shifted hour is unchanged, in spring and in the fall.
    case(NY, "30 4 * * *", "2026-03-07 00:00", "2026-03-10 00:00",
         "on 03-08 04:30 is outside the shifted hour and unchanged",
         ["2026-03-07 04:30-0500", "2026-03-08 04:30-0400", "2026-03-09 04:30-0400"]),
    case(NY, "30 4 * * *", "2026-10-31 00:00", "2026-11-03 00:00",
         "on 11-01 04:30 is outside the shifted hour and unchanged",
         ["2026-10-31 04:30-0400", "2026-11-01 04:30-0500", "2026-11-02 04:30-0500"]),
    # Fri 09:00 EST, Mon 09:00 EDT: the UTC instant moves by an hour.
    case(NY, "0 9 * * 1-5", "2026-03-06 00:00", "2026-03-10 00:00",
         "across the 03-08 weekend weekdays keep 09:00 local time",
         ["2026-03-06 09:00-0500", "2026-03-09 09:00-0400"]),
    case(NY, "0 9 * * 1-5", "2026-10-30 00:00", "2026-11-03 00:00",
         "across the 11-01 weekend weekdays keep 09:00 local time",
         ["2026-10-30 09:00-0400", "2026-11-02 09:00-0500"]),
    # A day-of-week schedule inside the shifted hour follows the fixed-time rule: US
    # transitions are on Sundays, so a Sunday-only job meets them...
    case(NY, "30 2 * * sun", "2026-03-01 00:00", "2026-03-16 00:00",
         "the Sunday 03-08 02:30 is in the spring gap, so it runs at 03:00 EDT",
         ["2026-03-01 02:30-0500", "2026-03-08 03:00-0400", "2026-03-15 02:30-0400"]),
    case(NY, "30 1 * * 0", "2026-10-25 00:00", "2026-11-09 00:00",
         "the Sunday 11-01 01:30 happens twice and runs once, at the first (EDT)",
         ["2026-10-25 01:30-0400", "2026-11-01 01:30-0400", "2026-11-08 01:30-0500"]),
    # ...and a Monday-to-Friday job at 02:30 simply skips the transition Sunday.
    case(NY, "30 2 * * 1-5", "2026-03-06 00:00", "2026-03-10 00:00",
         "weekdays at 02:30 skip the transition Sunday 03-08",
         ["2026-03-06 02:30-0500", "2026-03-09 02:30-0400"]),
    # Several wall times in the gap collapse into one run.
    case(NY, "0,20,40 2 * * *", "2026-03-08 00:00", "2026-03-09 00:00",
         "on 03-08 three wall times in the spring gap are one run at 03:00 EDT",
         ["2026-03-08 03:00-0400"]),
    # A stepped-but-fixed hour field (does not start with "*") is fixed time too.
    case(NY, "0 1-23/1 * * *", "2026-03-08 05:30", "2026-03-08 09:30",
         "on 03-08 02:00 is in the spring gap and is one run with 03:00",
         ["2026-03-08 01:00-0500", "2026-03-08 03:00-0400", "2026-03-08 04:00-0400",
          "2026-03-08 05:00-0400"]),
    # 00:00 EDT, 01:00 EDT (first), 02:00 EST, 03:00 EST.
    case(NY, "0 0-3 * * *", "2026-11-01 03:00", "2026-11-01 09:00",
         "on 11-01 an hour list runs each wall time once, 01:00 at the first (EDT)",
         ["2026-11-01 00:00-0400", "2026-11-01 01:00-0400", "2026-11-01 02:00-0500",
          "2026-11-01 03:00-0500"]),
    # 01:15, 01:30, 01:45 EST, then 03:00, 03:15, 03:30 EDT: nothing invented at 02:xx.
    case(NY, "*/15 * * * *", "2026-03-08 06:00", "2026-03-08 07:30",
         "on 03-08 every real quarter hour runs, none is invented in the spring gap",
         ["2026-03-08 01:15-0500", "2026-03-08 01:30-0500", "2026-03-08 01:45-0500",
          "2026-03-08 03:00-0400", "2026-03-08 03:15-0400", "2026-03-08 03:30-0400"]),
    case(NY, "*/15 * * * *", "2026-11-01 04:45", "2026-11-01 07:00",
         "on 11-01 every quarter hour of both passes of 01:00-02:00 runs",
         ["2026-11-01 01:00-0400", "2026-11-01 01:15-0400", "2026-11-01 01:30-0400",
          "2026-11-01 01:45-0400", "2026-11-01 01:00-0500", "2026-11-01 01:15-0500",
          "2026-11-01 01:30-0500", "2026-11-01 01:45-0500", "2026-11-01 02:00-0500"]),
    # 00:00 EST, 01:00 EST, 03:00 EDT, 04:00 EDT (there is no 02:00).
    case(NY, "0 * * * *", "2026-03-08 04:30", "2026-03-08 08:30",
         "on 03-08 hourly skips the spring gap's 02:00",
         ["2026-03-08 00:00-0500", "2026-03-08 01:00-0500", "2026-03-08 03:00-0400",
          "2026-03-08 04:00-0400"]),
    # 00:00 EDT, 01:00 EDT, 01:00 EST, 02:00 EST.
    case(NY, "0 * * * *", "2026-11-01 03:30", "2026-11-01 07:30",
         "on 11-01 hourly runs both 01:00s",
         ["2026-11-01 00:00-0400", "2026-11-01 01:00-0400", "2026-11-01 01:00-0500",
          "2026-11-01 02:00-0500"]),
    # A wildcard minute in a fixed hour runs both passes and skips the gap.
    case(NY, "*/30 1 * * *", "2026-11-01 00:00", "2026-11-01 12:00",
         "on 11-01 a wildcard minute in hour 1 runs in both passes",
         ["2026-11-01 01:00-0400", "2026-11-01 01:30-0400", "2026-11-01 01:00-0500",
          "2026-11-01 01:30-0500"]),
    case(NY, "*/30 2 * * *", "2026-03-07 12:00", "2026-03-09 12:00",
         "on 03-08 a wildcard minute in hour 2 has nothing to run (all in the gap)",
         ["2026-03-09 02:00-0400", "2026-03-09 02:30-0400"]),
    # 00:00 EST, then 04:00 EDT: 02:00 never happened, so it never runs.
    case(NY, "0 */2 * * *", "2026-03-08 04:30", "2026-03-08 10:30",
         "on 03-08 a stepped hour never invents the missing 02:00",
         ["2026-03-08 00:00-0500", "2026-03-08 04:00-0400", "2026-03-08 06:00-0400"]),
    # ---------------------------------------------------------------------- Europe/London
    # Sat 01:30 GMT, Sun 02:00 BST (first instant after the gap), Mon 01:30 BST.
    case(LONDON, "30 1 * * *", "2026-03-28 00:00", "2026-03-31 00:00",
         "on 03-29 01:30 is in the spring gap, so it runs once, at 02:00 BST",
         ["2026-03-28 01:30+0000", "2026-03-29 02:00+0100", "2026-03-30 01:30+0100"]),
    # Sat 01:30 BST, Sun 01:30 BST (first of two), Mon 01:30 GMT.
    case(LONDON, "30 1 * * *", "2026-10-24 00:00", "2026-10-27 00:00",
         "on 10-25 01:30 happens twice and runs once, at the first (BST)",
         ["2026-10-24 01:30+0100", "2026-10-25 01:30+0100", "2026-10-26 01:30+0000"]),
    # A fixed time outside the shifted hour is unchanged.
    case(LONDON, "0 3 * * *", "2026-03-28 00:00", "2026-03-30 00:00",
         "on 03-29 03:00 is outside the shifted hour and unchanged",
         ["2026-03-28 03:00+0000", "2026-03-29 03:00+0100"]),
    case(LONDON, "0 3 * * *", "2026-10-24 00:00", "2026-10-26 00:00",
         "on 10-25 03:00 is outside the shifted hour and unchanged",
         ["2026-10-24 03:00+0100", "2026-10-25 03:00+0000"]),
    # A weekday schedule keeps its local time across the transition weekend.
    case(LONDON, "0 9 * * 1-5", "2026-03-27 00:00", "2026-03-31 00:00",
         "across the 03-29 weekend weekdays keep 09:00 local time",
         ["2026-03-27 09:00+0000", "2026-03-30 09:00+0100"]),
    case(LONDON, "0 9 * * mon-fri", "2026-10-23 00:00", "2026-10-27 00:00",
         "across the 10-25 weekend weekdays keep 09:00 local time",
         ["2026-10-23 09:00+0100", "2026-10-26 09:00+0000"]),
    # Sunday-only, inside the shifted hour: the fixed-time rule.
    case(LONDON, "30 1 * * 0", "2026-03-22 00:00", "2026-04-06 00:00",
         "the Sunday 03-29 01:30 is in the spring gap, so it runs at 02:00 BST",
         ["2026-03-22 01:30+0000", "2026-03-29 02:00+0100", "2026-04-05 01:30+0100"]),
    # Wildcards run every real instant. 00:00 GMT, 02:00 BST, 03:00 BST: 01:00 never happened.
    case(LONDON, "0 * * * *", "2026-03-28 23:30", "2026-03-29 02:30",
         "on 03-29 hourly skips the spring gap's 01:00",
         ["2026-03-29 00:00+0000", "2026-03-29 02:00+0100", "2026-03-29 03:00+0100"]),
    # 00:00 BST, 01:00 BST, 01:00 GMT, 02:00 GMT.
    case(LONDON, "0 * * * *", "2026-10-24 22:30", "2026-10-25 02:30",
         "on 10-25 hourly runs both 01:00s",
         ["2026-10-25 00:00+0100", "2026-10-25 01:00+0100", "2026-10-25 01:00+0000",
          "2026-10-25 02:00+0000"]),
    case(LONDON, "*/15 * * * *", "2026-10-24 23:45", "2026-10-25 02:00",
         "on 10-25 every quarter hour of both passes of 01:00-02:00 runs",
         ["2026-10-25 01:00+0100", "2026-10-25 01:15+0100", "2026-10-25 01:30+0100",
          "2026-10-25 01:45+0100", "2026-10-25 01:00+0000", "2026-10-25 01:15+0000",
          "2026-10-25 01:30+0000", "2026-10-25 01:45+0000", "2026-10-25 02:00+0000"]),
    # ---------------------------------------------------------------- Australia/Lord_Howe
    # Sat 02:15 +10:30, Sun 02:30 +11 (02:00-02:30 was skipped), Mon 02:15 +11.
    case(LORD_HOWE, "15 2 * * *", "2026-10-02 00:00", "2026-10-05 00:00",
         "on 10-04 02:15 is in the half-hour spring gap, so it runs once, at 02:30",
         ["2026-10-03 02:15+1030", "2026-10-04 02:30+1100", "2026-10-05 02:15+1100"]),
    # 02:45 is in the shifted clock hour but exists: it runs at 02:45.
    case(LORD_HOWE, "45 2 * * *", "2026-10-02 00:00", "2026-10-04 00:00",
         "on 10-04 02:45 is after the half-hour gap and unchanged",
         ["2026-10-03 02:45+1030", "2026-10-04 02:45+1100"]),
    # Sat 01:45 +11, Sun 01:45 +11 (not again at 01:45 +10:30), Mon 01:45 +10:30.
    case(LORD_HOWE, "45 1 * * *", "2026-04-03 00:00", "2026-04-06 00:00",
         "on 04-05 01:45 happens twice and runs once, at the first (+11)",
         ["2026-04-04 01:45+1100", "2026-04-05 01:45+1100", "2026-04-06 01:45+1030"]),
    # 01:15 is before the repeated half hour: once, unchanged.
    case(LORD_HOWE, "15 1 * * *", "2026-04-04 00:00", "2026-04-05 00:00",
         "on 04-05 01:15 is before the repeated half hour and runs once",
         ["2026-04-05 01:15+1100"]),
    # Fri 09:00 +10:30, Mon 09:00 +11.
    case(LORD_HOWE, "0 9 * * 1-5", "2026-10-01 00:00", "2026-10-05 00:00",
         "across the 10-04 weekend weekdays keep 09:00 local time",
         ["2026-10-02 09:00+1030", "2026-10-05 09:00+1100"]),
    case(LORD_HOWE, "15 2 * * sun", "2026-09-26 00:00", "2026-10-12 00:00",
         "the Sunday 10-04 02:15 is in the spring gap, so it runs at 02:30",
         ["2026-09-27 02:15+1030", "2026-10-04 02:30+1100", "2026-10-11 02:15+1100"]),
    case(LORD_HOWE, "*/15 * * * *", "2026-10-03 15:00", "2026-10-03 16:00",
         "on 10-04 every real quarter hour runs, 02:00 and 02:15 never happen",
         ["2026-10-04 01:45+1030", "2026-10-04 02:30+1100", "2026-10-04 02:45+1100",
          "2026-10-04 03:00+1100"]),
    case(LORD_HOWE, "*/15 * * * *", "2026-04-04 14:15", "2026-04-04 15:30",
         "on 04-05 the repeated 01:30 and 01:45 run twice",
         ["2026-04-05 01:30+1100", "2026-04-05 01:45+1100", "2026-04-05 01:30+1030",
          "2026-04-05 01:45+1030", "2026-04-05 02:00+1030"]),
    # 01:00 +10:30 then 03:00 +11: 02:00 never happened.
    case(LORD_HOWE, "0 * * * *", "2026-10-03 13:00", "2026-10-03 17:00",
         "on 10-04 hourly has a ninety-minute gap, from 01:00 to 03:00",
         ["2026-10-04 00:00+1030", "2026-10-04 01:00+1030", "2026-10-04 03:00+1100",
          "2026-10-04 04:00+1100"]),
    # 01:00 +11, then 02:00 +10:30, 90 minutes later: no whole hour was repeated.
    case(LORD_HOWE, "0 * * * *", "2026-04-04 12:30", "2026-04-04 16:30",
         "on 04-05 hourly has a ninety-minute gap, from 01:00 to 02:00",
         ["2026-04-05 00:00+1100", "2026-04-05 01:00+1100", "2026-04-05 02:00+1030",
          "2026-04-05 03:00+1030"]),
    # 02:13 +10:30 exists once on fall-back day (after the repeated 01:30-02:00).
    case(LORD_HOWE, "13 */2 * * *", "2026-04-04 12:00", "2026-04-04 18:00",
         "on 04-05 a stepped hour finds 02:13 once, after the repeated half hour",
         ["2026-04-05 00:13+1100", "2026-04-05 02:13+1030", "2026-04-05 04:13+1030"]),
    # ---------------------------------------------------------------------- L and #
    # European clocks change on the last Sunday of March and October (0L), American
    # ones on the second Sunday of March (0#2) and the first of November (0#1): a
    # job on such a day meets the transition, with the same rule as any other.
    #
    # 01:30 does not exist on either day: 02:00 BST, the end of the gap.
    case(LONDON, "30 1 * 3 0L", "2026-01-01 00:00", "2028-01-01 00:00",
         "on the last Sunday of March 01:30 is in the gap, so it runs at 02:00 BST",
         ["2026-03-29 02:00+0100", "2027-03-28 02:00+0100"]),
    # 01:30 happens twice: once, at the first (BST).
    case(LONDON, "30 1 * 10 0L", "2026-01-01 00:00", "2028-01-01 00:00",
         "on the last Sunday of October 01:30 runs once, at the first (BST)",
         ["2026-10-25 01:30+0100", "2027-10-31 01:30+0100"]),
    # The last Sunday with wildcards runs every real instant.
    case(LONDON, "0 * * 3 SUNL", "2026-03-28 23:30", "2026-03-29 02:30",
         "on the last Sunday of March hourly skips the gap's 01:00",
         ["2026-03-29 00:00+0000", "2026-03-29 02:00+0100", "2026-03-29 03:00+0100"]),
    case(LONDON, "*/30 1 * 10 7L", "2026-10-24 12:00", "2026-10-26 00:00",
         "on the last Sunday of October the wildcard minute runs in both passes",
         ["2026-10-25 01:00+0100", "2026-10-25 01:30+0100", "2026-10-25 01:00+0000",
          "2026-10-25 01:30+0000"]),
    # Sun 8 March: 02:30 does not exist, so 03:00 EDT.
    case(NY, "30 2 * 3 0#2", "2026-01-01 00:00", "2027-01-01 00:00",
         "on the second Sunday of March 02:30 is in the gap, so it runs at 03:00 EDT",
         ["2026-03-08 03:00-0400"]),
    # Sun 1 November: 01:30 EDT only, not again at 01:30 EST.
    case(NY, "30 1 * 11 sun#1", "2026-01-01 00:00", "2027-01-01 00:00",
         "on the first Sunday of November 01:30 runs once, at the first (EDT)",
         ["2026-11-01 01:30-0400"]),
    case(NY, "0 */2 * 3 0#2", "2026-01-01 00:00", "2027-01-01 00:00",
         "on the second Sunday of March a stepped hour never invents 02:00",
         ["2026-03-08 00:00-0500", "2026-03-08 04:00-0400", "2026-03-08 06:00-0400",
          "2026-03-08 08:00-0400", "2026-03-08 10:00-0400", "2026-03-08 12:00-0400",
          "2026-03-08 14:00-0400", "2026-03-08 16:00-0400", "2026-03-08 18:00-0400",
          "2026-03-08 20:00-0400", "2026-03-08 22:00-0400"]),
    # ---------------------------------------------------------------------- other zones
    # Negative DST in Dublin behaves like any other transition.
    case(DUBLIN, "30 1 * * *", "2026-03-28 00:00", "2026-03-31 00:00",
         "on 03-29 01:30 is in the spring gap, so it runs once, at 02:00 IST",
         ["2026-03-28 01:30+0000", "2026-03-29 02:00+0100", "2026-03-30 01:30+0100"]),
    case(DUBLIN, "30 1 * * *", "2026-10-24 00:00", "2026-10-27 00:00",
         "on 10-25 01:30 happens twice and runs once, at the first (IST)",
         ["2026-10-24 01:30+0100", "2026-10-25 01:30+0100", "2026-10-26 01:30+0000"]),
    case(DUBLIN, "0 * * * *", "2026-10-24 23:30", "2026-10-25 02:00",
         "on 10-25 hourly runs both 01:00s",
         ["2026-10-25 01:00+0100", "2026-10-25 01:00+0000", "2026-10-25 02:00+0000"]),
    # Sat 00:00 -04, Sun 01:00 -03 (00:00-01:00 was skipped), Mon 00:00 -03.
    case(SANTIAGO, "0 0 * * *", "2026-09-05 00:00", "2026-09-08 00:00",
         "on 09-06 midnight is in the spring gap, so it runs at 01:00 the same day",
         ["2026-09-05 00:00-0400", "2026-09-06 01:00-0300", "2026-09-07 00:00-0300"]),
    # Saturday's 23:30 happens twice (-03, then -04): it runs at the first.
    case(SANTIAGO, "30 23 * * *", "2026-04-03 12:00", "2026-04-06 12:00",
         "on 04-04 the evening's 23:30 happens twice and runs once, at the first (-03)",
         ["2026-04-03 23:30-0300", "2026-04-04 23:30-0300", "2026-04-05 23:30-0400"]),
    case("UTC", "30 2 * * *", "2026-03-07 00:00", "2026-03-10 00:00",
         "no transitions, 02:30 every day",
         ["2026-03-07 02:30+0000", "2026-03-08 02:30+0000", "2026-03-09 02:30+0000"]),
]  # fmt: skip


@pytest.mark.parametrize(("zone", "cron", "start", "end", "expected"), FIRE_TIMES)
def test_fire_times_across_a_transition(
    zone: str, cron: str, start: str, end: str, expected: list[str]
) -> None:
    got = Schedule(cron, timezone=zone).fire_times(z(start), z(end))
    assert local(got, zone) == expected
    assert got == instants(expected)  # to the microsecond, not only to the minute


@pytest.mark.parametrize(
    ("cron", "after", "expected"),
    [
        pytest.param(
            "*/15 * * * *",
            "2026-11-01 06:20",
            "2026-11-01 01:30-0500",
            id="*/15 * * * *: from 01:20 EST, the second pass of 01:00-02:00, next is 01:30 EST",
        ),
        pytest.param(
            "45 1 * * *",
            "2026-11-01 06:20",
            "2026-11-02 01:45-0500",
            id="45 1 * * *: the day's 01:45 already ran (EDT), next is tomorrow's",
        ),
        pytest.param(
            "45 1 * * *",
            "2026-11-01 04:50",
            "2026-11-01 01:45-0400",
            id="45 1 * * *: just before the fall back, the day's 01:45 EDT is still ahead",
        ),
    ],
)
def test_next_after_inside_the_repeated_hour_in_new_york(
    cron: str, after: str, expected: str
) -> None:
    got = Schedule(cron, timezone=NY).next_after(z(after))
    assert local([got], NY) == [expected]
    assert [got] == instants([expected])


@pytest.mark.parametrize(
    ("zone", "cron", "expected"),
    [
        pytest.param(
            NY,
            "0 */3 * * *",
            timedelta(hours=2),
            id="New York, 0 */3 * * *: 00:00 EST to 03:00 EDT is two real hours",
        ),
        pytest.param(
            NY,
            "0,30 */3 * * *",
            timedelta(minutes=30),
            # A frequent schedule reaches the 3000-fire cap in January but still sees
            # the March and November transitions.
            id="New York, 0,30 */3 * * *: past the fire-time cap, the transitions still count",
        ),
        pytest.param(
            NY,
            "30 1 * * *",
            timedelta(hours=23),
            id="New York, 30 1 * * *: the spring-forward day is 23 hours",
        ),
        pytest.param(
            NY,
            "30 2 * * *",
            timedelta(hours=23, minutes=30),
            id="New York, 30 2 * * *: 03:00 EDT (in place of 02:30) to the next 02:30 EDT",
        ),
        pytest.param(
            LORD_HOWE,
            "0 * * * *",
            timedelta(hours=1),
            # Both transitions lengthen a gap to 90 minutes; none is shorter than an hour.
            id="Lord Howe, 0 * * * *: the half-hour shifts make no gap shorter than an hour",
        ),
    ],
)
def test_min_interval_sees_the_transitions(zone: str, cron: str, expected: timedelta) -> None:
    assert Schedule(cron, timezone=zone).min_interval() == expected


def test_jitter_shifts_the_dst_substitute_like_any_other_fire_time() -> None:
    plain = Schedule("30 2 * * *", timezone=NY)
    jittered = Schedule("30 2 * * *", timezone=NY, jitter=timedelta(minutes=10), key="a.job")
    base = plain.fire_times(z("2026-03-07 00:00"), z("2026-03-10 00:00"))
    assert jittered.fire_times(z("2026-03-07 00:00"), z("2026-03-10 00:00")) == [
        t + jittered.offset for t in base
    ]
