"""Schedules and jobs in words: :func:`describe_schedule` (the admin, ``checkjobs``) and
:func:`describe_jobs` (``runjobs --list``). Only a schedule's public surface is read, and
Django is not imported at module level: :func:`describe_schedule` works without settings."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django_fencedjobs.instants import format_with_utc

if TYPE_CHECKING:
    from django_fencedjobs.registry import Job
    from django_fencedjobs.schedule import Schedule

_DOW_SHORT = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
_WEEKDAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
_WEEKDAY_NUMBERS = {name[:3].upper(): number for number, name in enumerate(_WEEKDAYS)}
_NTH = {1: "first", 2: "second", 3: "third", 4: "fourth", 5: "fifth"}


def describe_schedule(schedule: Schedule) -> str:
    """Human words, always with the zone and the jitter when there is one:
    ``"at 09:00 on Mon-Fri (Europe/Berlin), jitter 3m"``,
    ``"at 17:00 on the last Friday of the month (UTC)"``. An expression with no
    simpler reading is quoted: ``"cron '0 9 * 1 *' (UTC)"``."""
    if schedule.every is not None:
        words = _interval_words(schedule.every)
    else:  # a Schedule has one or the other
        words = _cron_words(str(schedule.crontab)) or f"cron {schedule.cron!r}"
    words += f" ({schedule.timezone})"
    if schedule.jitter > timedelta(0):
        words += f", jitter {format_duration(schedule.jitter)}"
    return words


def format_duration(delta: timedelta) -> str:
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


def _plural(count: int, unit: str) -> str:
    return f"every {unit}" if count == 1 else f"every {count} {unit}s"


def _interval_words(every: timedelta) -> str:
    seconds = int(every.total_seconds())
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds % size == 0:
            return _plural(seconds // size, unit)
    if seconds > 60:
        return f"every {format_duration(every)}"
    return _plural(seconds, "second")


def _cron_words(crontab: str) -> str | None:
    """Words for a valid five-field expression, or None when there is no short reading."""
    minute, hour, dom, month, dow = crontab.split()
    every_day = dom == "*" and month == "*" and dow == "*"
    if every_day and (hour == "*" or re.fullmatch(r"\*/\d+", hour)):
        return _within_a_day(minute, hour)
    times = _times(minute, hour)
    if times is None:
        return None
    if every_day:
        return f"{times} every day"
    days = _days(dom, month, dow)
    return None if days is None else f"{times} on {days}"


def _within_a_day(minute: str, hour: str) -> str | None:
    """Every (n) minute(s) or hour(s) (``*`` or ``*/n`` hours, every day) when n divides the
    hour or the day; else None."""
    if hour != "*":
        hours = int(hour[2:])
        if minute.isdigit() and 24 % hours == 0:
            return f"{_plural(hours, 'hour')} at :{int(minute):02d}"
        return None
    if minute == "*":
        return "every minute"
    step = re.fullmatch(r"\*/(\d+)", minute)
    if step and 60 % int(step.group(1)) == 0:
        return _plural(int(step.group(1)), "minute")
    if minute.isdigit():
        return f"every hour at :{int(minute):02d}"
    return None


def _times(minute: str, hour: str) -> str | None:
    """``at 09:00, 17:00``: at most four times of day, from lists of numbers; else None."""
    if not (re.fullmatch(r"\d+(,\d+)*", minute) and re.fullmatch(r"\d+(,\d+)*", hour)):
        return None
    times = [f"{h:02d}:{m:02d}" for h in _numbers(hour) for m in _numbers(minute)]
    return None if len(times) > 4 else "at " + ", ".join(times)


def _days(dom: str, month: str, dow: str) -> str | None:
    """The days of an expression restricted by day of month or of week (in every month):
    ``Mon-Fri``, ``the second Monday of the month``, ``day 1 of the month``; else None."""
    if month != "*" or (dom != "*" and dow != "*"):
        return None
    days = _weekdays_of_the_month(dow) if dom == "*" else _days_of_the_month(dom)
    if days is not None:
        return f"{days} of the month"
    if dom == "*" and re.fullmatch(r"[\w-]+(,[\w-]+)*", dow) and "L" not in dow.upper():
        names = re.sub(r"\d", lambda match: _DOW_SHORT[int(match.group(0))], dow)
        return re.sub(r"[A-Za-z]{3}", lambda match: match.group(0).title(), names)
    return None


def _numbers(field: str) -> list[int]:
    return sorted({int(value) for value in field.split(",")})


def _and(phrases: list[str]) -> str:
    return phrases[0] if len(phrases) == 1 else f"{', '.join(phrases[:-1])} and {phrases[-1]}"


def _ordinal(number: int) -> str:
    """1st, 2nd, 3rd, 4th ... 11th, 12th, 13th ... 21st, 22nd, 23rd ... 31st."""
    suffix = "th" if 11 <= number % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10)
    return f"{number}{suffix or 'th'}"


def _days_of_the_month(dom: str) -> str | None:
    """``day 1``, ``days 1,15``, ``the last day``, ``the weekday nearest the 15th`` ...
    joined with "and"; None for ranges and steps."""
    terms = dom.upper().split(",")
    plain = [term for term in terms if term.isdigit()]
    phrases = [f"{'day' if len(plain) == 1 else 'days'} {','.join(plain)}"] if plain else []
    for term in terms:
        if term == "L":
            phrases.append("the last day")
        elif term == "LW":
            phrases.append("the last weekday")
        elif re.fullmatch(r"\d+W", term):
            phrases.append(f"the weekday nearest the {_ordinal(int(term[:-1]))}")
        elif not term.isdigit():
            return None
    return _and(phrases)


def _weekdays_of_the_month(dow: str) -> str | None:
    """``the second Monday``, ``the last Friday`` ... joined with "and"; None unless every
    term of the day-of-week field is a d#n or a dL."""
    phrases = []
    for term in dow.upper().split(","):
        nth = re.fullmatch(r"(\w+)#(\d)", term)
        last = re.fullmatch(r"(\w+)L", term)
        if nth:
            phrases.append(f"the {_NTH[int(nth.group(2))]} {_weekday(nth.group(1))}")
        elif last:
            phrases.append(f"the last {_weekday(last.group(1))}")
        else:
            return None
    return _and(phrases)


