"""When a job fires: a cron expression in a named zone, or a fixed interval.

A :class:`Schedule` turns a description such as ``"30 2 * * *"`` in
``"America/New_York"`` into the exact instants (aware datetimes in UTC) at which
a job is due. Everything that stores or compares times in this package works
with those UTC instants; the zone only matters here, when wall-clock fields are
turned into instants.

Two kinds of schedule exist, one internal class each behind ``Schedule``:

``cron`` (:class:`_CronRule`)
    A standard 5-field expression (minute, hour, day of month, month, day of
    week), evaluated on the wall clock of ``timezone``. The aliases
    ``@hourly``, ``@daily``/``@midnight``, ``@weekly``, ``@monthly`` and
    ``@yearly``/``@annually`` are accepted, and so are the calendar terms of
    Quartz and cronsim: ``L`` (the last day of the month), ``LW`` (its last
    weekday) and ``15W`` (the weekday nearest the 15th) in the day-of-month
    field; ``5L`` (the last Friday) and ``1#2`` (the second Monday) in the
    day-of-week field.

``every`` (:class:`_IntervalRule`)
    A fixed interval: the job fires at whole multiples of the interval since
    the Unix epoch (1970-01-01 00:00 UTC). Because the grid is anchored to the
    epoch and not to "when the process started", every host computes the same
    instants.

Daylight saving time
--------------------
Wall clocks jump. When the clock springs forward some wall times never happen;
when it falls back some happen twice. This module follows the rule of
ISC/Vixie cron as Debian ships it (the same rule the ``cronsim`` library
implements), decided per expression:

* A **fixed-time** expression is one whose minute field *and* hour field do
  not start with ``*`` (``30 2 * * *``, ``0 9 * * 1-5``, ``15 1-23/2 * * *``).
  It is evaluated on the wall clock alone. A wall time that falls in the
  spring-forward gap fires once, at the first instant after the gap; a wall
  time that happens twice fires once, at its first occurrence.
* Any other expression (``*/15 * * * *``, ``0 * * * *``, ``0 */2 * * *``)
  fires at every real instant whose wall time matches: nothing is invented in
  the gap, and both occurrences of a repeated wall time fire, because they are
  different instants.

The day fields (``L``, ``W`` and ``#`` included) only choose dates, so the rule
is the same whatever they say.

The matching is this module's own. croniter is not used: croniter 7 fires
fixed-time schedules twice in the repeated hour, computes on the wrong wall
clock when started from a naive or UTC datetime, reads some fields unlike
Debian cron (see :func:`_parse_term` and :class:`_CronFields`) and refuses
``LW`` and ``5L``. The tests compare every fire time with cronsim's.

Jitter
------
``jitter`` spreads jobs that share a schedule. Each schedule gets one stable
offset in ``[0, jitter)``, in whole seconds, derived from a BLAKE2b hash of
``key`` (the job's name when ``@job`` builds the schedule). Every fire time is
the unjittered time plus that offset, on every host and in every Python run
(Python's own ``hash()`` is salted per process and is never used).
"""

from __future__ import annotations

import bisect
import calendar
import functools
import hashlib
import itertools
import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django_fencedjobs.exceptions import ScheduleError
from django_fencedjobs.instants import is_utc

__all__ = ["SEARCH_HORIZON_YEARS", "Schedule"]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: How far ahead a search for the next matching date goes before it gives up.
#: Forty years is the longest gap any expression can have: the fifth Monday of
#: February (``0 0 * 2 1#5``) is 29 February on a Monday, which happens in 2072
#: and then not until 2112, 2100 not being a leap year. An expression that
#: matches no date in that span (``0 0 30 2 *``) is refused when the Schedule
#: is created, so no search can loop forever.
SEARCH_HORIZON_YEARS = 40
_SEARCH_HORIZON = timedelta(days=366 * SEARCH_HORIZON_YEARS)

#: min_interval() samples fire times from here (in the schedule's zone).
_REFERENCE_DATE = date(2025, 1, 1)
#: ... for one year, or this many fire times, whichever comes first; plus a
#: window around each UTC-offset change in that year.
_MIN_INTERVAL_MAX_FIRES = 3000

_ONE_US = timedelta(microseconds=1)
_ONE_MINUTE = timedelta(minutes=1)
_ONE_DAY = timedelta(days=1)
_US_PER_SECOND = 1_000_000

_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_MONTH_NAMES = {
    name: number
    for number, name in enumerate(
        "JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split(), start=1
    )
}
_DOW_NAMES = {name: number for number, name in enumerate("SUN MON TUE WED THU FRI SAT".split())}

# Weekdays are numbered as cron numbers them: 0 = Sunday ... 6 = Saturday.
_SUNDAY, _SATURDAY = 0, 6


@dataclass(frozen=True)
class _FieldSpec:
    name: str
    low: int
    high: int
    names: dict[str, int]


_MINUTE = _FieldSpec("minute", 0, 59, {})
_HOUR = _FieldSpec("hour", 0, 23, {})
_DOM = _FieldSpec("day-of-month", 1, 31, {})
_MONTH = _FieldSpec("month", 1, 12, _MONTH_NAMES)
# Day of week: 0 and 7 are both Sunday, as in every cron.
_DOW = _FieldSpec("day-of-week", 0, 7, _DOW_NAMES)

