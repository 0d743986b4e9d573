"""croniter as a second oracle: every disagreement with Schedule named and checked.

croniter is a test dependency only: the package never imports it. Many Python
projects schedule with it, so this file measures how its fire times differ from
Schedule's for the expressions both accept (standard 5-field expressions, and
the L, W and # terms croniter reads), in the same zones, DST zones included,
over a bounded horizon. docs/schedules.md ("Coming from croniter") teaches
what it finds.

The check is exact, not a tolerance. A small model in this file turns an
expression into fire times by cron's rules (Debian cron's reading and DST rule,
as docs/schedules.md states them), and each category below is one rule of
croniter's that can be switched on in the model. Every example asserts both:

- Schedule's fire times are the model with no category;
- croniter's fire times are the model with every category.

So croniter differs from Schedule only where a category says, and exactly as it
says; a disagreement no category explains fails the test, and so does a
category that stops describing croniter. Each category is also pinned by a
plain example (``PINNED``) with its expression, zone and instants, and each
rewrite docs/schedules.md suggests for keeping croniter's reading (``PORTED``)
is checked to run at croniter's instants.

Not compared: what either refuses. croniter refuses LW, dL (it reads Ld),
nW in a list, and plain weekdays beside # other than the #-days themselves or
the whole week; it raises CroniterBadDateError where its reading of # with a
day of month finds no date (``0 0 15 * 1#2``). Schedule refuses Ld, ?, H and
an expression that never fires (croniter's nW fires in any month: 30W in
February is the weekday nearest the 28th).

Bounded so the file runs in seconds: each property test has at most 100
examples and compares at most a few hundred fire times. For a deeper run set
SCHEDULE_PROPERTY_EXAMPLES, e.g. to 2000.
"""

from __future__ import annotations

import calendar
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import partial
from importlib.metadata import version
from zoneinfo import ZoneInfo

import pytest
from croniter import CroniterError, croniter
from hypothesis import assume, example, given
from hypothesis import strategies as st

from django_fencedjobs.exceptions import ScheduleError
from django_fencedjobs.schedule import Schedule
from tests.test_schedule_properties import (
    CRON,
    DOW_NAMES,
    MONTH_NAMES,
    PROPERTY_SETTINGS,
    WEEKDAY,
    ZONES,
    field,
    transitions,
    zone_and_start,
)

# The categories are croniter 7's; an earlier croniter reads some expressions otherwise.
pytestmark = pytest.mark.skipif(
    int(version("croniter").split(".")[0]) < 7,
    reason="the categories below were measured with croniter 7",
)

# --------------------------------------------------------------------------- the categories
# Reading: which wall times match.

# croniter intersects the two day fields only when one of them holds a * term, or covers
# every day while the other field's text contains a *; cron intersects when either field
# starts with *. "0 0 */2 * 1": croniter every odd date and every Monday, cron Mondays on
# odd dates. "0 0 1,* * 1": croniter Mondays, cron every day.
DAY_FIELDS_JOINED = "day_fields_joined"
# croniter reads a range with equal ends, 5-5 or 5-5/2, as the whole field (*, */2).
EQUAL_RANGE = "equal_range"
# croniter ends a/n in the day of week at Saturday, and reads 7/n as */n; cron ends it at
# 7, Sunday. 1/2: croniter Mon, Wed, Fri; cron Mon, Wed, Fri, Sun.
WEEKDAY_START_STEP = "weekday_start_step"
# Beside a d#n term croniter drops the plain weekdays of the field: "MON,MON#1" is the
# first Monday only, "0-6,1#2" the second Monday only.
HASH_DROPS_WEEKDAYS = "hash_drops_weekdays"
# With a d#n or nW term croniter does not add the other day field's dates: "0 0 13 * 5#2"
# is the second Friday only (cron: the 13th and the second Friday), "0 0 15W * 1" the
# weekday nearest the 15th only (cron: that day and every Monday).
SPECIAL_TERM_JOINS = "special_term_joins"
# In a month without day n, croniter's nW is the weekday nearest the month's last day;
# cron's has no date. "0 0 31W * *": croniter runs on Thursday 30 April 2026.
NEAREST_WEEKDAY_CLAMPED = "nearest_weekday_clamped"
# croniter counts L as one of 31 values: beside a * in the day of week, L,2-31 is "*",
# every day, the 1st too.
LAST_DAY_FILLS_MONTH = "last_day_fills_month"

