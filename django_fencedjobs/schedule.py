"""When a job fires: a 5-field cron expression on the wall clock of a named zone
(:class:`_CronRule`), or an interval aligned to the Unix epoch so that every host computes the
same instants (:class:`_IntervalRule`); :class:`Schedule` turns either into aware UTC instants.

DST follows ISC/Vixie cron as Debian ships it, and cronsim, which the tests compare every fire
time with (croniter reads several fields and the transitions differently). A *fixed-time*
expression (neither the minute nor the hour field starts with ``*``) is read on the wall clock
alone: a wall time in the spring-forward gap fires once, at the end of the gap, a repeated one
once, at its first occurrence. Any other fires at every real instant whose wall time matches:
none in the gap, both of a repeated one. ``jitter`` adds one stable offset per schedule, from
a BLAKE2b hash of ``key`` (never Python's salted ``hash()``). docs/schedules.md has it all.
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

__all__ = ["SEARCH_HORIZON_YEARS", "Schedule", "wall_instant"]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: How far ahead a search for the next matching date goes. The longest gap any expression
#: can have: the fifth Monday of February (``0 0 * 2 1#5``) is in 2072, then in 2112 (2100 is
#: not a leap year). An expression that matches no date in it is refused when created.
SEARCH_HORIZON_YEARS = 40
_SEARCH_HORIZON = timedelta(days=366 * SEARCH_HORIZON_YEARS)

#: min_interval() samples a year of fire times from here (in the schedule's zone), at most
#: this many, plus a window around each UTC-offset change in that year.
_REFERENCE_DATE = date(2025, 1, 1)
_MIN_INTERVAL_MAX_FIRES = 3000

_ONE_US = timedelta(microseconds=1)
_ONE_MINUTE = timedelta(minutes=1)
_ONE_DAY = timedelta(days=1)

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
    m: n for n, m in enumerate("JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split(), 1)
}
_DOW_NAMES = {name: number for number, name in enumerate("SUN MON TUE WED THU FRI SAT".split())}


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

# Zone names that are fixed UTC offsets: some resolve ("Etc/GMT+5", which is UTC-5, "EST"),
# but none follows daylight saving time, so a job declared in one drifts an hour twice a year.
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


@dataclass(frozen=True)
class _Field:
    """One field of an expression as written, parsed and named in its error messages."""

    expr: str
    spec: _FieldSpec
    text: str

    def error(self, problem: str, sep: str = ": ") -> ScheduleError:
        return ScheduleError(
            f"cron {self.expr!r}: {self.spec.name} field {self.text!r}{sep}{problem}",
            argument="cron",
        )

    def which(self, term: str) -> str:
        """The term a message is about, when the field has several."""
        return "" if term == self.text else f"{term!r}: "

    def value(self, text: str) -> int:
        spec = self.spec
        if text.upper() in spec.names:
            return spec.names[text.upper()]
        if not text.isdigit() or not text.isascii():
            name = f" or a name such as {next(iter(spec.names)).title()!r}" if spec.names else ""
            raise self.error(
                f"{text!r} is not a number between {spec.low} and {spec.high}{name}; {_FIELD_HELP}."
            )
        value = int(text)
        if not spec.low <= value <= spec.high:
            raise self.error(f"{value} is outside {spec.low}-{spec.high}.")
        return value

    def terms(self, allowed: str = "") -> list[str]:
        """The comma-separated terms, after refusing the characters the field cannot hold
        (``allowed``: the calendar characters, of L, W and #, it takes)."""
        bare = _without_names(self.text, self.spec.names)
        for char, what in _UNSUPPORTED:
            if char in bare:
                raise self.error(
                    f"uses {what}, a non-standard extension that is not supported; {_FIELD_HELP}.",
                    sep=" ",
                )
        # A name in the wrong field ("jul" as a minute) is reported as not a number, later.
        bare = _without_names(self.text)
        for char, where in _ONLY_IN.items():
            if char in bare and char not in allowed:
                raise self.error(f"{where}; {_FIELD_HELP}.")
        terms = self.text.split(",")
        if "" in terms:
            raise self.error(f"has an empty list item; {_FIELD_HELP}.", sep=" ")
        return terms

    def term(self, term: str) -> range:
        """The values one term matches, as Debian cron reads it: ``*`` is the whole range;
        ``a-b`` is inclusive, never reversed; ``*/n`` and ``a-b/n`` take every n-th value of
        the range; ``a/n`` means ``a-<max>/n``. Unlike croniter 7, as Debian and cronsim:
        ``5-5/2`` is just 5, and ``7-7`` in the day-of-week field is Sunday."""
        base, slash, step_text = term.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or not step_text.isascii() or int(step_text) == 0:
                raise self.error(f"the step {step_text!r} must be a positive whole number.")
            step = int(step_text)
        if base == "*":
            first, last = self.spec.low, self.spec.high
        elif "-" in base:
            first_text, _, last_text = base.partition("-")
            first, last = self.value(first_text), self.value(last_text)
            if last < first:
                raise self.error(
                    f"the range {base!r} is reversed; write it low-high, or as a list "
                    f"(e.g. 22-23,0-2)."
                )
        else:
            first = self.value(base)
            last = self.spec.high if slash else first
        return range(first, last + 1, step)

    def values(self) -> frozenset[int]:
        """The values a minute, hour or month field matches."""
        return frozenset(value for term in self.terms() for value in self.term(term))


def _without_names(text: str, names: Iterable[str] = (*_MONTH_NAMES, *_DOW_NAMES)) -> str:
    """``text`` in upper case without month and day names, whose letters ("JUL", "WED",
    "THU") are not the L, W and H of the syntax."""
    bare = text.upper()
    for name in names:
        bare = bare.replace(name, "")
    return bare


def _nearest_weekday(day: int, length: int, first_weekday: int) -> int:
    """The Monday-to-Friday day nearest ``day`` in a month of ``length`` days whose 1st is
    ``first_weekday`` (0 = Sunday), never in another month: a Saturday moves to the Friday
    before (the 1st to Monday the 3rd), a Sunday to the Monday after (the last day to the
    Friday before)."""
    weekday = (first_weekday + day - 1) % 7
    if weekday == 6:  # Saturday
        return 3 if day == 1 else day - 1
    if weekday == 0:  # Sunday
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
        # A month without day n has no weekday nearest it, as plain "31" skips April.
        nearest = {day for day in self.nearest_weekday if day <= length}
        if self.last_weekday:
            nearest.add(length)
        return found | {_nearest_weekday(day, length, first_weekday) for day in nearest}


def _parse_days_of_month(field: _Field) -> _DaysOfMonth:
    days: set[int] = set()
    last = last_weekday = False
    nearest: set[int] = set()
    for term in field.terms(allowed="LW"):
        upper = term.upper()
        if upper == "L":
            last = True
        elif upper == "LW":
            last_weekday = True
        elif "L" in _without_names(upper) or "W" in _without_names(upper):
            day = upper.removesuffix("W")
            if day == upper or not day.isdigit() or not day.isascii():
                raise field.error(
                    f"{field.which(term)}L and W take a single day, not a range, a step or an "
                    f"offset; {_DOM_TERMS}. List several with commas, e.g. 1W,15W,L."
                )
            nearest.add(field.value(day))
        else:
            days.update(field.term(term))
    return _DaysOfMonth(frozenset(days), last, last_weekday, frozenset(nearest))


@dataclass(frozen=True)
class _DaysOfWeek:
    """A parsed day-of-week field: plain weekdays, and the calendar terms dL and d#n."""

    weekdays: frozenset[int]  # 0 = Sunday ... 6 = Saturday
    last: frozenset[int]  # dL: the last weekday d of the month
    nth: frozenset[tuple[int, int]]  # d#n: (weekday, n), the n-th weekday d of the month

    def in_month(self, length: int, first_weekday: int) -> set[int]:
        return {
            day
            for day in range(1, length + 1)
            if (weekday := (first_weekday + day - 1) % 7) in self.weekdays
            or (weekday in self.last and day + 7 > length)
            or (weekday, (day + 6) // 7) in self.nth
        }


def _parse_days_of_week(field: _Field) -> _DaysOfWeek:
    weekdays: set[int] = set()
    last: set[int] = set()
    nth: set[tuple[int, int]] = set()

    def single_weekday(text: str, term: str) -> int:
        if text == "" or any(char in text for char in "*-/"):
            raise field.error(
                f"{field.which(term)}# and L take a single day, not a range or a step; "
                f"{_DOW_TERMS}."
            )
        return field.value(text) % 7

    for term in field.terms(allowed="L#"):
        upper = term.upper()
        if "#" in upper:
            day, _, count = upper.partition("#")
            weekday = single_weekday(day, term)
            if not (count.isdigit() and count.isascii() and 1 <= int(count) <= 5):
                raise field.error(
                    f"{field.which(term)}the number after # must be 1 to 5: a month has at "
                    f"most five of each weekday (5L is the last one)."
                )
            nth.add((weekday, int(count)))
        elif "L" in _without_names(upper):
            day = upper.removesuffix("L")
            last.add(single_weekday(day if day != upper else "", term))
        else:
            weekdays.update(value % 7 for value in field.term(term))
    return _DaysOfWeek(frozenset(weekdays), frozenset(last), frozenset(nth))


@dataclass(frozen=True)
class _CronFields:
    """A parsed 5-field expression: what each field matches, and how to combine them."""

    minutes: tuple[int, ...]  # sorted
    hours: tuple[int, ...]  # sorted
    days: _DaysOfMonth
    months: frozenset[int]
    weekdays: _DaysOfWeek
    # Debian cron: when either day field starts with "*", a date must match both day fields;
    # else either (croniter decides on the expanded fields: "*/2" and "1-31" differ there).
    days_and: bool
    fixed_time: bool  # neither the minute nor the hour field starts with "*"
    # The matching days of a month depend only on its length and the weekday of its 1st: at
    # most 4 x 7 shapes, each computed once.
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
    return normalized.lower() if normalized.startswith("@") else normalized


def _parse_cron(expr: str) -> _CronFields:
    if expr == "@reboot":
        raise ScheduleError(
            "cron '@reboot' has no fire times to schedule; run start-up work from "
            "AppConfig.ready() or your process manager, or give a 5-field expression.",
            argument="cron",
        )
    if expr.startswith("@") and expr not in _ALIASES:
        raise ScheduleError(
            f"cron {expr!r} is not a known alias; use one of "
            f"{', '.join(sorted(_ALIASES))}, or a 5-field expression.",
            argument="cron",
        )
    parts = _ALIASES.get(expr, expr).split()
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
    weekdays = _parse_days_of_week(_Field(expr, _DOW, dow))  # first: its error is reported
    return _CronFields(
        minutes=tuple(sorted(_Field(expr, _MINUTE, minute).values())),
        hours=tuple(sorted(_Field(expr, _HOUR, hour).values())),
        days=_parse_days_of_month(_Field(expr, _DOM, dom)),
        months=_Field(expr, _MONTH, month).values(),
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


def _require_aware(value: object, argument: str) -> None:
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


def wall_instant(wall: datetime, tz: tzinfo) -> datetime:
    """The instant (aware UTC) of the naive wall time ``wall`` in ``tz``: its first
    occurrence, or if the clock skips it the first instant after the gap: the first wall
    minute after it that exists (03:00 in New York's 02:00-03:00 gap), so that several wall
    times in one gap collapse into one. A gap is at most a day long (Samoa skipped
    2011-12-30), so the search is bounded."""
    first = wall.replace(tzinfo=tz).astimezone(UTC)
    if _wall(first, tz) == wall:
        return first
    candidate = wall.replace(second=0, microsecond=0)
    for _ in range(2 * 1440):
        candidate += _ONE_MINUTE
        instant = candidate.replace(tzinfo=tz).astimezone(UTC)
        if _wall(instant, tz) == candidate:
            return instant
    raise ScheduleError(f"wall time {wall} is in a gap of {tz} longer than two days.")  # never


def _strictly_after(instants: Iterable[datetime], after: datetime) -> Iterator[datetime]:
    """``instants`` (ascending, repeats allowed) later than ``after``, each once."""
    last = after
    for instant in instants:
        if instant > last:
            yield instant
            last = instant


def _until(instants: Iterable[datetime], end: datetime, limit: int | None) -> list[datetime]:
    """The first of ``instants`` (ascending) up to ``end`` included, at most ``limit``."""
    return list(itertools.islice(itertools.takewhile(lambda at: at <= end, instants), limit))


class _CronRule:
    """Fire instants of a 5-field expression on the wall clock of a zone."""

    def __init__(self, expr: str, tz: ZoneInfo) -> None:
        self.expr, self.canonical = expr, f"cron={expr}"
        self.fields = _parse_cron(expr)
        self.tz = tz
        self._utc = is_utc(tz)
        if next(self.walls(datetime.combine(_REFERENCE_DATE, time())), None) is None:
            raise ScheduleError(
                f"cron {expr!r} never fires: no date matches its day-of-month, month "
                f"and day-of-week fields within {SEARCH_HORIZON_YEARS} years (like 30 "
                f"February). Fix the day or month field.",
                argument="cron",
            )

    def walls(self, start: datetime) -> Iterator[datetime]:
        """Naive wall-clock datetimes matching the fields, ascending, from ``start`` (inclusive),
        no zone involved; until no date has matched for ``SEARCH_HORIZON_YEARS``."""
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
        start_hour, start_minute = (-1, 0) if start is None else (start.hour, start.minute)
        for hour in hours[bisect.bisect_left(hours, start_hour) :]:
            first_minute = bisect.bisect_left(minutes, start_minute) if hour == start_hour else 0
            for minute in minutes[first_minute:]:
                yield datetime(day.year, day.month, day.day, hour, minute)

    def _start_wall(self, after: datetime) -> datetime:
        """The earliest wall time whose fire instant can be later than ``after`` (UTC): its
        wall time, or earlier just before a fall-back, by as much as the offset will drop."""
        offset = min(_wall_offset(after, self.tz), _wall_offset(after + 2 * _ONE_DAY, self.tz))
        return after.replace(tzinfo=None) + offset

    def instants_after(self, after: datetime) -> Iterator[datetime]:
        """Fire instants (aware UTC) strictly after ``after`` (aware UTC), ascending."""
        if self._utc:  # a wall time is its instant
            walls = self.walls(after.replace(tzinfo=None))
            return _strictly_after((wall.replace(tzinfo=UTC) for wall in walls), after)
        walls = self.walls(self._start_wall(after))
        if self.fields.fixed_time:
            return _strictly_after((wall_instant(wall, self.tz) for wall in walls), after)
        return _strictly_after(self._real_instants(walls), after)

    def _real_instants(self, walls: Iterable[datetime]) -> Iterator[datetime]:
        """Every real instant of each wall time: none in a gap, two in a repeated hour. The
        first occurrences ascend in wall order, and so do the second ones: merge the two."""
        tz = self.tz
        seconds: deque[datetime] = deque()
        for wall in walls:
            first = wall.replace(tzinfo=tz).astimezone(UTC)
            second = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
            if first != second:
                if _wall(first, tz) != wall:
                    continue  # in the gap: this wall time never happens
                first, second = min(first, second), max(first, second)
            while seconds and seconds[0] < first:
                yield seconds.popleft()
            yield first
            if second != first:
                seconds.append(second)
        yield from seconds

    @functools.cached_property
    def min_interval(self) -> timedelta:
        """The smallest gap among one year of fire times, and around that year's offset
        changes; computed once per rule, which every schedule of it shares."""
        tz = self.tz
        start = datetime.combine(_REFERENCE_DATE, time(), tzinfo=tz).astimezone(UTC)
        year_end = start + timedelta(days=366)
        windows = [
            _until(self.instants_after(start - _ONE_MINUTE), year_end, _MIN_INTERVAL_MAX_FIRES)
        ]
        # The unusual gaps are around offset changes: sample a window around each, so a
        # frequent schedule (which hits the cap in January) still sees both transitions.
        days = (start + n * _ONE_DAY for n in range(367))
        for day, next_day in itertools.pairwise(days):
            if _wall_offset(day, tz) != _wall_offset(next_day, tz):
                window = self.instants_after(next_day - 3 * _ONE_DAY)
                windows.append(_until(window, next_day + 2 * _ONE_DAY, 4 * 1440))
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
    """The rule of ``expr`` in ``tz``, built once (and never changed): a runner builds the
    schedule of every instance, most sharing a few expressions and zones."""
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
        self.every = self.min_interval = every
        self.canonical = f"every_us={_to_us(every)}"

    def instants_after(self, after: datetime) -> Iterator[datetime]:
        """Fire instants (aware UTC) strictly after ``after`` (aware UTC), ascending."""
        first = (after - EPOCH) // self.every + 1
        return (EPOCH + k * self.every for k in itertools.count(first))


class Schedule:
    """A job's fire times: a 5-field cron in a named IANA zone, or a fixed interval.

    >>> from datetime import datetime, timezone
    >>> s = Schedule("30 2 * * *", timezone="America/New_York")
    >>> s.next_after(datetime(2026, 3, 7, 12, 0, tzinfo=timezone.utc))  # 02:30 skipped: 03:00 EDT
    datetime.datetime(2026, 3, 8, 7, 0, tzinfo=datetime.timezone.utc)

    Validated eagerly: a bad expression, zone or interval raises
    :class:`~django_fencedjobs.exceptions.ScheduleError` naming the value and the fix, and the
    argument in its ``argument``. Immutable values: equal when built from equal arguments,
    hashable. Attributes: ``cron`` (whitespace-normalized; aliases lower-cased) or ``every``;
    ``timezone`` (the zone's name) and ``tz`` (its ``ZoneInfo``); ``jitter``; ``key`` (what
    seeds the jitter); ``offset`` (the stable jitter offset in ``[0, jitter)``, whole seconds).
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
            self._rule = _cron_rule(_normalize_cron(cron), self.tz)
            self.cron, self.every = self._rule.expr, None
            default_key = self._rule.expr
        else:
            self._rule = _IntervalRule(every)
            self.cron, self.every = None, self._rule.every
            default_key = f"every={int(self._rule.every.total_seconds())}s"

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

    @staticmethod
    def _jitter_seconds(key: str, jitter: timedelta) -> int:
        """The stable offset: ``BLAKE2b-64(b"django-fencedjobs:jitter:" + key as UTF-8)``, a
        big-endian integer, modulo ``ceil(jitter)`` in seconds (candidates 0 ... ceil - 1)."""
        choices = -(-jitter // timedelta(seconds=1))  # ceil
        if choices <= 1:
            return 0
        digest = hashlib.blake2b(
            b"django-fencedjobs:jitter:" + key.encode("utf-8"), digest_size=8
        ).digest()
        return int.from_bytes(digest, "big") % choices

    def next_after(self, after: datetime) -> datetime:
        """The first fire time strictly after ``after`` (aware, any zone), as an aware UTC
        datetime: the *next* one when ``after`` is itself a fire time."""
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
        Consecutive windows ``(a, b]``, ``(b, c]`` never count a fire time twice."""
        _require_aware(start, "start")
        _require_aware(end, "end")
        if limit is not None and limit < 0:
            raise ScheduleError(f"limit={limit!r} must be None or a number >= 0.", argument="limit")
        if end <= start:
            return []
        return _until(self.iter_after(start), end, limit)

    def previous_before(self, instant: datetime) -> datetime | None:
        """The last fire time strictly before ``instant``, aware UTC; None when there is
        none in the :data:`SEARCH_HORIZON_YEARS` before it. Fire times are only walked
        forwards: this looks back over the shortest interval, doubled until it holds one."""
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

    def min_interval(self) -> timedelta:
        """The shortest gap between consecutive fire times (for configuration checks):
        ``every``; for cron, the smallest among the fire times of the year from 2025-01-01 in
        the schedule's zone (at most 3000) and around each of its UTC-offset changes, so both
        DST transitions count. Computed once and cached."""
        return self._rule.min_interval  # jitter shifts every fire time alike: same gaps

    @property
    def crontab(self) -> str | None:
        """The five-field expression with aliases expanded (``@daily`` is ``0 0 * * *``);
        None for an ``every=`` schedule."""
        return None if self.cron is None else _ALIASES.get(self.cron, self.cron)

    def fingerprint(self) -> str:
        """A short hex digest of (cron or every, timezone, jitter), stable across processes
        and Python versions (SHA-256), stored to notice that a job's schedule changed. ``key``
        is not part of it: it is the job's name, stored alongside."""
        return self._fingerprint

    @functools.cached_property
    def _fingerprint(self) -> str:
        # Computed when first asked (every tick compares it), not for every schedule built.
        canonical = f"v1|{self._rule.canonical}|tz={self.timezone}|jitter_us={_to_us(self.jitter)}"
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]

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