_FIELD_HELP = (
    "each field is *, a number, a range a-b, a step */n, a-b/n or a/n, "
    "or a comma-separated list of these"
)
_DOM_TERMS = (
    "in the day-of-month field L is the last day of the month, LW its last weekday and "
    "nW the weekday nearest day n in the same month (15W)"
)
_DOW_TERMS = (
    "in the day-of-week field dL is the last weekday d of the month (5L: the last Friday) "
    "and d#n the n-th one (1#2 or MON#2: the second Monday)"
)
# Where each calendar character is allowed, said when it is used anywhere else.
_ONLY_IN = {
    "L": "L (last) is allowed only in the day-of-month field (L, LW) and the day-of-week "
    "field (5L: the last Friday of the month)",
    "W": "W (nearest weekday) is allowed only in the day-of-month field (15W: the weekday "
    "nearest the 15th; LW: the last weekday of the month)",
    "#": "# (nth weekday) is allowed only in the day-of-week field (1#2: the second Monday "
    "of the month)",
}
# Extensions of other crons that no field takes.
_UNSUPPORTED = (("?", "?"), ("H", "H (hashed)"))

# Zone names that are fixed UTC offsets. They resolve (some of them even in
# zoneinfo: "Etc/GMT+5", "EST") but never follow daylight saving time, so a job
# declared in one drifts by an hour against local time twice a year. Note the
# POSIX sign: "Etc/GMT+5" is UTC-5.
_FIXED_OFFSET_RE = re.compile(
    r"""^\s*(?:
        [+-]\s*\d                                   # +02:00, -0500, +2
        | \d{1,2}(?::?\d{2})?                       # 0200, 02:00
        | (?:Etc/)?(?:UTC|GMT|UT|UCT|Z|Zulu)\s*[+-]  # UTC+2, GMT-5, Etc/GMT+5
    )""",
    re.IGNORECASE | re.VERBOSE,
)
# Fixed-offset abbreviations that tzdata still ships as zone names.
_FIXED_OFFSET_NAMES = frozenset({"EST", "MST", "HST"})


# --------------------------------------------------------------------------- parsing


def _cron_error(expr: str, spec: _FieldSpec, field_text: str, problem: str) -> ScheduleError:
    return ScheduleError(
        f"cron {expr!r}: {spec.name} field {field_text!r}: {problem}", argument="cron"
    )


def _which(term: str, field_text: str) -> str:
    """The term a message is about, when the field has several."""
    return "" if term == field_text else f"{term!r}: "


def _parse_value(text: str, spec: _FieldSpec, expr: str, field_text: str) -> int:
    upper = text.upper()
    if upper in spec.names:
        return spec.names[upper]
    if not text.isdigit() or not text.isascii():
        raise _cron_error(
            expr,
            spec,
            field_text,
            f"{text!r} is not a number between {spec.low} and {spec.high}"
            + (f" or a name such as {next(iter(spec.names)).title()!r}" if spec.names else "")
            + f"; {_FIELD_HELP}.",
        )
    value = int(text)
    if not spec.low <= value <= spec.high:
        raise _cron_error(expr, spec, field_text, f"{value} is outside {spec.low}-{spec.high}.")
    return value


def _without_names(text: str, names: Iterable[str] = (*_MONTH_NAMES, *_DOW_NAMES)) -> str:
    """``text`` in upper case without month and day names, whose letters ("JUL", "WED",
    "THU") are not the L, W and H of the syntax."""
    bare = text.upper()
    for name in names:
        bare = bare.replace(name, "")
    return bare


def _terms(field_text: str, spec: _FieldSpec, expr: str, allowed: str = "") -> list[str]:
    """The comma-separated terms of a field, after refusing the characters it cannot hold.

    ``allowed`` is the calendar characters (of L, W and #) this field takes.
    """
    bare = _without_names(field_text, spec.names)
    for char, what in _UNSUPPORTED:
        if char in bare:
            raise ScheduleError(
                f"cron {expr!r}: {spec.name} field {field_text!r} uses {what}, a non-standard "
                f"extension that is not supported; {_FIELD_HELP}.",
                argument="cron",
            )
    # A name in the wrong field ("jul" as a minute) is reported as not a number, below.
    bare = _without_names(field_text)
    for char, where in _ONLY_IN.items():
        if char in bare and char not in allowed:
            raise _cron_error(expr, spec, field_text, f"{where}; {_FIELD_HELP}.")
    terms = field_text.split(",")
    if "" in terms:
        raise ScheduleError(
            f"cron {expr!r}: {spec.name} field {field_text!r} has an empty list item; "
            f"{_FIELD_HELP}.",
            argument="cron",
        )
    return terms