# DST: which instants a matching wall time gives.

# When the spring-forward gap skips a matching wall time and the hour field is not every
# hour, croniter runs at the end of the gap, also for an expression that is not fixed
# time (its minute or hour starts with *), where cron invents nothing. "0 */2 * * *" in
# New York on 8 March 2026: croniter 03:00 EDT.
GAP_SUBSTITUTE = "gap_substitute"
# With every hour in the hour field, croniter skips a skipped wall time, even for an
# expression that is fixed time for cron, which runs it at the end of the gap.
# "30 0-23 * * *" in New York on 8 March 2026: cron 03:00 EDT, croniter nothing.
GAP_SKIPPED_EVERY_HOUR = "gap_skipped_every_hour"
# croniter runs a fixed-time expression at both occurrences of a repeated wall time; cron
# at the first only. "30 1 * * *" in New York on 1 November 2026: 01:30 EDT and EST.
REPEATED_HOUR_TWICE = "repeated_hour_twice"
# croniter finds the second pass of a repeated interval with one search, from its last
# wall time before the fall-back minus the shift. When that search meets a match before
# the interval starts (a shift shorter than an hour, as Lord Howe's 30 minutes), it goes
# on past the whole second pass. "*/4 * * * *" on Lord Howe on 5 April 2026: croniter
# skips 01:32 ... 01:56 +10:30.
SECOND_PASS_SKIPPED = "second_pass_skipped"

CATEGORIES = frozenset(
    {
        DAY_FIELDS_JOINED,
        EQUAL_RANGE,
        WEEKDAY_START_STEP,
        HASH_DROPS_WEEKDAYS,
        SPECIAL_TERM_JOINS,
        NEAREST_WEEKDAY_CLAMPED,
        LAST_DAY_FILLS_MONTH,
        GAP_SUBSTITUTE,
        GAP_SKIPPED_EVERY_HOUR,
        REPEATED_HOUR_TWICE,
        SECOND_PASS_SKIPPED,
    }
)
NO_CATEGORY: frozenset[str] = frozenset()
COMPARED = 400
HORIZON = timedelta(days=366)

# --------------------------------------------------------------------------- the model: reading

MINUTE, HOUR, DOM, MONTH, DOW = range(5)
BOUNDS = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]
NAMES = {
    MONTH: {name.lower(): n for n, name in enumerate(MONTH_NAMES, start=1)},
    DOW: {name.lower(): n for n, name in enumerate(DOW_NAMES)},
}
DayTest = Callable[[date], bool]


def number(token: str, index: int) -> int:
    names = NAMES.get(index, {})
    return names[token] if token in names else int(token)


def plain_term(term: str, index: int, rules: frozenset[str]) -> set[int]:
    """The values of one term without L, W or # (weekdays 0-6, Sunday 0)."""
    low, high = BOUNDS[index]
    base, _, step_text = term.partition("/")
    step = int(step_text) if step_text else 1
    if base == "*":
        values = set(range(low, high + 1, step))
    elif "-" in base:
        first, last = (number(part, index) for part in base.split("-"))
        same = first == last or (index == DOW and first % 7 == last % 7)
        if EQUAL_RANGE in rules and same:
            first, last = low, high
        values = set(range(first, last + 1, step))
    elif step_text:
        first = number(base, index)
        if WEEKDAY_START_STEP in rules and index == DOW:
            first, high = first % 7, 6
        values = set(range(first, high + 1, step))
    else:
        values = {number(base, index)}
    return {v % 7 for v in values} if index == DOW else values


def weekday_of(day: date) -> int:
    return (day.weekday() + 1) % 7


def month_length(day: date) -> int:
    return calendar.monthrange(day.year, day.month)[1]


