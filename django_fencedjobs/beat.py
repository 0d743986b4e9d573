"""Moving from django-celery-beat: ``manage.py importbeat`` maps each ``PeriodicTask`` row
(:func:`import_rows`) to an instance of a job declared with ``@job(instances=True)``: its task
to a job, its name to a key (:func:`assign_keys`), its crontab to a cron expression in its zone
(:func:`cron_of`) or its interval to ``every``, its ``kwargs`` to the handler's. A row that
cannot be mapped, or that the system checks refuse, is one line saying why. Rows are written
through :meth:`Instances.upsert <django_fencedjobs.instances.Instances.upsert>`, one
transaction each. django-celery-beat and celery are imported only when the command runs: the
package does not depend on them. docs/celery-beat.md is the users' page.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import json
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.apps import apps
from django.core.exceptions import ValidationError
from django.db import DatabaseError, router, transaction

from django_fencedjobs import clock, db, preflight
from django_fencedjobs.exceptions import FencedJobsError, UnknownJob
from django_fencedjobs.instances import Instances, declared
from django_fencedjobs.instants import format_instant
from django_fencedjobs.listing import format_duration
from django_fencedjobs.models import JobInstance, JobLease
from django_fencedjobs.registry import Job, registry
from django_fencedjobs.text import one_line

__all__ = [
    "ACTIONS",
    "BadMap",
    "BeatUnavailable",
    "Row",
    "assign_keys",
    "cron_of",
    "import_rows",
    "parse_maps",
    "slug",
    "summary",
]

APP = "django_celery_beat"
#: What a row becomes, in the order the summary counts them.
ACTIONS = ("create", "change", "unchanged", "skip")

#: The longest key, and the longest instance name ``job[key]`` (its lease row's name).
KEY_MAX = JobInstance._meta.get_field("key").max_length or 100
NAME_MAX = JobLease._meta.get_field("name").max_length or 200
_NOT_KEY = re.compile(r"[^A-Za-z0-9_.:@/+-]+")
#: A crontab field that cron and celery read alike: ``*``, numbers and ascending ranges,
#: each with an optional step, separated by commas (celery also takes names, full or cut to
#: three letters, and ranges that wrap, ``fri-mon``: those are written out as numbers).
_SHARED_PART = re.compile(r"(\*|(\d+)(?:-(\d+))?)(/\d+)?")
#: celery's crontab fields: (the row's field, the largest value + 1 - smallest, smallest).
_CRONTAB_FIELDS = (
    ("minute", 60, 0),
    ("hour", 24, 0),
    ("day_of_month", 31, 1),
    ("month_of_year", 12, 1),
    ("day_of_week", 7, 0),
)
#: Options of a row that only mean something to celery's message broker.
_BROKER_OPTIONS = ("queue", "exchange", "routing_key", "priority")


class BeatUnavailable(FencedJobsError):
    """django-celery-beat's tables cannot be read: add "django_celery_beat" to INSTALLED_APPS
    (pip install django-celery-beat) and run `manage.py migrate`."""


class BadMap(FencedJobsError, ValueError):
    """A --map entry cannot be used: write TASK=JOB, JOB declared with @job(instances=True)."""


class Unmappable(Exception):
    """Why one row cannot be imported (its message)."""


@dataclass(frozen=True)
class Row:
    """What one ``PeriodicTask`` row becomes (one of :data:`ACTIONS`), and the line saying so."""

    action: str
    name: str
    line: str


@dataclass(frozen=True)
class Target:
    """The instance a row maps to."""

    job: str
    key: str
    cron: str
    every: timedelta | None
    timezone: str
    enabled: bool
    kwargs: dict[str, Any]


def periodic_tasks() -> Any:
    """django-celery-beat's ``PeriodicTask`` model; :class:`BeatUnavailable` when the app is
    not installed or its tables are missing."""
    if not apps.is_installed(APP):
        raise BeatUnavailable(
            "django-celery-beat is not installed: add 'django_celery_beat' to INSTALLED_APPS "
            "(pip install django-celery-beat), with the database its rows are in"
        )
    config = apps.get_app_config(APP)
    model = config.get_model("PeriodicTask")
    alias = router.db_for_read(model)
    missing = sorted(preflight.missing_tables(alias, config.get_models()))
    if missing:
        raise BeatUnavailable(
            f"django-celery-beat's tables are missing from the database {alias!r} "
            f"({', '.join(missing)}): run `manage.py migrate django_celery_beat`"
        )
    return model


def parse_maps(entries: Iterable[str]) -> dict[str, str]:
    """``{task: job}`` from ``--map TASK=JOB`` entries, or :class:`BadMap`."""
    maps: dict[str, str] = {}
    for entry in entries:
        task, sep, job = (part.strip() for part in entry.partition("="))
        if not (sep and task and job):
            raise BadMap(f"--map {entry!r}: write TASK=JOB, e.g. app.tasks.send_digest=send_digest")
        if maps.get(task, job) != job:
            raise BadMap(f"--map: task {task!r} is mapped twice ({maps[task]!r} and {job!r})")
        try:
            declared(job)
        except UnknownJob as exc:
            raise BadMap(f"--map {entry}: {exc}") from None
        maps[task] = job
    return maps


def job_for(task: str, maps: dict[str, str]) -> Job | str:
    """The job declared with ``instances=True`` that the celery task ``task`` maps to, or
    why there is none."""
    name = maps.get(task, task)
    if name not in registry:
        return (
            f"task {task} has no job: declare one with @job(instances=True, name={task!r}), "
            f"or map it to one with --map {task}=JOB"
        )
    job = registry.get(name)
    if not job.instances:
        return (
            f"job {name!r} has a schedule in code, not instances=True: map the task to a job "
            f"declared with @job(instances=True) with --map {task}=JOB"
        )
    return job


def slug(name: str, limit: int = KEY_MAX) -> str:
    """``name`` in a key's characters (letters, digits and ``_ . : @ / + -``): accents
    dropped, every run of other characters one ``-``, at most ``limit`` characters."""
    text = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    text = _NOT_KEY.sub("-", text).strip("-")[:limit].rstrip("-")
    return text or "task"


def assign_keys(rows: Iterable[tuple[int, str, str]]) -> dict[int, str]:
    """A key for each ``(pk, name, job)`` row, unique within its job, the same on every run:
    the name slugged. Of two names with one slug, the one already a valid key, else the
    smaller pk, keeps it; the other gets ``-<its pk>`` added."""
    taken: dict[str, set[str]] = {}
    keys: dict[int, str] = {}
    for pk, name, job in sorted(rows, key=lambda row: (slug(row[1]) != row[1], row[0])):
        limit = min(KEY_MAX, NAME_MAX - len(job) - 2)
        used = taken.setdefault(job, set())
        key, n = slug(name, limit), 1
        while key in used:
            suffix = f"-{pk}" if n == 1 else f"-{pk}-{n}"
            key, n = slug(name, limit - len(suffix)) + suffix, n + 1
        used.add(key)
        keys[pk] = key
    return keys


def cron_of(minute: str, hour: str, day_of_month: str, month_of_year: str, day_of_week: str) -> str:
    """The cron expression that fires when celery's crontab with these fields does.

    Each field is read by celery's own parser: ``*`` when it covers the whole range, as
    written when cron reads it alike, else the numbers celery reads (names, wrapping ranges;
    weekdays 0-6 from Sunday, as cron, but 7 refused). :class:`Unmappable` for a field celery
    cannot read, and when both day fields are restricted: celery then fires on the days that
    match both, cron on those that match either.
    """
    texts = (minute, hour, day_of_month, month_of_year, day_of_week)
    fields = [
        _cron_field(what, text, size, low)
        for (what, size, low), text in zip(_CRONTAB_FIELDS, texts, strict=True)
    ]
    if not fields[2].startswith("*") and not fields[4].startswith("*"):
        raise Unmappable(
            f"day_of_month {day_of_month!r} and day_of_week {day_of_week!r} are both "
            "restricted: celery fires on the days that match both, cron on the days that match "
            "either (a first Monday is cron's 1#1): create this instance by hand"
        )
    return " ".join(fields)


def _cron_field(what: str, text: str, size: int, low: int) -> str:
    spec = "".join(str(text).split()) or "*"
    schedules = importlib.import_module("celery.schedules")
    try:
        values = set(schedules.crontab_parser(size, low).parse(spec))
    except (ValueError, schedules.ParseException) as exc:
        hint = " (celery numbers weekdays 0-6, Sunday 0)" if what == "day_of_week" else ""
        raise Unmappable(
            f"crontab {what} {text!r}: celery cannot read it ({one_line(exc)}){hint}, so "
            "celery-beat never ran this row: correct it and import again"
        ) from None
    if values == set(range(low, low + size)):
        return "*"
    if _reads_alike(spec):
        return spec
    return _compact(sorted(values))


def _reads_alike(spec: str) -> bool:
    for part in spec.split(","):
        match = _SHARED_PART.fullmatch(part)
        if match is None or (match[3] is not None and int(match[3]) < int(match[2])):
            return False
    return True


def _compact(values: list[int]) -> str:
    """Ascending numbers as cron writes them: ``1-5,7,9``."""
    consecutive = itertools.groupby(enumerate(values), lambda pair: pair[1] - pair[0])
    runs = [[value for _, value in run] for _, run in consecutive]
    return ",".join(
        f"{run[0]}-{run[-1]}" if len(run) > 2 else ",".join(map(str, run)) for run in runs
    )


def _schedule(row: Any) -> tuple[str, timedelta | None, str]:
    """``(cron, every, timezone)`` of a row's schedule, or :class:`Unmappable`."""
    if row.crontab_id is not None:
        tab = row.crontab
        cron = cron_of(tab.minute, tab.hour, tab.day_of_month, tab.month_of_year, tab.day_of_week)
        return cron, None, getattr(tab.timezone, "key", None) or str(tab.timezone)
    if row.interval_id is not None:
        period, count = row.interval.period, row.interval.every
        try:
            return "", timedelta(**{period: count}), "UTC"
        except TypeError:
            raise Unmappable(f"interval period {period!r} is not one of celery's") from None
    if row.solar_id is not None:
        solar = row.solar
        raise Unmappable(
            f"a solar schedule ({solar.event} at {float(solar.latitude):g}, "
            f"{float(solar.longitude):g}) moves "
            "every day, and cron fires at fixed wall times: create the instance by hand, at "
            "a fixed time in the place's zone"
        )
    if row.clocked_id is not None:
        at = format_instant(row.clocked.clocked_time, UTC)
        raise Unmappable(
            f"a clocked schedule runs once, at {at}, and an instance runs on every slot of "
            "its schedule: run it once by other means"
        )
    raise Unmappable("no schedule: none of crontab, interval, solar or clocked is set")