def _parse_term(term: str, spec: _FieldSpec, expr: str, field_text: str) -> range:
    """The values one term of a field matches, as Debian cron reads it.

    ``*`` is the whole range; ``a-b`` is inclusive and must not be reversed;
    ``*/n`` and ``a-b/n`` take every n-th value of the range; ``a/n`` means
    ``a-<max>/n`` (a Debian extension, e.g. ``5/20`` is 5, 25, 45 minutes).

    Two places where croniter 7 reads a field differently, and this module
    follows Debian (and cronsim) instead: an equal range with a step, such as
    ``5-5/2``, is just 5 (croniter: every even minute); ``7-7`` in the
    day-of-week field is Sunday (croniter: every day).
    """
    base, slash, step_text = term.partition("/")
    step = 1
    if slash:
        if not step_text.isdigit() or not step_text.isascii() or int(step_text) == 0:
            raise _cron_error(
                expr,
                spec,
                field_text,
                f"the step {step_text!r} must be a positive whole number.",
            )
        step = int(step_text)
    if base == "*":
        first, last = spec.low, spec.high
    elif "-" in base:
        first_text, _, last_text = base.partition("-")
        first = _parse_value(first_text, spec, expr, field_text)
        last = _parse_value(last_text, spec, expr, field_text)
        if last < first:
            raise _cron_error(
                expr,
                spec,
                field_text,
                f"the range {base!r} is reversed; write it low-high, or as a list "
                f"(e.g. 22-23,0-2).",
            )
    else:
        first = _parse_value(base, spec, expr, field_text)
        last = spec.high if slash else first
    return range(first, last + 1, step)


def _parse_field(field_text: str, spec: _FieldSpec, expr: str) -> frozenset[int]:
    """The set of values a minute, hour or month field matches (lists of terms)."""
    values: set[int] = set()
    for term in _terms(field_text, spec, expr):
        values.update(_parse_term(term, spec, expr, field_text))
    return frozenset(values)


def _nearest_weekday(day: int, length: int, first_weekday: int) -> int:
    """The Monday-to-Friday day of the month nearest ``day``, never in another month.

    ``length`` is the month's number of days, ``first_weekday`` the weekday of
    its 1st (0 = Sunday). A Saturday moves to the Friday before, except the 1st,
    which moves to Monday the 3rd; a Sunday moves to the Monday after, except
    the last day, which moves to the Friday before.
    """
    weekday = (first_weekday + day - 1) % 7
    if weekday == _SATURDAY:
        return 3 if day == 1 else day - 1
    if weekday == _SUNDAY:
        return day - 2 if day == length else day + 1
    return day


@dataclass(frozen=True)
class _DaysOfMonth:
    """A parsed day-of-month field: plain days, and the calendar terms L, LW and nW."""

    days: frozenset[int]
    last: bool  # L
    last_weekday: bool  # LW
    nearest_weekday: frozenset[int]  # nW

    def in_month(self, length: int, first_weekday: int) -> set[int]:
        found = {day for day in self.days if day <= length}
        if self.last:
            found.add(length)
        if self.last_weekday:
            found.add(_nearest_weekday(length, length, first_weekday))
        # A month without day n has no weekday nearest it, as plain "31" skips April.
        found.update(
            _nearest_weekday(day, length, first_weekday)
            for day in self.nearest_weekday
            if day <= length
        )
        return found


def _parse_days_of_month(field_text: str, expr: str) -> _DaysOfMonth:
    days: set[int] = set()
    last = last_weekday = False
    nearest: set[int] = set()
    for term in _terms(field_text, _DOM, expr, allowed="LW"):
        upper = term.upper()
        if upper == "L":
            last = True
        elif upper == "LW":
            last_weekday = True
        elif "L" in _without_names(upper) or "W" in _without_names(upper):
            day = upper.removesuffix("W")
            if day == upper or not day.isdigit() or not day.isascii():
                raise _cron_error(
                    expr,
                    _DOM,
                    field_text,
                    f"{_which(term, field_text)}L and W take a single day, not a range, a step "
                    f"or an offset; {_DOM_TERMS}. List several with commas, e.g. 1W,15W,L.",
                )
            nearest.add(_parse_value(day, _DOM, expr, field_text))
        else:
            days.update(_parse_term(term, _DOM, expr, field_text))
    return _DaysOfMonth(frozenset(days), last, last_weekday, frozenset(nearest))