def is_last_day(day: date) -> bool:
    return day.day == month_length(day)


def is_last_weekday(day: date) -> bool:
    return day.weekday() < 5 and all(
        (day + timedelta(days=n)).weekday() >= 5 for n in range(1, month_length(day) - day.day + 1)
    )


def is_nearest_weekday(day: date, n: int, clamped: bool) -> bool:
    """Whether ``day`` is the Monday-to-Friday date of its month nearest day ``n``."""
    length = month_length(day)
    if n > length:
        if not clamped:
            return False
        n = length
    target = day.replace(day=n)
    if target.weekday() == 5:
        target += timedelta(days=-1 if n > 1 else 2)
    elif target.weekday() == 6:
        target += timedelta(days=1 if n < length else -2)
    return day == target


def is_nth_weekday(day: date, weekday: int, nth: int) -> bool:
    return weekday_of(day) == weekday and (day.day - 1) // 7 + 1 == nth


def is_last_of_weekday(day: date, weekday: int) -> bool:
    return weekday_of(day) == weekday and day.day + 7 > month_length(day)


@dataclass(frozen=True)
class DayField:
    """One day field read: its plain values and its special terms."""

    values: frozenset[int]  # days of the month, or weekdays 0-6 (Sunday 0)
    special: tuple[DayTest, ...]  # L, LW, nW; or d#n, dL
    weekday: bool

    def matches(self, day: date) -> bool:
        key = weekday_of(day) if self.weekday else day.day
        return key in self.values or any(test(day) for test in self.special)


def read_dom(text: str, rules: frozenset[str]) -> DayField:
    values: set[int] = set()
    special: list[DayTest] = []
    for term in text.split(","):
        if term == "l":
            special.append(is_last_day)
        elif term == "lw":
            special.append(is_last_weekday)
        elif term.endswith("w"):
            clamped = NEAREST_WEEKDAY_CLAMPED in rules
            special.append(partial(is_nearest_weekday, n=int(term[:-1]), clamped=clamped))
        else:
            values |= plain_term(term, DOM, rules)
    return DayField(frozenset(values), tuple(special), weekday=False)


def read_dow(text: str, rules: frozenset[str]) -> DayField:
    values: set[int] = set()
    special: list[DayTest] = []
    for term in text.split(","):
        if "#" in term:
            weekday, nth = term.split("#")
            special.append(partial(is_nth_weekday, weekday=number(weekday, DOW) % 7, nth=int(nth)))
        elif term.endswith("l"):
            special.append(partial(is_last_of_weekday, weekday=number(term[:-1], DOW) % 7))
        else:
            values |= plain_term(term, DOW, rules)
    if special and HASH_DROPS_WEEKDAYS in rules:
        values = set()
    return DayField(frozenset(values), tuple(special), weekday=True)


def croniter_weekday_values(text: str, rules: frozenset[str]) -> set[int]:
    """croniter's expanded day-of-week values: the plain terms and the #-days."""
    values: set[int] = set()
    for term in text.split(","):
        if "#" in term:
            values.add(number(term.split("#")[0], DOW) % 7)
        else:
            values |= plain_term(term, DOW, rules)
    return values


def day_test(dom_text: str, dow_text: str, rules: frozenset[str]) -> DayTest:
    """Whether a date matches the two day fields."""
    dom, dow = read_dom(dom_text, rules), read_dow(dow_text, rules)
    dom_terms, dow_terms = dom_text.split(","), dow_text.split(",")
    # croniter turns a day-of-month list of 31 values into "*" when the day-of-week text
    # holds a *, and counts L as one of them.
    dom_all = len(dom.values) + ("l" in dom_terms) == 31 and "*" in dow_text
    if LAST_DAY_FILLS_MONTH in rules and dom_all and "l" in dom_terms:
        dom = DayField(frozenset(range(1, 32)), (), weekday=False)
    if DAY_FIELDS_JOINED in rules:
        dow_all = len(croniter_weekday_values(dow_text, rules)) == 7 and "*" in dom_text
        intersect = "*" in dom_terms or dom_all or "*" in dow_terms or dow_all
    else:
        intersect = dom_text.startswith("*") or dow_text.startswith("*")
    if intersect:
        return lambda d: dom.matches(d) and dow.matches(d)
    nearest = any(term.endswith("w") and term != "lw" for term in dom_terms)
    if SPECIAL_TERM_JOINS in rules and (nearest or dow.special):
        # croniter joins "this day of month, any weekday" and "any day, this day of week",
        # but keeps its nW and d#n terms on both sides: each side stays an intersection.
        def day_side(d: date) -> bool:
            return dom.matches(d) and (not dow.special or any(t(d) for t in dow.special))

        def week_side(d: date) -> bool:
            return (not nearest or dom.matches(d)) and dow.matches(d)

        return lambda d: day_side(d) or week_side(d)
    return lambda d: dom.matches(d) or dow.matches(d)


