"""System checks: configuration mistakes surface at ``manage.py check``, never as a surprise
at 3 a.m. Every id, what it reports and how to fix it: docs/checks.md. A job's problems are
found by :mod:`registry` (:attr:`~django_fencedjobs.registry.Job.check_id`) and worded here;
an invalid job is an error for ``manage.py check`` and a warning for any other command (a
typo in one job must not block a migration), the installation's problems errors everywhere.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.apps import AppConfig, apps
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, router

from django_fencedjobs.checkids import CheckId
from django_fencedjobs.instants import format_instant
from django_fencedjobs.registry import Job, registry

#: What to do about each kind of invalid job, by check id.
_HINTS = {
    CheckId.ZONE: "Use a name from zoneinfo.available_timezones(), such as "
    "'America/New_York'; on hosts without a zone database install 'tzdata'.",
    CheckId.FIXED_OFFSET: "Use a named IANA zone such as 'Europe/Berlin'.",
    CheckId.TIMEOUT: "Lower timeout, or schedule the job less often.",
    CheckId.JITTER: "Use a jitter well below the interval (a few minutes for hourly jobs).",
    CheckId.LEASE_TTL: "A lease of a minute or two is typical: it only decides how "
    "soon a crashed run's job can be taken over.",
    CheckId.ADVISORY: "Use the default exclusion='lease', which works on every database.",
    CheckId.DUPLICATE: "Give one of them another name with @job(..., name=...).",
    CheckId.HANDLER_KIND: "Write a plain 'def handler(run):'; to call async code "
    "from it, use asgiref.sync.async_to_sync.",
    CheckId.HANDLER_SIGNATURE: "The runner calls handler(run): take the Run as the one "
    "positional argument, and give other arguments defaults or bind them with "
    "functools.partial.",
    CheckId.ARGUMENT: "Durations are datetime.timedelta objects (timeout="
    "timedelta(minutes=5), not 300), counts are positive ints; see docs/api.md.",
    CheckId.TASK_PATH: "Key FENCEDJOBS['TASK_SCHEDULE'] by the dotted path of a function "
    "decorated with @task, as the task's module_path reads (docs/tasks.md).",
}
_SEE_DOCS = "See docs/checks.md."
_UNTIL_FIXED = "Until then this job does not run; the other jobs do."

#: E001's hint, by what the message says is wrong (the first match wins).
_CRON_HINTS = {
    ("needs a schedule", "got neither", "not both"): "Give exactly one schedule: a cron "
    "expression as @job's first argument, or every=timedelta(...).",
    ("every=",): "Pass every=timedelta(...) of a whole number of seconds, at least one, e.g. "
    "every=timedelta(minutes=5).",
    ("is outside", "is not a number between"): "Keep each field in its range: minute 0-59, "
    "hour 0-23, day-of-month 1-31, month 1-12 or jan-dec, day-of-week 0-7 or sun-sat (0 and 7 "
    "are Sunday).",
    ("never fires",): "Pick a day that exists in the chosen months, e.g. '0 0 28 2 *' rather "
    "than '0 0 30 2 *'.",
    ("alias", "@reboot"): "Use a 5-field expression or one of @hourly, @daily, @weekly, "
    "@monthly, @yearly.",
    ("is allowed only in", "take a single day", "the number after #"): "L and W go in the "
    "day-of-month field (L: the last day, LW: the last weekday, 15W: the weekday nearest the "
    "15th), L and # in the day-of-week field (5L: the last Friday, 1#2: the second Monday, 1 "
    "to 5 after #), each after a single day: list several with commas.",
    ("non-standard", "empty list item", "the step", "is reversed"): "In each field use *, a "
    "number, a range a-b, a list a,b or a step */n or a-b/n.",
}
_FIVE_FIELDS = (
    "Write five fields: minute hour day-of-month month day-of-week, e.g. '*/15 * * * *', "
    "or pass every=timedelta(...)."
)

_reported_by_caller: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "fencedjobs_invalid_jobs_reported_by_caller", default=False
)


@contextlib.contextmanager
def invalid_jobs_reported_separately() -> Iterator[None]:
    """Leave the jobs out of the system checks run inside the block: ``runjobs`` reports
    each invalid job itself, in one line."""
    token = _reported_by_caller.set(True)
    try:
        yield
    finally:
        _reported_by_caller.reset(token)


def _hint(job: Job) -> str:
    if job.check_id == CheckId.CRON:
        text = str(job.schedule_error)
        hint = next(
            (hint for needles, hint in _CRON_HINTS.items() if any(n in text for n in needles)),
            _FIVE_FIELDS,
        )
    else:
        hint = _HINTS.get(job.check_id, _SEE_DOCS) if job.check_id else _SEE_DOCS
    return f"{hint} {_UNTIL_FIXED}"


def _run_by_a_command_other_than_check() -> bool:
    """Whether a management command other than ``check`` is running the checks: Django tells
    a check function nothing about who runs it, so the innermost management command on the
    call stack decides (none: a direct ``run_checks()``, which gets errors as ``check`` does).
    """
    from django.core.management.base import BaseCommand
    from django.core.management.commands.check import Command as CheckCommand

    frame = inspect.currentframe()
    try:
        while frame is not None:
            command = frame.f_locals.get("self")
            if isinstance(command, BaseCommand):
                return not isinstance(command, CheckCommand)
            frame = frame.f_back
        return False
    finally:
        del frame


@checks.register("fencedjobs")
def check_jobs(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    if _reported_by_caller.get():
        return []
    level = checks.WARNING if _run_by_a_command_other_than_check() else checks.ERROR
    messages = [
        checks.CheckMessage(
            level, str(job.schedule_error), hint=_hint(job), obj=job.name, id=job.check_id
        )
        for job in registry.all()
        if not job.valid
    ]
    messages.extend(_stampede_warning([job for job in registry.all() if job.schedule is not None]))
    return messages


#: W001: this many jobs or more, none with jitter, firing at one instant are a stampede.
STAMPEDE_JOBS = 10
#: How far ahead W001 looks for such an instant: a week, to see weekly schedules.
STAMPEDE_HORIZON = timedelta(days=7)
#: Interval schedules finer than this are matched by arithmetic, not listed (every=1s).
_LISTED_EVERY = timedelta(minutes=1)
#: Job names W001's hint lists, at most.
_NAMES_SHOWN = 5


def _stampede_warning(jobs: Sequence[Job]) -> list[checks.CheckMessage]:
    found = stampede(jobs, datetime.now(UTC))
    if found is None:
        return []
    instant, names = found
    shown = ", ".join(names[:_NAMES_SHOWN])
    if len(names) > _NAMES_SHOWN:
        shown += f" and {len(names) - _NAMES_SHOWN} more"
    return [
        checks.Warning(
            f"{len(names)} jobs without jitter start at the same instant, "
            f"{format_instant(instant, UTC)}: a stampede ({STAMPEDE_JOBS} or more jobs at "
            f"one instant within the next {STAMPEDE_HORIZON.days} days, none jittered).",
            hint=f"Give them jitter=timedelta(minutes=...) (each job gets a stable offset of "
            f"its own), or spread their minutes: {shown}.",
            obj=f"{names[0]} and {len(names) - 1} more",
            id=CheckId.STAMPEDE,
        )
    ]


def stampede(jobs: Sequence[Job], now: datetime) -> tuple[datetime, list[str]] | None:
    """The instant in ``(now, now + STAMPEDE_HORIZON]`` at which the most jobs without
    jitter fire (the earliest of equals), and their names, when they are
    :data:`STAMPEDE_JOBS` or more; else None. That many jobs of one schedule count at its
    next fire time whatever the horizon. Jobs of one schedule are expanded once, at most a
    fire time a minute for a week: cheap for hundreds of jobs.
    """
    groups: dict[tuple[object, ...], list[Job]] = {}
    for job in jobs:
        schedule = job.schedule
        if schedule is None or schedule.jitter:
            continue
        key = (schedule.crontab, schedule.timezone) if schedule.cron else (schedule.every,)
        groups.setdefault(key, []).append(job)
    if sum(map(len, groups.values())) < STAMPEDE_JOBS:
        return None
    end = now + STAMPEDE_HORIZON
    counts: Counter[datetime] = Counter()
    fine: list[tuple[int, list[Job]]] = []  # (interval in microseconds, jobs)
    candidates: set[datetime] = set()
    best: tuple[int, datetime] | None = None
    for members in groups.values():
        schedule = members[0].valid_schedule
        if len(members) >= STAMPEDE_JOBS:
            first = schedule.next_after(now)
            best = _better(best, (len(members), first))
        if schedule.every is not None and schedule.every < _LISTED_EVERY:
            fine.append((schedule.every // _ONE_US, members))
            # Where only such schedules meet: among their fire times in the first hour.
            candidates.update(schedule.fire_times(now, now + timedelta(hours=1)))
            continue
        for instant in schedule.fire_times(now, end):
            counts[instant] += len(members)
    candidates.update(counts)
    for instant in candidates:
        since_epoch = (instant - _EPOCH) // _ONE_US
        count = counts[instant] + sum(len(m) for us, m in fine if since_epoch % us == 0)
        best = _better(best, (count, instant))
    if best is None or best[0] < STAMPEDE_JOBS:
        return None
    instant = best[1]
    names = sorted(
        job.name
        for members in groups.values()
        if members[0].valid_schedule.fire_times(instant - _ONE_US, instant)
        for job in members
    )
    return instant, names


def _better(
    best: tuple[int, datetime] | None, candidate: tuple[int, datetime]
) -> tuple[int, datetime]:
    """The larger count; of equal counts, the earlier instant."""
    if best is None or (candidate[0], -candidate[1].timestamp()) > (best[0], -best[1].timestamp()):
        return candidate
    return best


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)


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
            checks.Error(
                f"The fencedjobs tables are routed to {routed}; the fence can only guard writes "
                f"made in the same transaction, on the same database, as the lease.",
                hint=f"Route the 'fencedjobs' app to {DEFAULT_DB_ALIAS!r}, the database the jobs "
                "write to.",
                id=CheckId.ROUTING,
            )
        ]
    return []


@checks.register("fencedjobs")
def check_isolation(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """The lease database must run at READ COMMITTED: under a stricter level a fenced
    transaction that locks the lease row after the run's own renewal updated it fails with a
    serialization error, and so does an acquirer that loses a race (``runjobs`` also refuses
    a server whose default is stricter: :func:`db.isolation_problem`)."""
    from django_fencedjobs import db

    alias = db.lease_db()
    named = db.strict_isolation_option(alias)
    if named is None:
        return []
    return [
        checks.Error(
            f"DATABASES[{alias!r}]['OPTIONS']['isolation_level'] is {named}; the job "
            "leases need READ COMMITTED: under a stricter level a run's fenced transactions "
            "fail with serialization errors against its own lease renewals.",
            hint="Leave 'isolation_level' out (PostgreSQL's default, READ COMMITTED), or give "
            "the code that needs a stricter level a database alias of its own.",
            id=CheckId.ISOLATION,
        )
    ]


@checks.register("fencedjobs")
def check_transaction_pooler(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Behind a pooler in transaction mode (``FENCEDJOBS["TRANSACTION_POOLER"]``) each
    transaction may go to another server session. The app keeps nothing on a session, but
    Django's server-side cursors and server-side binding do: they fail at random there."""
    from django_fencedjobs import db
    from django_fencedjobs.conf import get_settings

    try:
        pooled = get_settings().TRANSACTION_POOLER
    except ImproperlyConfigured:
        return []  # E010/E014 report it
    alias = db.lease_db()
    wrong = db.session_bound_settings(alias) if pooled else []
    if not wrong:
        return []
    return [
        checks.Error(
            f"FENCEDJOBS['TRANSACTION_POOLER'] is True but in DATABASES[{alias!r}] "
            f"{' and '.join(wrong)}: server-side cursors and prepared statements belong to a "
            "server session, which a transaction pooler shares between clients.",
            hint="Set DATABASES[...]['DISABLE_SERVER_SIDE_CURSORS'] = True and leave "
            "'server_side_binding' out (see docs/deployment.md, Connection poolers).",
            id=CheckId.TRANSACTION_POOLER,
        )
    ]