@dataclass(frozen=True)
class _DaysOfWeek:
    """A parsed day-of-week field: plain weekdays, and the calendar terms dL and d#n."""

    weekdays: frozenset[int]  # 0 = Sunday ... 6 = Saturday
    last: frozenset[int]  # dL: the last weekday d of the month
    nth: frozenset[tuple[int, int]]  # d#n: (weekday, n), the n-th weekday d of the month

    def in_month(self, length: int, first_weekday: int) -> set[int]:
        weekdays, last, nth = self.weekdays, self.last, self.nth
        found = set()
        for day in range(1, length + 1):
            weekday = (first_weekday + day - 1) % 7
            if (
                weekday in weekdays
                or (weekday in last and day + 7 > length)
                or (weekday, (day + 6) // 7) in nth
            ):
                found.add(day)
        return found


def _parse_days_of_week(field_text: str, expr: str) -> _DaysOfWeek:
    weekdays: set[int] = set()
    last: set[int] = set()
    nth: set[tuple[int, int]] = set()

    def single_weekday(text: str, term: str) -> int:
        if text == "" or any(char in text for char in "*-/"):
            raise _cron_error(
                expr,
                _DOW,
                field_text,
                f"{_which(term, field_text)}# and L take a single day, not a range or a step; "
                f"{_DOW_TERMS}.",
            )
        return _parse_value(text, _DOW, expr, field_text) % 7

    for term in _terms(field_text, _DOW, expr, allowed="L#"):
        upper = term.upper()
        if "#" in upper:
            day, _, count = upper.partition("#")
            weekday = single_weekday(day, term)
            if not (count.isdigit() and count.isascii() and 1 <= int(count) <= 5):
                raise _cron_error(
                    expr,
                    _DOW,
                    field_text,
                    f"{_which(term, field_text)}the number after # must be 1 to 5: a month has "
                    f"at most five of each weekday (5L is the last one).",
                )
            nth.add((weekday, int(count)))
        elif "L" in _without_names(upper):
            day = upper.removesuffix("L")
            last.add(single_weekday(day if day != upper else "", term))
        else:
            weekdays.update(value % 7 for value in _parse_term(term, _DOW, expr, field_text))
    return _DaysOfWeek(frozenset(weekdays), frozenset(last), frozenset(nth))


@dataclass(frozen=True)
class _CronFields:
    """A parsed 5-field expression: what each field matches, and how to combine them."""

    minutes: tuple[int, ...]  # sorted
    hours: tuple[int, ...]  # sorted
    days: _DaysOfMonth
    months: frozenset[int]
    weekdays: _DaysOfWeek
    # Debian cron: if either day field starts with "*", a date must match both
    # day-of-month AND day-of-week; otherwise it must match either (OR).
    # croniter decides on the *expanded* fields instead (so "*/2" and "1-31"
    # behave differently there).
    days_and: bool
    # Debian cron's DST rule applies to "fixed-time" expressions: minute and
    # hour fields that do not start with "*" (see the module docstring).
    fixed_time: bool
    # The matching days of a month depend only on its length and the weekday of
    # its 1st: at most 4 x 7 shapes, each computed once.
    _by_shape: dict[tuple[int, int], tuple[int, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def days_of_month(self, year: int, month: int) -> tuple[int, ...]:
        """The days of ``year-month`` the day fields match, ascending."""
        monday_first, length = calendar.monthrange(year, month)  # 0 = Monday
        first_weekday = (monday_first + 1) % 7  # 0 = Sunday, as cron counts
        shape = (length, first_weekday)
        days = self._by_shape.get(shape)
        if days is None:
            by_date = self.days.in_month(length, first_weekday)
            by_weekday = self.weekdays.in_month(length, first_weekday)
            matched = by_date & by_weekday if self.days_and else by_date | by_weekday
            days = self._by_shape[shape] = tuple(sorted(matched))
        return days


def _normalize_cron(cron: object) -> str:
    if not isinstance(cron, str):
        raise ScheduleError(
            f"cron={cron!r} must be a string such as '*/15 * * * *' (minute hour "
            f"day-of-month month day-of-week).",
            argument="cron",
        )
    normalized = " ".join(cron.split())
    if normalized.startswith("@"):
        normalized = normalized.lower()
    return normalized


def _parse_cron(expr: str) -> _CronFields:
    if expr == "@reboot":
        raise ScheduleError(
            "cron '@reboot' has no fire times to schedule; run start-up work from "
            "AppConfig.ready() or your process manager, or give a 5-field expression.",
            argument="cron",
        )
    if expr.startswith("@"):
        if expr not in _ALIASES:
            raise ScheduleError(
                f"cron {expr!r} is not a known alias; use one of "
                f"{', '.join(sorted(_ALIASES))}, or a 5-field expression.",
                argument="cron",
            )
        expr_fields = _ALIASES[expr]
    else:
        expr_fields = expr
    parts = expr_fields.split()
    if len(parts) != 5:
        hint = (
            " (6 or 7 fields look like a seconds or year field, which is not supported: "
            "the smallest step is one minute; for sub-minute intervals use every=timedelta(...))"
            if len(parts) in (6, 7)
            else ""
        )
        raise ScheduleError(
            f"cron {expr!r} has {len(parts)} fields; give exactly 5: "
            f"minute hour day-of-month month day-of-week, e.g. '30 2 * * *'{hint}.",
            argument="cron",
        )
    minute, hour, dom, month, dow = parts
    weekdays = _parse_days_of_week(dow, expr)  # first: its error is the one reported
    return _CronFields(
        minutes=tuple(sorted(_parse_field(minute, _MINUTE, expr))),
        hours=tuple(sorted(_parse_field(hour, _HOUR, expr))),
        days=_parse_days_of_month(dom, expr),
        months=_parse_field(month, _MONTH, expr),
        weekdays=weekdays,
        days_and=dom.startswith("*") or dow.startswith("*"),
        fixed_time=not minute.startswith("*") and not hour.startswith("*"),
    )


def is_fixed_offset(name: object) -> bool:
    """True for fixed UTC offsets ("+02:00", "UTC+2", "Etc/GMT-5"), which ``Schedule`` refuses."""
    return isinstance(name, str) and bool(
        _FIXED_OFFSET_RE.match(name) or name.upper() in _FIXED_OFFSET_NAMES
    )


def resolve_zone(name: object) -> ZoneInfo:
    """The named IANA zone, or :class:`ScheduleError` (unknown zone, or a fixed offset)."""
    if not isinstance(name, str):
        raise ScheduleError(
            f"timezone={name!r} must be the name of an IANA zone, a string such as "
            f"'Europe/Berlin' or 'UTC'.",
            argument="timezone",
        )
    if is_fixed_offset(name):
        raise ScheduleError(
            f"timezone {name!r} is a fixed UTC offset, which does not follow daylight saving "
            f"time: the job would run an hour off local time for half the year. Use a named "
            f"IANA zone such as 'Europe/Berlin' or 'America/New_York' (or 'UTC').",
            argument="timezone",
            fixed_offset=True,
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleError(
            f"timezone {name!r} is not a known IANA zone; use a name such as 'Europe/Berlin' "
            f"or 'UTC' (zoneinfo.available_timezones() lists them; on hosts without a system "
            f"zone database install the 'tzdata' package).",
            argument="timezone",
        ) from None


def _to_us(delta: timedelta) -> int:
    return delta // _ONE_US


def _require_aware(value: object, argument: str) -> datetime:
    if not isinstance(value, datetime):
        raise ScheduleError(
            f"{argument}={value!r} must be an aware datetime, e.g. datetime.now(timezone.utc).",
            argument=argument,
        )
    if value.tzinfo is None or value.utcoffset() is None:
        raise ScheduleError(
            f"{argument}={value.isoformat()} is naive: it has no zone, so the instant is "
            f"ambiguous. Pass an aware datetime, e.g. datetime.now(timezone.utc) or "
            f"django.utils.timezone.now().",
            argument=argument,
        )
    return value


def _add_days(day: date, delta: timedelta) -> date:
    try:
        return day + delta
    except OverflowError:
        return date.max


def _wall(instant: datetime, tz: tzinfo) -> datetime:
    """The naive wall-clock time of an aware instant in ``tz``."""
    return instant.astimezone(tz).replace(tzinfo=None)


def _wall_offset(instant: datetime, tz: tzinfo) -> timedelta:
    """``tz``'s UTC offset at an aware UTC instant: its wall clock minus UTC."""
    return _wall(instant, tz) - instant.replace(tzinfo=None)


# --------------------------------------------------------------------------- the two kinds


#: Shortest gaps found, by rule and zone (at most this many kept).
_MIN_INTERVALS: dict[tuple[str, str], timedelta] = {}
_MIN_INTERVALS_KEPT = 1024


def _min_interval_of(canonical: str, timezone: str, rule: _CronRule | _IntervalRule) -> timedelta:
    """``rule.min_interval()``, computed once per rule (``canonical``) and zone."""
    key = (canonical, timezone)
    found = _MIN_INTERVALS.get(key)
    if found is None:
        if len(_MIN_INTERVALS) >= _MIN_INTERVALS_KEPT:
            _MIN_INTERVALS.clear()
        found = _MIN_INTERVALS[key] = rule.min_interval()
    return found


class _CronRule:
    """Fire instants of a 5-field expression on the wall clock of a zone."""

    def __init__(self, expr: str, tz: ZoneInfo) -> None:
        self.expr = expr
        self.fields = _parse_cron(expr)
        self.tz = tz
        self._utc = is_utc(tz)
        reference = datetime.combine(_REFERENCE_DATE, time())
        if next(self.walls(reference), None) is None:
            raise ScheduleError(
                f"cron {expr!r} never fires: no date matches its day-of-month, month "
                f"and day-of-week fields within {SEARCH_HORIZON_YEARS} years (like 30 "
                f"February). Fix the day or month field.",
                argument="cron",
            )

    @property
    def canonical(self) -> str:
        return f"cron={self.expr}"

    def walls(self, start: datetime) -> Iterator[datetime]:
        """Naive wall-clock datetimes matching the fields, ascending, from ``start`` (inclusive).

        Pure calendar arithmetic: no zone is involved yet. Stops once no date
        has matched for ``SEARCH_HORIZON_YEARS``.
        """
        fields = self.fields
        if start.second or start.microsecond:
            start = start.replace(second=0, microsecond=0) + _ONE_MINUTE
        start_day = start.date()
        give_up = _add_days(start_day, _SEARCH_HORIZON)
        year, month = start.year, start.month
        while date(year, month, 1) <= give_up:
            if month in fields.months:
                for number in fields.days_of_month(year, month):
                    day = date(year, month, number)
                    if day < start_day:
                        continue
                    if day > give_up:
                        return
                    yield from self._walls_of_day(day, start if day == start_day else None)
                    give_up = _add_days(day, _SEARCH_HORIZON)
            if month < 12:
                month += 1
            elif year < date.max.year:
                year, month = year + 1, 1
            else:
                return

    def _walls_of_day(self, day: date, start: datetime | None) -> Iterator[datetime]:
        """The matching wall times of ``day``, from ``start`` (its start day) if given."""
        hours, minutes = self.fields.hours, self.fields.minutes
        first_hour = 0 if start is None else bisect.bisect_left(hours, start.hour)
        for hour in hours[first_hour:]:
            if start is not None and hour == start.hour:
                minute_list = minutes[bisect.bisect_left(minutes, start.minute) :]
            else:
                minute_list = minutes
            for minute in minute_list:
                yield datetime(day.year, day.month, day.day, hour, minute)

    def _start_wall(self, after: datetime) -> datetime:
        """The earliest wall time whose fire instant can be later than ``after`` (UTC).

        Normally the wall time of ``after``. Just before a fall-back the clock
        will show earlier wall times again, so start as far back as the offset
        is about to drop.
        """
        offset = min(_wall_offset(after, self.tz), _wall_offset(after + 2 * _ONE_DAY, self.tz))
        return after.replace(tzinfo=None) + offset

    def instants_after(self, after: datetime) -> Iterator[datetime]:
        """Fire instants (aware UTC) strictly after ``after`` (aware UTC), ascending."""
        if self._utc:
            return self._utc_instants_after(after)
        if self.fields.fixed_time:
            return self._first_occurrences_after(after)
        return self._real_instants_after(after)

    def _utc_instants_after(self, after: datetime) -> Iterator[datetime]:
        """In UTC a wall time is its instant."""
        for wall in self.walls(after.replace(tzinfo=None)):
            instant = wall.replace(tzinfo=UTC)
            if instant > after:
                yield instant

    def _first_occurrences_after(self, after: datetime) -> Iterator[datetime]:
        """Wall-clock semantics (a fixed time): each matching wall time fires once, at its
        first occurrence; a wall time in the gap fires at the first instant after the gap.
        Several wall times in one gap collapse into that single instant."""
        tz, last = self.tz, after
        for wall in self.walls(self._start_wall(after)):
            first = wall.replace(tzinfo=tz).astimezone(UTC)
            if _wall(first, tz) != wall:
                first = self._after_gap(wall)
            if first > last:
                yield first
                last = first

    def _real_instants_after(self, after: datetime) -> Iterator[datetime]:
        """Instant semantics: every real instant whose wall time matches. Each wall time has
        0 (gap), 1 or 2 (repeated hour) instants. The first occurrences are ascending in
        wall order, and so are the second occurrences; merge the two streams."""
        tz, last = self.tz, after
        walls = self.walls(self._start_wall(after))
        seconds: deque[datetime] = deque()
        for wall in walls:
            first = wall.replace(tzinfo=tz).astimezone(UTC)
            second = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
            if first != second:
                if _wall(first, tz) != wall:
                    continue  # in the gap: this wall time never happens today
                first, second = min(first, second), max(first, second)
            while seconds and seconds[0] < first:
                pending = seconds.popleft()
                if pending > last:
                    yield pending
                    last = pending
            if first > last:
                yield first
                last = first
            if second != first:
                seconds.append(second)
        while seconds:
            pending = seconds.popleft()
            if pending > last:
                yield pending
                last = pending

    def _after_gap(self, wall: datetime) -> datetime:
        """The first real instant at or after a wall time that the clock skipped.

        Steps the wall time minute by minute until it exists: that is the end
        of the gap (03:00 for New York's 02:00-03:00 gap). A gap is at most a
        day long (Samoa skipped 2011-12-30), so the loop is bounded.
        """
        tz = self.tz
        candidate = wall
        for _ in range(2 * 1440):
            candidate += _ONE_MINUTE
            instant = candidate.replace(tzinfo=tz).astimezone(UTC)
            if _wall(instant, tz) == candidate:
                return instant
        raise ScheduleError(  # never: no zone has a gap this long
            f"cron {self.expr!r}: wall time {wall} is in a gap longer than two days."
        )

    def collect(self, after: datetime, end: datetime, limit: int) -> list[datetime]:
        out: list[datetime] = []
        for instant in self.instants_after(after):
            if instant > end or len(out) >= limit:
                break
            out.append(instant)
        return out

    def min_interval(self) -> timedelta:
        """The smallest gap among one year of fire times, and around that year's offset changes."""
        tz = self.tz
        start = datetime.combine(_REFERENCE_DATE, time(), tzinfo=tz).astimezone(UTC)
        year_end = start + timedelta(days=366)
        windows = [self.collect(start - _ONE_MINUTE, year_end, _MIN_INTERVAL_MAX_FIRES)]
        # Where the UTC offset changes, the gaps around the change are the
        # unusual ones: sample a window around each change in the year, so a
        # frequent schedule (which hits the fire-time cap in January) still
        # sees both transitions.
        previous = _wall_offset(start, tz)
        probe = start
        while probe < year_end:
            probe += _ONE_DAY
            current = _wall_offset(probe, tz)
            if current != previous:
                windows.append(self.collect(probe - 3 * _ONE_DAY, probe + 2 * _ONE_DAY, 4 * 1440))
                previous = current
        gaps = [
            later - earlier for window in windows for earlier, later in itertools.pairwise(window)
        ]
        if gaps:
            return min(gaps)
        # Fires at most once a year (e.g. "0 0 29 2 *"): measure the first gap.
        first = next(self.instants_after(start), None)
        second = None if first is None else next(self.instants_after(first), None)
        return _SEARCH_HORIZON if first is None or second is None else second - first


@functools.lru_cache(maxsize=1024)
def _cron_rule(expr: str, tz: ZoneInfo) -> _CronRule:
    """The rule of ``expr`` in ``tz``, built once: a rule is never changed once built, and
    a runner builds the schedule of every instance it runs, most of them sharing a few
    expressions and zones (an invalid one raises, and is not kept)."""
    return _CronRule(expr, tz)


class _IntervalRule:
    """Fire instants at whole multiples of an interval since the Unix epoch."""

    def __init__(self, every: object) -> None:
        if not isinstance(every, timedelta):
            raise ScheduleError(
                f"every={every!r} must be a datetime.timedelta, e.g. every=timedelta(minutes=5).",
                argument="every",
            )
        if every < timedelta(seconds=1):
            raise ScheduleError(
                f"every={every!r} must be a positive interval of at least 1 second, "
                f"e.g. every=timedelta(minutes=5).",
                argument="every",
            )
        if every % timedelta(seconds=1):
            raise ScheduleError(
                f"every={every!r} must be a whole number of seconds (fire times are "
                f"whole seconds since the epoch); round it, e.g. "
                f"every=timedelta(seconds={int(every.total_seconds())}).",
                argument="every",
            )
        self.every = every
        self._every_us = _to_us(every)

    @property
    def canonical(self) -> str:
        return f"every_us={self._every_us}"

    def instants_after(self, after: datetime) -> Iterator[datetime]:
        """Fire instants (aware UTC) strictly after ``after`` (aware UTC), ascending."""
        every_us = self._every_us
        k = _to_us(after - EPOCH) // every_us + 1
        while True:
            yield EPOCH + timedelta(microseconds=k * every_us)
            k += 1

    def min_interval(self) -> timedelta:
        return self.every


# --------------------------------------------------------------------------- Schedule


class Schedule:
    """A job's fire times: a 5-field cron in a named IANA zone, or a fixed interval.

    >>> from datetime import datetime, timezone
    >>> s = Schedule("30 2 * * *", timezone="America/New_York")
    >>> s.next_after(datetime(2026, 3, 7, 12, 0, tzinfo=timezone.utc))
    datetime.datetime(2026, 3, 8, 7, 0, tzinfo=datetime.timezone.utc)

    (2026-03-08 is the spring-forward day in New York: 02:30 does not exist,
    so the job runs once, at 03:00 EDT = 07:00 UTC.)

    Everything is validated here, eagerly: a bad expression, zone or interval
    raises :class:`~django_fencedjobs.exceptions.ScheduleError` naming the
    value and the fix, with the argument in its ``argument`` attribute.
    Instances are immutable values: equal when built from equal arguments,
    hashable.

    Attributes: ``cron`` (whitespace-normalized; aliases lower-cased) or
    ``every``; ``timezone`` (the zone's name) and ``tz`` (its ``ZoneInfo``);
    ``jitter``; ``key`` (what seeds the jitter); ``offset`` (the stable jitter
    offset in ``[0, jitter)``, whole seconds).
    """

    cron: str | None
    every: timedelta | None
    timezone: str
    tz: ZoneInfo
    jitter: timedelta
    key: str
    offset: timedelta

    def __init__(
        self,
        cron: str | None = None,
        every: timedelta | None = None,
        timezone: str = "UTC",
        jitter: timedelta = timedelta(0),
        key: str | None = None,
    ) -> None:
        if cron is None and every is None:
            raise ScheduleError(
                "a schedule needs a 5-field cron expression (e.g. '*/15 * * * *') or "
                "every=timedelta(...); got neither.",
                argument="cron",
            )
        if cron is not None and every is not None:
            raise ScheduleError(
                f"give exactly one of cron or every, not both: cron={cron!r}, every={every!r}.",
                argument="cron",
            )
        self.tz = resolve_zone(timezone)
        self.timezone = timezone

        self._rule: _CronRule | _IntervalRule
        if cron is not None:
            cron_rule = _cron_rule(_normalize_cron(cron), self.tz)
            self._rule = cron_rule
            self.cron, self.every = cron_rule.expr, None
            default_key = cron_rule.expr
        else:
            interval_rule = _IntervalRule(every)
            self._rule = interval_rule
            self.cron, self.every = None, interval_rule.every
            default_key = f"every={int(interval_rule.every.total_seconds())}s"

        if not isinstance(jitter, timedelta):
            raise ScheduleError(
                f"jitter={jitter!r} must be a datetime.timedelta, e.g. "
                f"jitter=timedelta(minutes=3), or timedelta(0) for none.",
                argument="jitter",
            )
        if jitter < timedelta(0):
            raise ScheduleError(
                f"jitter={jitter!r} is negative; give timedelta(0) for no jitter or a "
                f"positive timedelta such as timedelta(minutes=3).",
                argument="jitter",
            )
        self.jitter = jitter
        if key is not None and not isinstance(key, str):
            raise ScheduleError(
                f"key={key!r} must be a string (the job's name) or None.", argument="key"
            )
        self._key_given = key is not None
        self.key = key if key is not None else default_key
        self.offset = timedelta(seconds=self._jitter_seconds(self.key, jitter))

    # ------------------------------------------------------------------ jitter

    @staticmethod
    def _jitter_seconds(key: str, jitter: timedelta) -> int:
        """The stable offset, in whole seconds, in ``[0, jitter)``.

        ``BLAKE2b-64(b"django-fencedjobs:jitter:" + key as UTF-8)`` read as a
        big-endian integer, modulo the number of whole seconds that fit below
        ``jitter`` (``ceil(jitter)`` candidates: 0, 1, ... ``ceil(jitter) - 1``).
        """
        jitter_us = _to_us(jitter)
        choices = -(-jitter_us // _US_PER_SECOND)  # ceil
        if choices <= 1:
            return 0
        digest = hashlib.blake2b(
            b"django-fencedjobs:jitter:" + key.encode("utf-8"), digest_size=8
        ).digest()
        return int.from_bytes(digest, "big") % choices

    # ------------------------------------------------------------------ public API

    def next_after(self, after: datetime) -> datetime:
        """The first fire time strictly after ``after``, as an aware UTC datetime.

        ``after`` must be aware (any zone). If ``after`` is itself a fire time,
        the *next* one is returned, so calling this repeatedly walks the
        schedule.
        """
        for fire in self.iter_after(after):
            return fire
        raise ScheduleError(
            f"{self!r} does not fire in the {SEARCH_HORIZON_YEARS} years after "
            f"{after.isoformat()}.",
            argument="after",
        )

    def fire_times(
        self, start: datetime, end: datetime, limit: int | None = None
    ) -> list[datetime]:
        """Every fire time in ``(start, end]``, ascending, aware UTC; at most ``limit``.

        The interval is open at the start and closed at the end, so
        consecutive windows ``(a, b]``, ``(b, c]`` never count a fire time twice.
        """
        _require_aware(start, "start")
        _require_aware(end, "end")
        if limit is not None and limit < 0:
            raise ScheduleError(f"limit={limit!r} must be None or a number >= 0.", argument="limit")
        result: list[datetime] = []
        if end <= start or limit == 0:
            return result
        for fire in self.iter_after(start):
            if fire > end:
                break
            result.append(fire)
            if limit is not None and len(result) >= limit:
                break
        return result

    def previous_before(self, instant: datetime) -> datetime | None:
        """The last fire time strictly before ``instant``, aware UTC; None when there is
        none in the :data:`SEARCH_HORIZON_YEARS` before it.

        Fire times are only walked forwards: this looks back over a window of the
        schedule's shortest interval, doubled until the window holds one.
        """
        _require_aware(instant, "instant")
        instant = instant.astimezone(UTC)
        span = max(self.min_interval(), timedelta(seconds=1))
        while span <= _SEARCH_HORIZON * 2:
            found = self.fire_times(instant - span, instant - timedelta(microseconds=1))
            if found:
                return found[-1]
            span *= 2
        return None

    def iter_after(self, after: datetime) -> Iterator[datetime]:
        """Fire times strictly after ``after``, ascending, aware UTC, without end."""
        _require_aware(after, "after")
        return self._iter_after(after.astimezone(UTC))

    def _iter_after(self, after: datetime) -> Iterator[datetime]:
        offset = self.offset
        # A fire time is base + offset; it is after `after` iff base > after - offset.
        for base in self._rule.instants_after(after - offset):
            yield base + offset

    @functools.cached_property
    def _min_interval(self) -> timedelta:
        # Jitter shifts every fire time by the same offset: gaps are unchanged. Shared by
        # every schedule of the same rule and zone (a year of fire times is read for it,
        # and a job's instances often share a few schedules among thousands of keys).
        return _min_interval_of(self._rule.canonical, self.timezone, self._rule)

    def min_interval(self) -> timedelta:
        """The shortest gap between consecutive fire times (for configuration checks).

        ``every`` for an interval. For cron: the smallest gap among the fire
        times of one year starting 2025-01-01 in the schedule's zone (at most
        3000 of them) and among those around each of that year's UTC-offset
        changes, so both DST transitions count. Computed once and cached.
        """
        return self._min_interval

    @property
    def crontab(self) -> str | None:
        """The five-field expression with aliases expanded (``@daily`` is ``0 0 * * *``);
        None for an ``every=`` schedule."""
        if self.cron is None:
            return None
        return _ALIASES.get(self.cron, self.cron)

    def fingerprint(self) -> str:
        """A short hex digest of (cron or every, timezone, jitter).

        Stable across processes and Python versions (SHA-256 of a canonical
        string), so it can be stored to notice that a job's schedule changed.
        ``key`` is not part of it: it is the job's name, stored alongside.
        """
        return self._fingerprint

    @functools.cached_property
    def _fingerprint(self) -> str:
        # Cached: every tick compares it for every job.
        canonical = f"v1|{self._rule.canonical}|tz={self.timezone}|jitter_us={_to_us(self.jitter)}"
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]

    # ------------------------------------------------------------------ value semantics

    def _identity(self) -> tuple[object, ...]:
        return (self.cron, self.every, self.timezone, self.jitter, self.key)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Schedule):
            return NotImplemented
        return self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def __repr__(self) -> str:
        args = [f"cron={self.cron!r}" if self.cron is not None else f"every={self.every!r}"]
        if self.timezone != "UTC":
            args.append(f"timezone={self.timezone!r}")
        if self.jitter:
            args.append(f"jitter={self.jitter!r}")
        if self._key_given:
            args.append(f"key={self.key!r}")
        return f"Schedule({', '.join(args)})"