@dataclass(frozen=True)
class Reading:
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    months: frozenset[int]
    day: DayTest
    fixed: bool  # cron's fixed time: neither the minute nor the hour starts with *
    every_hour: bool

    def matches(self, wall: datetime) -> bool:
        return (
            wall.month in self.months
            and self.day(wall.date())
            and wall.hour in self.hours
            and wall.minute in self.minutes
        )


def read(expr: str, rules: frozenset[str]) -> Reading:
    minute, hour, dom, month, dow = expr.lower().split()

    def values(text: str, index: int) -> set[int]:
        return set().union(*(plain_term(term, index, rules) for term in text.split(",")))

    hours = values(hour, HOUR)
    return Reading(
        minutes=tuple(sorted(values(minute, MINUTE))),
        hours=tuple(sorted(hours)),
        months=frozenset(values(month, MONTH)),
        day=day_test(dom, dow, rules),
        fixed=not minute.startswith("*") and not hour.startswith("*"),
        every_hour=len(hours) == 24,
    )


# --------------------------------------------------------------------------- the model: DST


def exists(wall: datetime, tz: ZoneInfo) -> bool:
    return wall.replace(tzinfo=tz).astimezone(UTC).astimezone(tz).replace(tzinfo=None) == wall


def gap_end(wall: datetime, tz: ZoneInfo) -> datetime:
    """The first instant after the gap that skips ``wall``."""
    while not exists(wall, tz):
        wall += timedelta(minutes=1)
    return wall.replace(tzinfo=tz).astimezone(UTC)


def instants(
    wall: datetime, reading: Reading, tz: ZoneInfo, rules: frozenset[str]
) -> list[datetime]:
    """The instants one matching wall time gives."""
    if not exists(wall, tz):
        substitute = reading.fixed
        if GAP_SUBSTITUTE in rules and not reading.fixed and not reading.every_hour:
            substitute = True
        if GAP_SKIPPED_EVERY_HOUR in rules and reading.fixed and reading.every_hour:
            substitute = False
        return [gap_end(wall, tz)] if substitute else []
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    if second == first or (reading.fixed and REPEATED_HOUR_TWICE not in rules):
        return [first]
    return [first, second]


def fall_backs(zone: str, start: datetime, end: datetime) -> Iterator[tuple[datetime, timedelta]]:
    """Each instant in (start, end] where the zone's clock goes back, with the shift."""
    tz = ZoneInfo(zone)
    for instant in transitions(zone):
        before = (instant - timedelta(seconds=1)).astimezone(tz).utcoffset()
        after = instant.astimezone(tz).utcoffset()
        assert before is not None and after is not None
        if start < instant <= end and after < before:
            yield instant, before - after


def skips_second_pass(
    last: datetime, back: datetime, shift: timedelta, reading: Reading, tz: ZoneInfo
) -> bool:
    """Whether croniter's search for the second pass, from its last instant before the
    fall-back, meets a match before the repeated interval (SECOND_PASS_SKIPPED)."""
    repeated_from = back.astimezone(tz).replace(tzinfo=None)
    wall = last.astimezone(tz).replace(tzinfo=None) - shift + timedelta(minutes=1)
    probe = wall.replace(second=0, microsecond=0)
    while probe < repeated_from:
        if reading.matches(probe):
            return True
        probe += timedelta(minutes=1)
    return False


