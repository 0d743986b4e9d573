"""System checks: configuration mistakes surface at ``manage.py check`` (and every
``runserver``, ``migrate``, ``runjobs``), never as a surprise at 3 a.m.

=================  ==============================================================
id                 problem
=================  ==============================================================
fencedjobs.E001    the cron expression (or ``every=``) is invalid
fencedjobs.E002    the timezone is not a known IANA zone
fencedjobs.E003    the timezone is a fixed UTC offset
fencedjobs.E004    ``timeout`` is not shorter than the shortest interval between runs
fencedjobs.E005    ``jitter`` is not shorter than the shortest interval between runs
fencedjobs.E006    ``lease_ttl`` is not positive
fencedjobs.E007    ``exclusion="advisory"`` on a database other than PostgreSQL
fencedjobs.E008    two different functions declare the same job name
fencedjobs.E009    the app's tables are routed to different databases, or not to the
                   default database that the jobs write to
fencedjobs.E010    ``FENCEDJOBS`` has an unknown key or a ``CLOCK`` that cannot be imported
fencedjobs.W001    a schedule fires at minute 0 with no jitter (top-of-the-hour stampede)
=================  ==============================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.apps import AppConfig
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections, router

from django_fencedjobs.registry import Job, registry
from django_fencedjobs.schedule import is_fixed_offset, resolve_zone


def _error(id: int, msg: str, hint: str, job: Job | None = None) -> checks.CheckMessage:
    return checks.Error(msg, hint=hint, obj=job.name if job else None, id=f"fencedjobs.E{id:03d}")


@checks.register("fencedjobs")
def check_jobs(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    for job in registry.all():
        messages.extend(_check_job(job))
    for duplicate in registry.duplicates:
        original = registry.get(duplicate.name)
        messages.append(
            _error(
                8,
                f"Job name {duplicate.name!r} is declared twice: by "
                f"{_where(original)} and by {_where(duplicate)}.",
                "Give one of them another name with @job(..., name=...).",
                duplicate,
            )
        )
    return messages


def _where(job: Job) -> str:
    return f"{getattr(job.func, '__module__', '?')}.{getattr(job.func, '__qualname__', '?')}"


def _check_job(job: Job) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    if job.schedule is None:
        if is_fixed_offset(job.timezone):
            return [
                _error(
                    3,
                    str(job.schedule_error),
                    "Use a named IANA zone such as 'Europe/Berlin'.",
                    job,
                )
            ]
        try:
            resolve_zone(job.timezone)
        except Exception:
            return [
                _error(
                    2,
                    str(job.schedule_error),
                    "Use a name from zoneinfo.available_timezones(), such as 'America/New_York'.",
                    job,
                )
            ]
        return [
            _error(
                1,
                str(job.schedule_error),
                "Write five fields: minute hour day-of-month month day-of-week, "
                "e.g. '*/15 * * * *', or pass every=timedelta(...).",
                job,
            )
        ]
    interval = job.schedule.min_interval()
    if job.timeout is not None and job.timeout >= interval:
        messages.append(
            _error(
                4,
                f"Job {job.name!r}: timeout {job.timeout} is not shorter than the shortest "
                f"interval between its runs ({interval}); a slow run would overlap the next.",
                "Lower timeout, or schedule the job less often.",
                job,
            )
        )
    if job.jitter >= interval:
        messages.append(
            _error(
                5,
                f"Job {job.name!r}: jitter {job.jitter} is not shorter than the shortest "
                f"interval between its runs ({interval}); runs would swap order.",
                "Use a jitter well below the interval (a few minutes for hourly jobs).",
                job,
            )
        )
    if job.lease_ttl <= timedelta(0):
        messages.append(
            _error(
                6,
                f"Job {job.name!r}: lease_ttl must be positive, got {job.lease_ttl}.",
                "A lease of a minute or two is typical: it only decides how soon a crashed "
                "run's job can be taken over.",
                job,
            )
        )
    if job.exclusion == "advisory":
        from django_fencedjobs.models import JobLease

        vendor = connections[router.db_for_write(JobLease)].vendor
        if vendor != "postgresql":
            messages.append(
                _error(
                    7,
                    f"Job {job.name!r}: exclusion='advisory' needs PostgreSQL advisory locks; "
                    f"the database is {vendor}.",
                    "Use the default exclusion='lease', which works on every database.",
                    job,
                )
            )
    if job.schedule.crontab and job.schedule.crontab.split()[0] == "0" and not job.jitter:
        messages.append(
            checks.Warning(
                f"Job {job.name!r} fires at minute 0 with no jitter: every such job starts "
                "at the same second.",
                hint="Add jitter=timedelta(minutes=...) or pick another minute.",
                obj=job.name,
                id="fencedjobs.W001",
            )
        )
    return messages


@checks.register("fencedjobs")
def check_routing(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    from django_fencedjobs.models import JobLease, JobRun, Watermark

    aliases = {
        model.__name__: router.db_for_write(model) for model in (JobLease, JobRun, Watermark)
    }
    if len(set(aliases.values())) > 1 or aliases["JobLease"] != DEFAULT_DB_ALIAS:
        routed = ", ".join(f"{name} -> {alias!r}" for name, alias in aliases.items())
        return [
            _error(
                9,
                f"The fencedjobs tables are routed to {routed}; the fence can only guard writes "
                f"made in the same transaction, on the same database, as the lease.",
                f"Route the 'fencedjobs' app to {DEFAULT_DB_ALIAS!r}, the database the jobs "
                "write to.",
            )
        ]
    return []


@checks.register("fencedjobs")
def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    from django_fencedjobs import clock
    from django_fencedjobs.conf import get_settings

    try:
        get_settings()
        clock.get_clock()
    except (ImproperlyConfigured, ImportError) as exc:
        return [
            _error(
                10,
                f"FENCEDJOBS is invalid: {exc}",
                "See docs/configuration.md for the keys and their defaults.",
            )
        ]
    return []