def _loaded(row: Any, field: str, default: str) -> Any:
    text = getattr(row, field) or default
    try:
        return json.loads(text)
    except ValueError:
        raise Unmappable(f"{field} {text!r} is not JSON") from None


def _kwargs(row: Any) -> dict[str, Any]:
    """The row's keyword arguments, or :class:`Unmappable` (positional ones included)."""
    args = _loaded(row, "args", "[]")
    if args:
        raise Unmappable(
            f"positional args {json.dumps(args)} have no keyword names: give the handler "
            "keyword arguments and map them (the row's kwargs), then import again"
        )
    kwargs = _loaded(row, "kwargs", "{}")
    if not isinstance(kwargs, dict):
        raise Unmappable(f"kwargs {row.kwargs!r} is not a JSON object")
    return kwargs


def _when_reasons(row: Any, now: datetime) -> list[str]:
    """Why a row's one-off run, end or start cannot be an instance's."""
    reasons = []
    if row.one_off and row.clocked_id is None:
        reasons.append(
            "one_off: celery-beat runs it once, then disables it; an instance runs on every "
            "slot of its schedule: run it once by other means"
        )
    if row.expires is not None:
        at = format_instant(row.expires, UTC)
        reasons.append(
            f"expired at {at}: celery-beat no longer runs it: delete the row, or clear "
            "expires to import it"
            if row.expires <= now
            else f"expires at {at}: an instance has no end date: clear expires to import it, "
            "and delete the instance then"
        )
    if row.start_time is not None and row.start_time > now:
        reasons.append(
            f"starts at {format_instant(row.start_time, UTC)}: an instance has no start date: "
            "import it then, or clear start_time to start it at once"
        )
    return reasons