def model_fires(
    expr: str, zone: str, start: datetime, end: datetime, rules: frozenset[str]
) -> list[datetime]:
    """Fire times in (start, end] by cron's rules plus ``rules``, at most COMPARED.

    Local dates partition time and a gap's substitute stays on its date, so walking
    the dates in order walks the instants in order."""
    reading = read(expr, rules)
    tz = ZoneInfo(zone)
    found: set[datetime] = set()
    day = start.astimezone(tz).date()
    # A second pass dropped below is at most an hour of minutes: walk past them.
    while day <= end.astimezone(tz).date() and len(found) < COMPARED + 60:
        if day.month in reading.months and reading.day(day):
            for hour in reading.hours:
                for minute in reading.minutes:
                    wall = datetime.combine(day, time(hour, minute))
                    found.update(t for t in instants(wall, reading, tz, rules) if start < t <= end)
        day += timedelta(days=1)
    if SECOND_PASS_SKIPPED in rules:
        for back, shift in fall_backs(zone, start, end):
            last = max((t for t in found if t < back), default=start)
            if skips_second_pass(last, back, shift, reading, tz):
                found -= {t for t in found if back <= t < back + shift}
    return sorted(found)[:COMPARED]


# --------------------------------------------------------------------------- the oracles


def croniter_fires(expr: str, zone: str, start: datetime, end: datetime) -> list[datetime]:
    """croniter's fire times in (start, end], as UTC instants, at most COMPARED."""
    result: list[datetime] = []
    iterator = croniter(expr, start.astimezone(ZoneInfo(zone)))
    while len(result) < COMPARED:
        instant = iterator.get_next(datetime).astimezone(UTC)
        if instant > end:
            break
        result.append(instant)
    return result


def croniter_accepts(expr: str, zone: str) -> bool:
    try:
        croniter(expr, datetime(2025, 1, 1, tzinfo=ZoneInfo(zone))).get_next(datetime)
    except CroniterError:
        return False
    return True


def schedule_or_none(expr: str, zone: str) -> Schedule | None:
    try:
        return Schedule(expr, timezone=zone)
    except ScheduleError:
        return None


def complete_prefix(*lists: list[datetime], end: datetime) -> Iterator[list[datetime]]:
    """Each list up to where every list is complete (one that hit COMPARED stops early)."""
    cutoff = min([end, *(fires[-1] for fires in lists if len(fires) == COMPARED)])
    return ([t for t in fires if t <= cutoff] for fires in lists)


def categories_involved(expr: str, zone: str, start: datetime, end: datetime) -> set[str]:
    """The categories that change the model on this window: each one that, alone, moves
    cron's model, or, taken out, moves croniter's (two can explain one difference)."""
    cron = model_fires(expr, zone, start, end, NO_CATEGORY)
    every = model_fires(expr, zone, start, end, CATEGORIES)
    return {
        category
        for category in CATEGORIES
        if model_fires(expr, zone, start, end, frozenset({category})) != cron
        or model_fires(expr, zone, start, end, CATEGORIES - {category}) != every
    }


def assert_classified(expr: str, zone: str, start: datetime, horizon: timedelta = HORIZON) -> None:
    """Schedule's fire times are cron's model, croniter's are cron's model with every
    category: so they differ only where a category says, and exactly as it says."""
    schedule = schedule_or_none(expr, zone)
    assume(schedule is not None and croniter_accepts(expr, zone))
    assert schedule is not None
    end = start + horizon
    ours, theirs, cron_model, croniter_model = complete_prefix(
        schedule.fire_times(start, end, limit=COMPARED),
        croniter_fires(expr, zone, start, end),
        model_fires(expr, zone, start, end, NO_CATEGORY),
        model_fires(expr, zone, start, end, CATEGORIES),
        end=end,
    )
    assert ours == cron_model, ("Schedule is not cron's model", expr, zone, start)
    unexplained = sorted(set(theirs) ^ set(croniter_model))
    assert theirs == croniter_model, (
        "unclassified croniter disagreement",
        expr,
        zone,
        start,
        unexplained,
    )


