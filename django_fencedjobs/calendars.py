"""Calendars: the dates and windows a job's slots avoid (docs/schedules.md, "Calendars").

A calendar is data (:class:`~django_fencedjobs.models.Calendar` and its
:class:`~django_fencedjobs.models.CalendarExclusion` rows), edited in the admin or with the
ORM, and read fresh at each claim of a job that names it, so an edit takes effect at the
next slot. A country's public holidays come from the ``holidays`` package (the
``holidays`` extra) for each year as it is asked for: nothing to refresh.

A slot is excluded when any calendar the job names excludes its instant, read as a wall
clock in that calendar's own zone: a holiday in Berlin is a Berlin date whatever the job's
zone. The schedule is not changed: its slots are what cron says, DST included, and an
excluded one is recorded ``excluded``, naming the calendar and what excluded it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import TYPE_CHECKING, NamedTuple
from zoneinfo import ZoneInfo

from django_fencedjobs.checkids import CheckId
from django_fencedjobs.db import lease_db
from django_fencedjobs.exceptions import ScheduleError
from django_fencedjobs.instants import format_instant
from django_fencedjobs.models import Calendar, CalendarExclusion, Outcome
from django_fencedjobs.schedule import resolve_zone, wall_instant

if TYPE_CHECKING:
    from django_fencedjobs.registry import Job

#: How far ahead a job's slots are checked for one that some calendar leaves to run.
LOOKAHEAD = timedelta(days=366)
#: At most this many of those slots are looked at.
LOOKAHEAD_SLOTS = 20_000


@dataclass(frozen=True)
class Rule:
    """A :class:`CalendarExclusion` as matched: every field given must match."""

    label: str
    on_date: date | None = None
    month: int | None = None
    day: int | None = None
    weekday: int | None = None
    starts: time | None = None
    ends: time | None = None

    def matches(self, local: datetime) -> bool:
        """Whether the wall-clock instant ``local`` falls in this rule. A window that ends
        at or before it starts runs past midnight: its part after midnight belongs to the
        day it started on."""
        day = local.date()
        if self.starts is not None and self.ends is not None:
            clock = local.time().replace(tzinfo=None)
            if self.starts < self.ends:
                if not self.starts <= clock < self.ends:
                    return False
            elif clock >= self.starts:
                pass  # the window's first part, on its own day
            elif clock < self.ends:
                day -= timedelta(days=1)  # its part after midnight: the day it started on
            else:
                return False
        if self.on_date is not None and day != self.on_date:
            return False
        if self.month is not None and (day.month, day.day) != (self.month, self.day):
            return False
        return self.weekday is None or day.weekday() == self.weekday

    def window_end(self, local: datetime) -> datetime | None:
        """The naive wall time at which the window holding ``local`` (matched) ends; None
        for a rule of whole days."""
        if self.starts is None or self.ends is None:
            return None
        day = local.date()
        if self.ends <= self.starts and local.time().replace(tzinfo=None) >= self.starts:
            day += timedelta(days=1)  # before midnight, in a window that runs past it
        return datetime.combine(day, self.ends)


class Verdict(NamedTuple):
    """What the calendars make of a slot that does not run as scheduled: ``excluded``, or
    ``failed`` (a calendar missing or unreadable), and why; ``deferred_to``: the instant an
    excluded slot runs instead (``defer_excluded``)."""

    outcome: str
    why: str
    deferred_to: datetime | None = None


@dataclass(frozen=True)
class Book:
    """Calendars as one claim read them, by name (:func:`load`)."""

    #: None: a zone no longer known (written past ``clean()``).
    zones: dict[str, ZoneInfo | None]
    rules: dict[str, tuple[Rule, ...]]
    holidays: dict[str, tuple[str, str]]

    def verdict(self, names: Iterable[str], instant: datetime) -> Verdict | None:
        """Whether a slot at ``instant`` runs, by the calendars ``names``: None, or how it
        is recorded instead: ``excluded`` by the first that excludes it, saying why
        (``"calendar 'x': label"``); ``failed`` when one of them does not exist or its
        holidays cannot be read, so that a job never runs against a calendar nobody wrote,
        nor skips its slots unseen (``manage.py check`` says which, fencedjobs.E018)."""
        found = self._find(names, instant)
        return None if found is None else found[0]

    def next_allowed(
        self, names: Sequence[str], slot: datetime, tz: ZoneInfo, before: datetime
    ) -> datetime | None:
        """The first instant after the excluded ``slot`` that the calendars ``names`` allow,
        stepping past what excludes each: a window to its end, a whole day to ``slot``'s
        wall-clock time in ``tz`` on the next day. None when there is none before
        ``before`` (the schedule's next slot), or a calendar cannot be read."""
        time_of_day = slot.astimezone(tz).time().replace(tzinfo=None)
        at = slot
        for _ in range(LOOKAHEAD_SLOTS):  # each step moves forward; bounded all the same
            found = self._find(names, at)
            if found is None:
                return at
            verdict, ends = found
            if verdict.outcome != Outcome.EXCLUDED:
                return None
            if ends is None:
                ends = wall_instant(
                    datetime.combine(at.astimezone(tz).date() + timedelta(days=1), time_of_day),
                    tz,
                )
            at = ends
            if at >= before:
                return None
        return None

    def _find(
        self, names: Iterable[str], instant: datetime
    ) -> tuple[Verdict, datetime | None] | None:
        """:meth:`verdict`, and the instant the window that excludes ``instant`` ends (None:
        a whole day, or a failure)."""
        for name in names:
            if name not in self.zones:
                return Verdict(Outcome.FAILED, f"Not run: calendar {name!r} does not exist."), None
            zone = self.zones[name]
            if zone is None:
                why = f"Not run: calendar {name!r} has an unknown timezone."
                return Verdict(Outcome.FAILED, why), None
            local = instant.astimezone(zone)
            for rule in self.rules[name]:
                if rule.matches(local):
                    why = f"calendar {name!r}: {rule.label or 'excluded'}"
                    ends = rule.window_end(local)
                    return Verdict(Outcome.EXCLUDED, why), ends and wall_instant(ends, zone)
            country, subdivision = self.holidays[name]
            if not country:
                continue
            try:
                holiday = public_holidays(country, subdivision, local.year).get(local.date())
            except (ImportError, NotImplementedError) as exc:
                why = f"Not run: the holidays of calendar {name!r}: {exc}"
                return Verdict(Outcome.FAILED, why), None
            if holiday is not None:
                return Verdict(Outcome.EXCLUDED, f"calendar {name!r}: {holiday}"), None
        return None


def judge(
    book: Book, job: Job, slot: datetime, *, now: datetime | None = None, defer: bool = True
) -> Verdict | None:
    """What ``job``'s calendars (in ``book``) make of its ``slot``: None (it runs), or its
    :class:`Verdict`; with ``defer_excluded``, an excluded slot runs at the next time they
    allow before the schedule's next slot (:meth:`Book.next_allowed`), if there is one and
    that slot is not due already at ``now``. ``defer``: False for a slot that is never
    deferred (a backfill's)."""
    found = book.verdict(job.exclude, slot)
    schedule = job.parsed_schedule  # an invalid job's too: the instance preview shows it
    if found is None or found.outcome != Outcome.EXCLUDED or schedule is None:
        return found
    if not (job.defer_excluded and defer):
        return found
    before = schedule.next_after(slot)
    if now is not None and before <= now:
        return found._replace(why=f"{found.why}; not deferred: the next slot is due already")
    to = book.next_allowed(job.exclude, slot, schedule.tz, before)
    if to is None:
        return found._replace(why=f"{found.why}; nothing allowed before the next slot")
    return Verdict(found.outcome, f"{found.why}; deferred to {format_instant(to, schedule.tz)}", to)


def load(names: Iterable[str]) -> Book:
    """The calendars ``names`` as they are now: two queries, whatever their number."""
    wanted = sorted(set(names))
    calendars = list(
        Calendar.objects.using(lease_db())
        .filter(name__in=wanted)
        .values_list("pk", "name", "timezone", "holidays_country", "holidays_subdivision")
    )
    by_pk = {pk: name for pk, name, *_ in calendars}
    rules: dict[str, list[Rule]] = {name: [] for name in by_pk.values()}
    fields = ("label", "on_date", "month", "day", "weekday", "starts", "ends")
    for pk, *values in (
        CalendarExclusion.objects.using(lease_db())
        .filter(calendar_id__in=by_pk)
        .values_list("calendar_id", *fields)
    ):
        rules[by_pk[pk]].append(Rule(*values))
    return Book(
        zones={name: _zone(zone) for _, name, zone, *_ in calendars},
        rules={name: tuple(found) for name, found in rules.items()},
        holidays={name: (country, sub) for _, name, _, country, sub in calendars},
    )


def _zone(name: str) -> ZoneInfo | None:
    try:
        return resolve_zone(name)
    except ScheduleError:
        return None


@functools.lru_cache(maxsize=256)
def public_holidays(country: str, subdivision: str, year: int) -> dict[date, str]:
    """The public holidays of ``country`` (and its ``subdivision``) in ``year``, by date, as
    the ``holidays`` package knows them (several on one day: their names joined), named in
    English where it can."""
    import holidays  # the holidays extra; its absence is a check error (fencedjobs.E018)

    # Names in English whatever the host's locale, where the package has them (it does
    # for most countries); else in the country's own language.
    found = holidays.country_holidays(
        country, subdiv=subdivision or None, years=year, language="en_US"
    )
    return {day: "; ".join(found.get_list(day)) for day in found}


def schedule_problem(job: Job, now: datetime) -> tuple[CheckId, str] | None:
    """What is wrong with the calendars of ``job`` (its ``exclude``; a valid schedule), as a
    check says it: one does not exist or is invalid (E018), or they leave none of its slots
    in the year ahead to run, at its time or deferred (E019)."""
    names = job.exclude
    calendars = {c.name: c for c in Calendar.objects.using(lease_db()).filter(name__in=names)}
    missing = [name for name in names if name not in calendars]
    if missing:
        return CheckId.CALENDAR, f"calendar {', '.join(map(repr, missing))} does not exist"
    for calendar in calendars.values():
        problem = calendar.problem()
        if problem:
            return CheckId.CALENDAR, f"calendar {calendar.name!r}: {problem}"
    book = load(names)
    slots = job.valid_schedule.fire_times(now, now + LOOKAHEAD, limit=LOOKAHEAD_SLOTS)
    if slots and all(_never_runs(judge(book, job, slot)) for slot in slots):
        message = f"its calendars exclude every one of its next {len(slots)} slots"
        return CheckId.CALENDAR_EXCLUDES_ALL, message
    return None


def _never_runs(verdict: Verdict | None) -> bool:
    return verdict is not None and verdict.deferred_to is None


__all__ = [
    "Book",
    "Rule",
    "Verdict",
    "judge",
    "load",
    "public_holidays",
    "schedule_problem",
]