@checks.register("fencedjobs")
def check_sqlite_transaction_mode(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """On SQLite the lease database must begin its transactions with the write lock
    (IMMEDIATE): under the default (DEFERRED) a transaction that reads before it writes fails
    at once with "database is locked" while another holds the lock, instead of waiting."""
    from django_fencedjobs import db

    alias = db.lease_db()
    lazy, mode = db.lazy_write_lock(alias)
    if not lazy:
        return []
    return [
        checks.Warning(
            f"DATABASES[{alias!r}] is SQLite "
            + (f"with transaction_mode {mode!r}" if mode else "without a transaction_mode")
            + ": "
            "runs that overlap (workers, runners, the admin) can fail with 'database is locked' "
            "instead of waiting for SQLite's one write lock.",
            hint=f'Add "OPTIONS": {{"transaction_mode": "IMMEDIATE", "timeout": 20}} to '
            f"DATABASES[{alias!r}] (see docs/configuration.md).",
            id=CheckId.SQLITE_TRANSACTION_MODE,
        )
    ]


@checks.register("fencedjobs")
def check_task_database(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """django-tasks-db's queue must live in the lease database for a run's enqueue to be
    part of its fenced transaction (exactly once); elsewhere it gets an outbox, as any other
    backend (effectively once)."""
    from django_fencedjobs.integrations import uses_tasks

    if not uses_tasks() or not apps.is_installed("django_tasks_db"):
        return []
    from django_tasks_db.models import DBTaskResult

    from django_fencedjobs.models import JobLease

    leases, queue = router.db_for_write(JobLease), router.db_for_write(DBTaskResult)
    if leases == queue:
        return []
    return [
        checks.Warning(
            f"django-tasks-db's queue is routed to database {queue!r}, the job leases to "
            f"{leases!r}: a run's tasks are handed over after its transaction commits (an "
            "outbox relayed until taken, effectively once), not enqueued inside it (exactly "
            "once).",
            hint="Route django_tasks_db to the database of the job leases (docs/tasks.md).",
            id=CheckId.TASK_DATABASE,
        )
    ]


@checks.register("fencedjobs")
def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    from django_fencedjobs import clock, conf

    hints = {
        CheckId.SETTINGS: "See docs/configuration.md for the keys and their defaults.",
        CheckId.SETTINGS_VALUE: "See docs/configuration.md for each key's type and range; "
        "leave a key out to get its default.",
    }
    found = conf.problems()
    if not found:
        try:
            clock.get_clock()
        except ImproperlyConfigured as exc:
            found = [(CheckId.SETTINGS, str(exc))]
    return [checks.Error(message, hint=hints[id], id=id) for id, message in found]


@checks.register(checks.Tags.database)
def check_calendars(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[checks.CheckMessage]:
    """E018, E019: the calendars each job and instance names exist, are valid, and leave it
    a slot to run in the year ahead. They are data, so this is a database check
    (``manage.py check --database default``; ``migrate`` runs it too, once migrated)."""
    if not databases:
        return []
    from django.db import DatabaseError

    from django_fencedjobs import calendars, clock, instances
    from django_fencedjobs.exceptions import UnknownJob
    from django_fencedjobs.models import JobInstance

    jobs = [job for job in registry.all() if job.exclude and job.schedule is not None]
    try:
        now = clock.now()
        for instance in JobInstance.objects.exclude(exclude=[]).order_by("job", "key"):
            with contextlib.suppress(UnknownJob):  # an instance of no job: checked elsewhere
                jobs.append(instances.instance_job(instances.declared(instance.job), instance))
        found: list[checks.CheckMessage] = []
        for job in jobs:
            if job.schedule is None or not job.exclude:
                continue
            problem = calendars.schedule_problem(job, now)
            if problem is not None:
                check_id, message = problem
                found.append(
                    checks.Error(
                        f"job {job.name!r}: {message}.",
                        hint="Create the calendar (admin, Calendars), fix its name in "
                        "exclude=, or let some slots run. Until then no slot of this job "
                        "runs: each is recorded failed, or excluded.",
                        id=check_id,
                    )
                )
        return found
    except DatabaseError:  # not migrated yet, or unreachable: migrate says so itself
        return []