# --------------------------------------------------------------------------- strategies


def equal_range(low: int, high: int) -> st.SearchStrategy[str]:
    """``a-a`` and ``a-a/n``."""
    return st.tuples(st.integers(low, high), st.sampled_from(["", "/2", "/3", "/5"])).map(
        lambda t: f"{t[0]}-{t[0]}{t[1]}"
    )


def with_croniter_terms(low: int, high: int, *more: str) -> st.SearchStrategy[str]:
    """Terms the property file's strategies leave out: equal ranges and * in a list."""
    return st.one_of(equal_range(low, high), st.sampled_from(["*", *more]))


NTH = st.tuples(WEEKDAY, st.integers(1, 5)).map(lambda t: f"{t[0]}#{t[1]}")


@st.composite
def hash_weekdays(draw: st.DrawFn) -> str:
    """A day-of-week field with # terms that croniter accepts: beside them nothing, their
    own weekday, the whole week or a * term."""
    terms = draw(st.lists(NTH, min_size=1, max_size=2))
    beside = draw(st.sampled_from(["", "*", "0-6", terms[0].split("#")[0]]))
    return ",".join([*terms, beside] if beside else terms)


CRONITER_CRON = st.tuples(
    field(0, 59, extra=with_croniter_terms(0, 59)),
    field(0, 23, extra=with_croniter_terms(0, 23)),
    st.one_of(
        field(1, 31, extra=with_croniter_terms(1, 31, "L", "l")),
        st.integers(1, 31).map(lambda n: f"{n}W"),  # croniter takes nW alone only
    ),
    field(1, 12, MONTH_NAMES, name_base=1, extra=with_croniter_terms(1, 12)),
    st.one_of(field(0, 7, DOW_NAMES, extra=with_croniter_terms(0, 7)), hash_weekdays()),
).map(" ".join)


@st.composite
def near_a_transition(draw: st.DrawFn) -> tuple[str, datetime]:
    """A DST zone and a start at most 12 hours before one of its transitions."""
    zone = draw(st.sampled_from([zone for zone in ZONES if zone != "UTC"]))
    anchor = draw(st.sampled_from([t for t in transitions(zone) if t.year < 2030]))
    before = timedelta(
        minutes=draw(st.integers(0, 12 * 60)), seconds=draw(st.sampled_from([0, 30]))
    )
    return zone, anchor - before


# Every day, so that each example meets its transition; "0-23" and "0/1" are every hour
# and fixed time.
WALL_CLOCK = st.tuples(field(0, 59), st.one_of(field(0, 23), st.sampled_from(["0-23", "0/1"]))).map(
    lambda t: f"{t[0]} {t[1]} * * *"
)


# --------------------------------------------------------------------------- the oracle


@PROPERTY_SETTINGS
@given(expr=CRON, zone_start=zone_and_start())
@example(
    expr="*/4 * * * *", zone_start=("Australia/Lord_Howe", datetime(2026, 4, 4, 14, 50, tzinfo=UTC))
)
@example(expr="30 1 * * *", zone_start=("America/New_York", datetime(2026, 10, 31, tzinfo=UTC)))
@example(expr="0 */2 * * *", zone_start=("America/Santiago", datetime(2026, 9, 5, tzinfo=UTC)))
def test_croniter_differs_from_schedule_only_by_named_categories(
    expr: str, zone_start: tuple[str, datetime]
) -> None:
    zone, start = zone_start
    assert_classified(expr, zone, start)


@PROPERTY_SETTINGS
@given(expr=CRONITER_CRON, zone_start=zone_and_start())
@example(expr="0 0 */2 * 1", zone_start=("UTC", datetime(2026, 1, 1, tzinfo=UTC)))
@example(expr="0 0 L,2-31 * *", zone_start=("UTC", datetime(2025, 12, 31, tzinfo=UTC)))
@example(expr="30 0-23 * * *", zone_start=("America/New_York", datetime(2026, 3, 7, tzinfo=UTC)))
def test_croniter_readings_differ_only_by_named_categories(
    expr: str, zone_start: tuple[str, datetime]
) -> None:
    zone, start = zone_start
    assert_classified(expr, zone, start)