def _ignored(row: Any) -> list[str]:
    """The row's options that only celery's broker reads: no meaning for a runner."""
    ignored = [
        f"{option} {getattr(row, option)!r}"
        for option in _BROKER_OPTIONS
        if getattr(row, option, None) not in (None, "")
    ]
    if (getattr(row, "headers", None) or "{}").strip() not in ("{}", ""):
        ignored.append("headers")
    if getattr(row, "expire_seconds", None):
        ignored.append(f"expire_seconds {row.expire_seconds} (a job's starting_deadline, in code)")
    return ignored


def _target(row: Any, job: Job, key: str, now: datetime) -> Target:
    """The instance ``row`` maps to, or :class:`Unmappable` with every reason it cannot."""
    reasons: list[str] = []
    schedule: tuple[str, timedelta | None, str] = ("", None, "UTC")
    kwargs: dict[str, Any] = {}
    try:
        schedule = _schedule(row)
    except Unmappable as exc:
        reasons.append(str(exc))
    try:
        kwargs = _kwargs(row)
    except Unmappable as exc:
        reasons.append(str(exc))
    reasons += _when_reasons(row, now)
    if reasons:
        raise Unmappable("; ".join(reasons))
    cron, every, zone = schedule
    return Target(job.name, key, cron, every, zone, bool(row.enabled), kwargs)


def describe(instance: Target | JobInstance) -> str:
    """An instance's schedule and arguments on one line:
    ``cron "0 8 * * 1-5" Europe/Paris kwargs {"tenant_id": 42}``."""
    every = instance.every
    if every is not None:
        when = f"every {format_duration(every) if every.microseconds == 0 else every}"
    else:
        when = f'cron "{instance.cron}" {instance.timezone}'
    text = f"{when} kwargs {json.dumps(instance.kwargs, sort_keys=True, ensure_ascii=False)}"
    return text if instance.enabled else f"{text} disabled"