def _weekday(text: str) -> str:
    return _WEEKDAYS[int(text) % 7 if text.isdigit() else _WEEKDAY_NUMBERS[text]]


def _verdict(job: Job, at: datetime) -> tuple[str, str] | None:
    """What the calendars of ``job`` make of a slot at ``at`` (:mod:`.calendars`)."""
    if not job.exclude:
        return None
    from django.db import DatabaseError

    from django_fencedjobs import calendars

    try:
        verdict = calendars.judge(calendars.load(job.exclude), job, at)
        return None if verdict is None else (verdict.outcome, verdict.why)
    except DatabaseError as exc:
        return "unknown", f"its calendars could not be read: {exc}"


def describe_jobs(jobs: Sequence[Job], *, count: int = 3) -> str:
    """Each job, its schedule, and its next ``count`` fire times in its zone and in UTC."""
    from django_fencedjobs import clock  # Django: only when jobs are listed

    if not jobs:
        return "No jobs are registered. Declare them with @job in an installed app's jobs.py."
    now = clock.system_now()
    lines: list[str] = []
    for job in jobs:
        lines.append(job.name)
        if not job.valid:
            lines.append(f"  INVALID: {job.schedule_error}")
            continue
        if job.instances:
            lines.append("  schedule: its instances' (the admin's Instances, or .instances)")
            continue
        schedule = job.valid_schedule
        lines.append(f"  schedule: {describe_schedule(schedule)}")
        lines.append(
            f"  timeout {job.run_timeout}, lease {job.lease_ttl}, max_batches {job.max_batches}, "
            f"grace {job.grace}, exclusion {job.exclusion}"
        )
        if job.exclude:
            lines.append(f"  avoids the calendars: {', '.join(job.exclude)}")
        when = now
        for _ in range(count):
            when = schedule.next_after(when)
            verdict = _verdict(job, when)
            note = f" ({verdict[0]}: {verdict[1]})" if verdict else ""
            lines.append(f"  next: {format_with_utc(when, schedule.tz)}{note}")
    return "\n".join(lines)
