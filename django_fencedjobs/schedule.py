"""When a job fires: a cron expression in a named zone, or a fixed interval.

A :class:`Schedule` turns a description such as ``"30 2 * * *"`` in
``"America/New_York"`` into the exact instants (aware datetimes in UTC) at which
a job is due. Everything that stores or compares times in this package works
with those UTC instants; the zone only matters here, when wall-clock fields are
turned into instants.

Two kinds of schedule exist:

``cron``
    A standard 5-field expression (minute, hour, day of month, month, day of
    week), evaluated on the wall clock of ``timezone``. The aliases
    ``@hourly``, ``@daily``/``@midnight``, ``@weekly``, ``@monthly`` and
    ``@yearly``/``@annually`` are accepted.

``every``
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

croniter (a dependency, used here only as a second validator) is *not* used to
compute fire times: croniter 7 fires fixed-time schedules twice in the repeated
hour, and computes on the wrong wall clock when started from a naive or UTC
datetime. It also differs from Debian cron on some field edge cases (see
:func:`_parse_field`). The matching below is this module's own.

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
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django_fencedjobs.exceptions import ScheduleError

__all__ = ["SEARCH_HORIZON_YEARS", "Schedule"]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: How far ahead a search for the next matching date goes before it gives up.
#: Nine years covers the rarest sensible expression, 29 February, even across
#: a century year that is not a leap year (2096 -> 2104). An expression that
#: matches no date in that span (``0 0 30 2 *``) is refused when the Schedule
#: is created, so no search can loop forever.
SEARCH_HORIZON_YEARS = 9
_SEARCH_HORIZON = timedelta(days=366 * SEARCH_HORIZON_YEARS)

#: min_interval() samples fire times from here (in the schedule's zone).
_REFERENCE_DATE = date(2025, 1, 1)
#: ... for one year, or this many fire times, whichever comes first; plus a
#: window around each UTC-offset change in that year.
_MIN_INTERVAL_MAX_FIRES = 3000

_ONE_US = timedelta(microseconds=1)
_ONE_MINUTE = timedelta(minutes=1)
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
_DOW_SHORT = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]


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


def _parse_value(text: str, spec: _FieldSpec, expr: str, field_text: str) -> int:
    upper = text.upper()
    if upper in spec.names:
        return spec.names[upper]
    if not text.isdigit() or not text.isascii():
        raise ScheduleError(
            f"cron {expr!r}: {spec.name} field {field_text!r}: {text!r} is not a number "
            f"between {spec.low} and {spec.high}"
            + (f" or a name such as {next(iter(spec.names)).title()!r}" if spec.names else "")
            + f"; {_FIELD_HELP}."
        )
    value = int(text)
    if not spec.low <= value <= spec.high:
        raise ScheduleError(
            f"cron {expr!r}: {spec.name} field {field_text!r}: {value} is outside "
            f"{spec.low}-{spec.high}."
        )
    return value


def _parse_field(field_text: str, spec: _FieldSpec, expr: str) -> frozenset[int]:
    """The set of values one cron field matches, as Debian cron reads it.

    ``*`` is the whole range; ``a-b`` is inclusive and must not be reversed;
    ``*/n`` and ``a-b/n`` take every n-th value of the range; ``a/n`` means
    ``a-<max>/n`` (a Debian extension, e.g. ``5/20`` is 5, 25, 45 minutes).
    Lists combine any of these.

    Two places where croniter 7 reads a field differently, and this module
    follows Debian (and cronsim) instead: an equal range with a step, such as
    ``5-5/2``, is just 5 (croniter: every even minute); ``7-7`` in the
    day-of-week field is Sunday (croniter: every day).
    """
    # Month and day names contain some of these letters ("JUL", "WED"), so
    # look for the bare syntax only after taking the names out.
    bare = field_text.upper()
    for name in spec.names:
        bare = bare.replace(name, "")
    for char, what in (
        ("L", "L (last)"),
        ("W", "W (nearest weekday)"),
        ("#", "# (nth weekday)"),
        ("?", "?"),
        ("H", "H (hashed)"),
    ):
        if char in bare:
            raise ScheduleError(
                f"cron {expr!r}: {spec.name} field {field_text!r} uses {what}, a non-standard "
                f"extension that is not supported; {_FIELD_HELP}."
            )
    values: set[int] = set()
    for term in field_text.split(","):
        if term == "":
            raise ScheduleError(
                f"cron {expr!r}: {spec.name} field {field_text!r} has an empty list item; "
                f"{_FIELD_HELP}."
            )
        base, slash, step_text = term.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or not step_text.isascii() or int(step_text) == 0:
                raise ScheduleError(
                    f"cron {expr!r}: {spec.name} field {field_text!r}: the step {step_text!r} "
                    f"must be a positive whole number."
                )
            step = int(step_text)
        if base == "*":
            first, last = spec.low, spec.high
        elif "-" in base:
            first_text, _, last_text = base.partition("-")
            first = _parse_value(first_text, spec, expr, field_text)
            last = _parse_value(last_text, spec, expr, field_text)
            if last < first:
                raise ScheduleError(
                    f"cron {expr!r}: {spec.name} field {field_text!r}: the range {base!r} is "
                    f"reversed; write it low-high, or as a list (e.g. 22-23,0-2)."
                )
        else:
            first = _parse_value(base, spec, expr, field_text)
            last = spec.high if slash else first
        values.update(range(first, last + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class _CronFields:
    """A parsed 5-field expression: sets of matching values, and how to combine them."""

    minutes: tuple[int, ...]  # sorted
    hours: tuple[int, ...]  # sorted
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday ... 6 = Saturday
    # Debian cron: if either day field starts with "*", a date must match both
    # day-of-month AND day-of-week; otherwise it must match either (OR).
    # croniter decides on the *expanded* fields instead (so "*/2" and "1-31"
    # behave differently there); we never ask croniter.
    days_and: bool
    # Debian cron's DST rule applies to "fixed-time" expressions: minute and
    # hour fields that do not start with "*" (see the module docstring).
    fixed_time: bool
    texts: tuple[str, str, str, str, str]

    def day_matches(self, day: date) -> bool:
        dom = day.day in self.days
        dow = day.isoweekday() % 7 in self.weekdays
        return (dom and dow) if self.days_and else (dom or dow)


def _normalize_cron(cron: object) -> str:
    if not isinstance(cron, str):
        raise ScheduleError(
            f"cron={cron!r} must be a string such as '*/15 * * * *' (minute hour "
            f"day-of-month month day-of-week)."
        )
    normalized = " ".join(cron.split())
    if normalized.startswith("@"):
        normalized = normalized.lower()
    return normalized


def _parse_cron(expr: str) -> _CronFields:
    if expr == "@reboot":
        raise ScheduleError(
            "cron '@reboot' has no fire times to schedule; run start-up work from "
            "AppConfig.ready() or your process manager, or give a 5-field expression."
        )
    if expr.startswith("@"):
        if expr not in _ALIASES:
            raise ScheduleError(
                f"cron {expr!r} is not a known alias; use one of "
                f"{', '.join(sorted(_ALIASES))}, or a 5-field expression."
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
            f"minute hour day-of-month month day-of-week, e.g. '30 2 * * *'{hint}."
        )
    minute, hour, dom, month, dow = parts
    weekdays = frozenset(d % 7 for d in _parse_field(dow, _DOW, expr))
    fields = _CronFields(
        minutes=tuple(sorted(_parse_field(minute, _MINUTE, expr))),
        hours=tuple(sorted(_parse_field(hour, _HOUR, expr))),
        days=_parse_field(dom, _DOM, expr),
        months=_parse_field(month, _MONTH, expr),
        weekdays=weekdays,
        days_and=dom.startswith("*") or dow.startswith("*"),
        fixed_time=not minute.startswith("*") and not hour.startswith("*"),
        texts=(minute, hour, dom, month, dow),
    )
    _check_croniter_accepts(expr_fields, expr)
    return fields


def _check_croniter_accepts(expr_fields: str, expr: str) -> None:
    """Refuse anything croniter would refuse, so other tools reading the same string agree."""
    try:
        from croniter import croniter
    except ImportError:  # pragma: no cover - croniter is a declared dependency
        return
    if not croniter.is_valid(expr_fields):
        raise ScheduleError(f"cron {expr!r} is not a valid cron expression; {_FIELD_HELP}.")


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
            f"'Europe/Berlin' or 'UTC'."
        )
    if is_fixed_offset(name):
        raise ScheduleError(
            f"timezone {name!r} is a fixed UTC offset, which does not follow daylight saving "
            f"time: the job would run an hour off local time for half the year. Use a named "
            f"IANA zone such as 'Europe/Berlin' or 'America/New_York' (or 'UTC')."
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleError(
            f"timezone {name!r} is not a known IANA zone; use a name such as 'Europe/Berlin' "
            f"or 'UTC' (zoneinfo.available_timezones() lists them; on hosts without a system "
            f"zone database install the 'tzdata' package)."
        ) from None


def _to_us(delta: timedelta) -> int:
    return delta // _ONE_US


def _require_aware(value: object, argument: str) -> datetime:
    if not isinstance(value, datetime):
        raise ScheduleError(
            f"{argument}={value!r} must be an aware datetime, e.g. datetime.now(timezone.utc)."
        )
    if value.tzinfo is None or value.utcoffset() is None:
        raise ScheduleError(
            f"{argument}={value.isoformat()} is naive: it has no zone, so the instant is "
            f"ambiguous. Pass an aware datetime, e.g. datetime.now(timezone.utc) or "
            f"django.utils.timezone.now()."
        )
    return value


def _format_duration(delta: timedelta) -> str:
    """Compact duration: 3m, 1h30m, 45s, 2d."""
    total = int(delta.total_seconds())
    if total <= 0:
        return f"{delta.total_seconds():g}s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, total = divmod(total, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def _add_days(day: date, delta: timedelta) -> date:
    try:
        return day + delta
    except OverflowError:
        return date.max


def _plural(count: int, unit: str) -> str:
    return f"every {unit}" if count == 1 else f"every {count} {unit}s"


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
    value and the fix. Instances are immutable values: equal when built from
    equal arguments, hashable.

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
                "every=timedelta(...); got neither."
            )
        if cron is not None and every is not None:
            raise ScheduleError(
                f"give exactly one of cron or every, not both: cron={cron!r}, every={every!r}."
            )
        self.tz = resolve_zone(timezone)
        self.timezone = timezone

        self._fields: _CronFields | None = None
        self._every_us = 0
        if cron is not None:
            self.cron = _normalize_cron(cron)
            self.every = None
            self._fields = _parse_cron(self.cron)
            default_key = self.cron
        else:
            if not isinstance(every, timedelta):
                raise ScheduleError(
                    f"every={every!r} must be a datetime.timedelta, e.g. "
                    f"every=timedelta(minutes=5)."
                )
            if every < timedelta(seconds=1):
                raise ScheduleError(
                    f"every={every!r} must be a positive interval of at least 1 second, "
                    f"e.g. every=timedelta(minutes=5)."
                )
            if every % timedelta(seconds=1):
                raise ScheduleError(
                    f"every={every!r} must be a whole number of seconds (fire times are "
                    f"whole seconds since the epoch); round it, e.g. "
                    f"every=timedelta(seconds={int(every.total_seconds())})."
                )
            self.cron = None
            self.every = every
            self._every_us = _to_us(every)
            default_key = f"every={int(every.total_seconds())}s"

        if not isinstance(jitter, timedelta):
            raise ScheduleError(
                f"jitter={jitter!r} must be a datetime.timedelta, e.g. "
                f"jitter=timedelta(minutes=3), or timedelta(0) for none."
            )
        if jitter < timedelta(0):
            raise ScheduleError(
                f"jitter={jitter!r} is negative; give timedelta(0) for no jitter or a "
                f"positive timedelta such as timedelta(minutes=3)."
            )
        self.jitter = jitter
        if key is not None and not isinstance(key, str):
            raise ScheduleError(f"key={key!r} must be a string (the job's name) or None.")
        self._key_given = key is not None
        self.key = key if key is not None else default_key
        self.offset = timedelta(seconds=self._jitter_seconds(self.key, jitter))
        self._offset_us = _to_us(self.offset)

        if self._fields is not None:
            reference = datetime.combine(_REFERENCE_DATE, time())
            if next(self._walls(reference), None) is None:
                raise ScheduleError(
                    f"cron {self.cron!r} never fires: no date matches its day-of-month, month "
                    f"and day-of-week fields within {SEARCH_HORIZON_YEARS} years (like 30 "
                    f"February). Fix the day or month field."
                )

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
            f"{self!r} does not fire in the {SEARCH_HORIZON_YEARS} years after {after.isoformat()}."
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
            raise ScheduleError(f"limit={limit!r} must be None or a number >= 0.")
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

    def iter_after(self, after: datetime) -> Iterator[datetime]:
        """Fire times strictly after ``after``, ascending, aware UTC, without end."""
        _require_aware(after, "after")
        return self._iter_after(after.astimezone(UTC))

    def _iter_after(self, after: datetime) -> Iterator[datetime]:
        offset = self.offset
        # A fire time is base + offset; it is after `after` iff base > after - offset.
        base_after = after - offset
        if self._fields is None:
            every_us = self._every_us
            k = _to_us(base_after - EPOCH) // every_us + 1
            while True:
                yield EPOCH + timedelta(microseconds=k * every_us) + offset
                k += 1
        for base in self._cron_instants(base_after):
            yield base + offset

    @functools.cached_property
    def _min_interval(self) -> timedelta:
        if self.every is not None:
            return self.every
        # Jitter shifts every fire time by the same offset: gaps are unchanged.
        tz = self.tz
        start = datetime.combine(_REFERENCE_DATE, time(), tzinfo=tz).astimezone(UTC)
        year_end = start + timedelta(days=366)
        windows: list[list[datetime]] = [
            self._collect(start - _ONE_MINUTE, year_end, _MIN_INTERVAL_MAX_FIRES)
        ]
        # Where the UTC offset changes, the gaps around the change are the
        # unusual ones: sample a window around each change in the year, so a
        # frequent schedule (which hits the fire-time cap in January) still
        # sees both transitions.
        day = timedelta(days=1)
        previous = start.astimezone(tz).utcoffset()
        probe = start
        while probe < year_end:
            probe += day
            current = probe.astimezone(tz).utcoffset()
            if current != previous:
                windows.append(self._collect(probe - 3 * day, probe + 2 * day, 4 * 1440))
                previous = current
        gaps = [
            later - earlier for window in windows for earlier, later in itertools.pairwise(window)
        ]
        if gaps:
            return min(gaps)
        # Fires at most once a year (e.g. "0 0 29 2 *"): measure the first gap.
        first = self._first_base_after(start)
        try:
            second = self._first_base_after(first)
        except ScheduleError:
            return _SEARCH_HORIZON
        return second - first

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
        what = f"cron={self.cron}" if self.cron is not None else f"every_us={self._every_us}"
        canonical = f"v1|{what}|tz={self.timezone}|jitter_us={_to_us(self.jitter)}"
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]

    def describe(self) -> str:
        """Human words: ``"at 09:00 on Mon-Fri (Europe/Berlin), jitter 3m"``."""
        if self.every is not None:
            words = self._describe_every(self.every)
        else:
            assert self._fields is not None
            words = self._describe_cron(self._fields) or f"cron {self.cron!r}"
        words += f" ({self.timezone})"
        if self.jitter > timedelta(0):
            words += f", jitter {_format_duration(self.jitter)}"
        return words

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

    # ------------------------------------------------------------------ cron machinery

    def _first_base_after(self, after: datetime) -> datetime:
        for base in self._cron_instants(after):
            return base
        raise ScheduleError(f"{self!r} does not fire after {after.isoformat()}.")

    def _collect(self, after: datetime, end: datetime, limit: int) -> list[datetime]:
        out: list[datetime] = []
        for base in self._cron_instants(after):
            if base > end or len(out) >= limit:
                break
            out.append(base)
        return out

    def _walls(self, start: datetime) -> Iterator[datetime]:
        """Naive wall-clock datetimes matching the fields, ascending, from ``start`` (inclusive).

        Pure calendar arithmetic: no zone is involved yet. Stops once no date
        has matched for ``SEARCH_HORIZON_YEARS``.
        """
        fields = self._fields
        assert fields is not None
        minutes, hours = fields.minutes, fields.hours
        months, day_matches = fields.months, fields.day_matches
        if start.second or start.microsecond:
            start = start.replace(second=0, microsecond=0) + _ONE_MINUTE
        day = start.date()
        give_up = _add_days(day, _SEARCH_HORIZON)
        first_hour = bisect.bisect_left(hours, start.hour)
        first_minute = bisect.bisect_left(minutes, start.minute)
        on_start_day = True
        one_day = timedelta(days=1)
        while day <= give_up:
            if day.month not in months:
                # Jump to the first of the next month.
                last = calendar.monthrange(day.year, day.month)[1]
                if day.year >= 9999 and day.month == 12:
                    return
                day = day.replace(day=last) + one_day
                on_start_day = False
                continue
            if day_matches(day):
                for hour in hours[first_hour:] if on_start_day else hours:
                    if on_start_day and hour == start.hour:
                        minute_list = minutes[first_minute:]
                    else:
                        minute_list = minutes
                    for minute in minute_list:
                        yield datetime(day.year, day.month, day.day, hour, minute)
                give_up = _add_days(day, _SEARCH_HORIZON)
            if day >= date.max - one_day:
                return
            day += one_day
            on_start_day = False

    def _start_wall(self, after: datetime) -> datetime:
        """The earliest wall time whose fire instant can be later than ``after`` (UTC).

        Normally the wall time of ``after``. Just before a fall-back the clock
        will show earlier wall times again, so start as far back as the offset
        is about to drop.
        """
        tz = self.tz
        offset_now = after.astimezone(tz).utcoffset()
        offset_soon = (after + timedelta(days=2)).astimezone(tz).utcoffset()
        assert offset_now is not None and offset_soon is not None
        return (after + min(offset_now, offset_soon)).replace(tzinfo=None)

    def _cron_instants(self, after: datetime) -> Iterator[datetime]:
        """Unjittered fire instants (aware UTC) strictly after ``after`` (aware UTC), ascending."""
        fields = self._fields
        assert fields is not None
        tz: tzinfo = self.tz
        if self.timezone in ("UTC", "Etc/UTC"):
            for wall in self._walls(after.replace(tzinfo=None)):
                instant = wall.replace(tzinfo=UTC)
                if instant > after:
                    yield instant
            return

        walls = self._walls(self._start_wall(after))
        last = after
        if fields.fixed_time:
            # Wall-clock semantics: each matching wall time fires once, at its
            # first occurrence; a wall time in the gap fires at the first
            # instant after the gap. Several wall times in one gap collapse
            # into that single instant.
            for wall in walls:
                first = wall.replace(tzinfo=tz).astimezone(UTC)
                if first.astimezone(tz).replace(tzinfo=None) != wall:
                    first = self._after_gap(wall)
                if first > last:
                    yield first
                    last = first
            return

        # Instant semantics: every real instant whose wall time matches. Each
        # wall time has 0 (gap), 1 or 2 (repeated hour) instants. The first
        # occurrences are ascending in wall order, and so are the second
        # occurrences; merge the two streams.
        seconds: deque[datetime] = deque()
        for wall in walls:
            first = wall.replace(tzinfo=tz).astimezone(UTC)
            second = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
            if first != second:
                if first.astimezone(tz).replace(tzinfo=None) != wall:
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
            if instant.astimezone(tz).replace(tzinfo=None) == candidate:
                return instant
        raise ScheduleError(  # pragma: no cover - no zone has a gap this long
            f"{self!r}: wall time {wall} is in a gap longer than two days."
        )

    # ------------------------------------------------------------------ describe

    @staticmethod
    def _describe_every(every: timedelta) -> str:
        seconds = int(every.total_seconds())
        for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
            if seconds % size == 0:
                return _plural(seconds // size, unit)
        if seconds > 60:
            return f"every {_format_duration(every)}"
        return _plural(seconds, "second")

    @staticmethod
    def _describe_cron(fields: _CronFields) -> str | None:
        minute, hour, dom, month, dow = fields.texts
        every_day = dom == "*" and month == "*" and dow == "*"
        step = re.fullmatch(r"\*/(\d+)", minute)
        if every_day and hour == "*":
            if minute == "*":
                return "every minute"
            if step and 60 % int(step.group(1)) == 0:
                return _plural(int(step.group(1)), "minute")
            if minute.isdigit():
                return f"every hour at :{int(minute):02d}"
            return None
        hour_step = re.fullmatch(r"\*/(\d+)", hour)
        if every_day and hour_step and minute.isdigit() and 24 % int(hour_step.group(1)) == 0:
            return f"{_plural(int(hour_step.group(1)), 'hour')} at :{int(minute):02d}"
        if not (re.fullmatch(r"\d+(,\d+)*", minute) and re.fullmatch(r"\d+(,\d+)*", hour)):
            return None
        times = [f"{h:02d}:{m:02d}" for h in fields.hours for m in fields.minutes]
        if len(times) > 4:
            return None
        at = "at " + ", ".join(times)
        if every_day:
            return f"{at} every day"
        if dom == "*" and month == "*" and re.fullmatch(r"[\w-]+(,[\w-]+)*", dow):
            names = re.sub(
                r"\d",
                lambda match: _DOW_SHORT[int(match.group(0))],
                dow,
            )
            names = re.sub(r"[A-Za-z]{3}", lambda match: match.group(0).title(), names)
            return f"{at} on {names}"
        if dow == "*" and month == "*" and re.fullmatch(r"\d+(,\d+)*", dom):
            days = "day" if dom.isdigit() else "days"
            return f"{at} on {days} {dom} of the month"
        return None