@PROPERTY_SETTINGS
@given(expr=WALL_CLOCK, zone_start=near_a_transition())
def test_croniter_differs_around_dst_transitions_only_by_named_categories(
    expr: str, zone_start: tuple[str, datetime]
) -> None:
    zone, start = zone_start
    assert_classified(expr, zone, start, horizon=timedelta(days=2))


# --------------------------------------------------------------------------- each category, pinned


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


@dataclass(frozen=True)
class Pinned:
    """One category seen on one expression: the instants in (start, end] that only
    croniter fires and those that only Schedule fires."""

    category: str
    expr: str
    zone: str
    start: datetime
    end: datetime
    croniter_only: list[datetime]
    schedule_only: list[datetime]


NEW_YORK, LORD_HOWE = "America/New_York", "Australia/Lord_Howe"
PINNED = [
    # Saturday 3 January 2026 is odd, not a Monday; Monday the 5th is odd: both run it.
    Pinned(DAY_FIELDS_JOINED, "0 0 */2 * 1", "UTC", utc(2026, 1, 1), utc(2026, 1, 6),
           croniter_only=[utc(2026, 1, 3)], schedule_only=[]),
    # A * term makes the field "*" for croniter: Mondays only. For cron the list does not
    # start with *, so the fields join: the 1st or any Monday, i.e. every day.
    Pinned(DAY_FIELDS_JOINED, "0 0 1,* * 1", "UTC", utc(2026, 1, 4), utc(2026, 1, 8),
           croniter_only=[], schedule_only=[utc(2026, 1, 6), utc(2026, 1, 7), utc(2026, 1, 8)]),
    Pinned(EQUAL_RANGE, "5-5/2 * * * *", "UTC", utc(2026, 1, 1, 10), utc(2026, 1, 1, 10, 6),
           croniter_only=[utc(2026, 1, 1, 10, m) for m in (2, 4, 6)],
           schedule_only=[utc(2026, 1, 1, 10, 5)]),
    # Sunday 4 January 2026: 1/2 is Mon, Wed, Fri, Sun for cron.
    Pinned(WEEKDAY_START_STEP, "0 0 * * 1/2", "UTC", utc(2026, 1, 3), utc(2026, 1, 5),
           croniter_only=[], schedule_only=[utc(2026, 1, 4)]),
    # Every Monday and the first Monday: croniter keeps the first Monday only.
    Pinned(HASH_DROPS_WEEKDAYS, "0 9 * * MON,MON#1", "UTC", utc(2026, 1, 1), utc(2026, 1, 13),
           croniter_only=[], schedule_only=[utc(2026, 1, 12, 9)]),
    # The 13th or the second Friday: croniter the second Friday only (9 January 2026).
    Pinned(SPECIAL_TERM_JOINS, "0 0 13 * 5#2", "UTC", utc(2026, 1, 1), utc(2026, 2, 1),
           croniter_only=[], schedule_only=[utc(2026, 1, 13)]),
    # The weekday nearest the 15th (Thursday 15 January) or any Monday.
    Pinned(SPECIAL_TERM_JOINS, "0 0 15W * 1", "UTC", utc(2026, 1, 1), utc(2026, 1, 20),
           croniter_only=[], schedule_only=[utc(2026, 1, d) for d in (5, 12, 19)]),
    # April has no 31st; croniter takes the weekday nearest the 30th (a Thursday).
    Pinned(NEAREST_WEEKDAY_CLAMPED, "0 0 31W * *", "UTC", utc(2026, 4, 1), utc(2026, 5, 1),
           croniter_only=[utc(2026, 4, 30)], schedule_only=[]),
    # 02:00 EST never happens on 8 March 2026; croniter runs at 03:00 EDT (07:00Z).
    Pinned(GAP_SUBSTITUTE, "0 */2 * * *", NEW_YORK, utc(2026, 3, 8, 4), utc(2026, 3, 8, 10),
           croniter_only=[utc(2026, 3, 8, 7)], schedule_only=[]),
    # 02:30 never happens; cron runs it at the end of the gap, 03:00 EDT (07:00Z).
    Pinned(GAP_SKIPPED_EVERY_HOUR, "30 0-23 * * *", NEW_YORK, utc(2026, 3, 8, 4),
           utc(2026, 3, 8, 8), croniter_only=[], schedule_only=[utc(2026, 3, 8, 7)]),
    # 01:30 happens twice on 1 November 2026: EDT (05:30Z), then EST (06:30Z).
    Pinned(REPEATED_HOUR_TWICE, "30 1 * * *", NEW_YORK, utc(2026, 11, 1, 5), utc(2026, 11, 1, 7),
           croniter_only=[utc(2026, 11, 1, 6, 30)], schedule_only=[]),
    # Lord Howe goes back from 02:00 +11 to 01:30 +10:30 at 15:00Z on 4 April 2026. After
    # 01:56 +11 croniter looks again from 01:26, meets 01:28 (not after its last run), and
    # goes on at 02:00 +10:30: 01:32 ... 01:56 +10:30 never run.
    Pinned(SECOND_PASS_SKIPPED, "*/4 * * * *", LORD_HOWE, utc(2026, 4, 4, 14, 50),
           utc(2026, 4, 4, 15, 30), croniter_only=[],
           schedule_only=[utc(2026, 4, 4, 15, m) for m in range(2, 30, 4)]),
    # L and 2-31 are 31 values: every day for croniter, the 1st too.
    Pinned(LAST_DAY_FILLS_MONTH, "0 0 L,2-31 * *", "UTC", utc(2025, 12, 31, 12),
           utc(2026, 1, 2, 12), croniter_only=[utc(2026, 1, 1)], schedule_only=[]),
]  # fmt: skip