def _settle(target: Target, *, commit: bool) -> tuple[str, JobInstance | None]:
    """``("create" | "change" | "unchanged", the instance as it was)``, written when
    ``commit``; ``ValidationError`` with the system checks' message when refused."""
    instances = Instances(target.job)
    existing = instances.all().filter(key=target.key).first()
    values: dict[str, Any] = {
        "cron": target.cron,
        "every": target.every,
        "timezone": target.timezone,
        "enabled": target.enabled,
        "kwargs": target.kwargs,
        # celery has no jitter, timeout or grace: an instance's own (set in the admin since
        # an earlier import) are kept.
        "jitter": existing.jitter if existing is not None else timedelta(0),
        "timeout": existing.timeout if existing is not None else None,
        "grace": existing.grace if existing is not None else None,
    }
    candidate = JobInstance(job=target.job, key=target.key, **values)
    candidate.full_clean(validate_unique=False, validate_constraints=False)
    compared = ("cron", "every", "timezone", "enabled", "kwargs")
    if existing is not None and all(getattr(existing, f) == values[f] for f in compared):
        return "unchanged", existing
    if commit:
        instances.upsert(target.key, **values)
    return ("change" if existing is not None else "create"), existing


def import_row(row: Any, job: Job | str, key: str, *, commit: bool, now: datetime) -> Row:
    """What ``row`` becomes (``job``: its job, or why it has none), written when ``commit``,
    in a transaction of its own."""
    name = row.name
    try:
        if isinstance(job, str):
            raise Unmappable(job)
        target = _target(row, job, key, now)
        atomic = transaction.atomic(using=db.lease_db()) if commit else contextlib.nullcontext()
        with atomic:
            action, was = _settle(target, commit=commit)
    except Unmappable as exc:
        return _skip(name, str(exc))
    except ValidationError as exc:
        return _skip(name, "refused by the system checks: " + "; ".join(exc.messages))
    except DatabaseError as exc:
        return _skip(name, f"could not be written: {one_line(exc)}")
    return Row(action, name, _line(action, target, was, row))


def _skip(name: str, why: str) -> Row:
    return Row("skip", name, f"skip {json.dumps(name, ensure_ascii=False)}: {why}")


def _line(action: str, target: Target, was: JobInstance | None, row: Any) -> str:
    line = f"{action} {target.job}[{target.key}]"
    if action != "unchanged":
        line += f": {describe(target)}"
    if action == "change" and was is not None:
        line += f" (was: {describe(was)})"
    if target.key != row.name:
        line += f" from {json.dumps(row.name, ensure_ascii=False)}"
    ignored = _ignored(row)
    if ignored and action != "unchanged":
        line += f" (ignored: {', '.join(ignored)})"
    return line


def import_rows(maps: dict[str, str], *, commit: bool) -> Iterator[Row]:
    """Every ``PeriodicTask`` row, in the order of its pk, as a :class:`Row`: written when
    ``commit``, each row in a transaction of its own, so one bad row never blocks the
    others. :class:`BeatUnavailable` when django-celery-beat's tables cannot be read."""
    model = periodic_tasks()
    manager = model._default_manager
    tasks = list(manager.order_by("pk").values_list("pk", "name", "task"))
    if not tasks:
        return
    jobs = {pk: job_for(task, maps) for pk, _, task in tasks}
    keys = assign_keys(
        (pk, name, job.name) for pk, name, _ in tasks if isinstance(job := jobs[pk], Job)
    )
    now = clock.now()
    rows = manager.filter(pk__lte=tasks[-1][0]).order_by("pk")
    rows = rows.select_related("crontab", "interval", "solar", "clocked")
    for row in rows.iterator(chunk_size=500):
        job = jobs.get(row.pk) or job_for(row.task, maps)  # a row added since: no key yet
        yield import_row(row, job, keys.get(row.pk, slug(row.name)), commit=commit, now=now)


def summary(counts: Counter[str], *, commit: bool) -> str:
    """The last line: how many rows became what."""
    total = sum(counts.values())
    if not total:
        return "No periodic tasks in django-celery-beat's table: nothing to import."
    if commit:
        done = ("created", "changed", "unchanged", "not imported")
        tail = ""
    else:
        done = ("to create", "to change", "unchanged", "not importable")
        tail = "; a dry run, nothing was written: --commit writes"
    parts = ", ".join(
        f"{counts[action]} {word}" for action, word in zip(ACTIONS, done, strict=True)
    )
    noun = "periodic task" if total == 1 else "periodic tasks"
    return f"{total} {noun}: {parts}{tail}"