@pytest.mark.parametrize("pinned", PINNED, ids=lambda p: f"{p.category}: {p.expr}")
def test_category_pinned_by_example(pinned: Pinned) -> None:
    schedule = Schedule(pinned.expr, timezone=pinned.zone)
    ours = set(schedule.fire_times(pinned.start, pinned.end))
    theirs = set(croniter_fires(pinned.expr, pinned.zone, pinned.start, pinned.end))
    assert sorted(theirs - ours) == pinned.croniter_only
    assert sorted(ours - theirs) == pinned.schedule_only
    # The model explains it by this category alone.
    assert categories_involved(pinned.expr, pinned.zone, pinned.start, pinned.end) == {
        pinned.category
    }


def test_every_category_is_pinned() -> None:
    assert {pinned.category for pinned in PINNED} == CATEGORIES


# docs/schedules.md, "Expressions that read differently": croniter's expression and the
# one that reads the same here.
PORTED = [
    ("0 0 */2 * 1", "0 0 1-31/2 * 1"),
    ("0 0 1,* * 1", "0 0 * * 1"),
    ("5-5/2 * * * *", "*/2 * * * *"),
    ("0 0 * * 1/2", "0 0 * * 1-5/2"),
    ("0 9 * * MON,MON#1", "0 9 * * MON#1"),
    ("0 0 13 * 5#2", "0 0 * * 5#2"),
    ("0 0 15W * 1", "0 0 15W * *"),
    ("0 0 31W * *", "0 0 LW * *"),
    ("0 0 L,2-31 * *", "0 0 * * *"),
]


@pytest.mark.parametrize(("theirs", "ours"), PORTED)
def test_the_documented_port_of_a_croniter_expression_runs_at_croniters_instants(
    theirs: str, ours: str
) -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    end = start + HORIZON
    for zone in ("UTC", "Europe/London"):
        schedule = Schedule(ours, timezone=zone)
        assert schedule.fire_times(start, end, limit=COMPARED) == croniter_fires(
            theirs, zone, start, end
        ), (theirs, ours, zone)
        assert Schedule(theirs, timezone=zone).fire_times(start, end, limit=COMPARED) != (
            croniter_fires(theirs, zone, start, end)
        ), (theirs, zone)
