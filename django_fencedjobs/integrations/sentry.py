"""Sentry Crons: a check-in for every run, with the monitor configured from the job.

Active when ``sentry-sdk`` is initialised with a DSN and ``FENCEDJOBS["SENTRY"]`` is true
(the default); each check-in upserts its monitor (:func:`monitor_config`). A run starts
``in_progress`` and ends ``ok`` if it succeeded, else ``error``. A slot recorded ``missed``
sends nothing (Sentry marks it missed itself: an ``error`` would count the absence twice).
See docs/alerting.md, also for changes of state as events, and for instances.

A run that enqueued tasks is not ``ok`` until they have finished: if it succeeds with tasks
unfinished, the worker that finishes the last one closes the check-in, with the same id
(:func:`check_in_id`). Each side writes its own end first and then reads the other's, so
at least one of them closes it (both may, with the same id and status).
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import sys
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from django.db import DatabaseError
from django.db.models import Count, Max, Q
from django.dispatch import receiver

from django_fencedjobs import instances, signals
from django_fencedjobs.conf import get_settings
from django_fencedjobs.db import lease_db
from django_fencedjobs.models import UNFINISHED_TASK, JobRun, Outcome, RunKind, RunTask, TaskStatus
from django_fencedjobs.registry import Job

logger = logging.getLogger("django_fencedjobs")

#: Sentry's limit on a monitor slug.
MAX_SLUG = 50
#: The namespace of the check-in ids (:func:`check_in_id`); fixed, so that every process
#: and every version derives the same id for a run.
CHECK_IN_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "django-fencedjobs:sentry-check-in")

_UNITS = (
    ("week", timedelta(weeks=1)),
    ("day", timedelta(days=1)),
    ("hour", timedelta(hours=1)),
    ("minute", timedelta(minutes=1)),
)


def enabled() -> bool:
    if not get_settings().SENTRY:
        return False
    try:
        import sentry_sdk
    except ImportError:
        return False
    return bool(sentry_sdk.get_client().is_active())


def monitor_slug(name: str) -> str:
    """The job's name as a Sentry monitor slug: lowercase letters, digits, ``-`` and ``_``,
    at most 50 characters (a longer name is cut and suffixed with a hash, to stay unique)."""
    slug = re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-") or "job"
    if len(slug) > MAX_SLUG:
        digest = hashlib.blake2b(name.encode(), digest_size=4).hexdigest()
        slug = f"{slug[: MAX_SLUG - 9].rstrip('-')}-{digest}"
    return slug


def has_monitor(name: str, job: Job | None) -> bool:
    """Whether the runs of ``name`` send check-ins: a job declared in code, or an instance
    of a job declared with ``instance_series="each"``. ``job`` is None in a worker that does
    not declare it: then the job whose instance the name would be decides, if declared (else
    the check-in is sent without a config, which creates no monitor)."""
    if job is not None:
        return job.parent is None or job.instance_series == "each"
    base = instances.declaring(name)
    return base is None or not base.instances or base.instance_series == "each"


def check_in_id(record: JobRun) -> str:
    """The check-in id of a run: the same in every process that reports on it (its runner,
    and the worker that finishes its last task), from the run alone."""
    key = f"{record.job}\n{record.pk}\n{record.scheduled_for.isoformat()}"
    return uuid.uuid5(CHECK_IN_NAMESPACE, key).hex


def _minutes(delta: timedelta) -> int:
    return max(1, math.ceil(delta.total_seconds() / 60))


def monitor_config(job: Job) -> dict[str, Any]:
    """The monitor's config: the cron expression, or the interval in the largest whole unit
    (else in minutes, rounded up: Sentry's smallest); ``checkin_margin`` is grace + jitter,
    ``max_runtime`` the run timeout, ``failure_issue_threshold`` the job's threshold."""
    schedule = job.valid_schedule
    every = schedule.every
    config: dict[str, Any] = {"type": "crontab", "value": schedule.crontab}
    if every is not None:
        config = {"type": "interval", "value": _minutes(every), "unit": "minute"}
        for unit, size in _UNITS:
            if every >= size and every % size == timedelta(0):
                config.update(value=every // size, unit=unit)
                break
    return {
        "schedule": config,
        "timezone": schedule.timezone,
        "checkin_margin": _minutes(job.grace + schedule.jitter),
        "max_runtime": _minutes(job.run_timeout),
        "failure_issue_threshold": job.failure_threshold,
    }


@receiver(signals.run_started, dispatch_uid="django_fencedjobs.integrations.sentry.started")
def run_started(*, job: Job, record: JobRun, **kwargs: Any) -> None:
    if _checks_in(job, record) and enabled():
        _check_in(job, record, "in_progress")


@receiver(signals.run_finished, dispatch_uid="django_fencedjobs.integrations.sentry.finished")
def run_finished(*, job: Job, record: JobRun, **kwargs: Any) -> None:
    if record.outcome == Outcome.MISSED or not _checks_in(job, record) or not enabled():
        return
    duration = record.duration
    failed = record.outcome != Outcome.SUCCEEDED
    if not failed and (tasks := _tasks_of(record)) is not None:
        if tasks.unfinished:
            return  # the worker that finishes the run's last task closes it
        failed = tasks.failed > 0
        duration = _until(record, tasks.last_finished_at, duration)
    _check_in(job, record, "error" if failed else "ok", duration)


@receiver(signals.run_tasks_finished, dispatch_uid="django_fencedjobs.integrations.sentry.tasks")
def run_tasks_finished(*, job: Job | None, record: JobRun, failed: bool, **kwargs: Any) -> None:
    """The last task of a run finished (in a worker): close the run's check-in, if the run
    succeeded. A run still running is closed by its runner when it ends (its tasks have
    finished by then); one that did not succeed was closed ``error`` already."""
    if record.outcome != Outcome.SUCCEEDED or not _checks_in(job, record) or not enabled():
        return
    tasks = _tasks_of(record)
    last = tasks.last_finished_at if tasks is not None else None
    _check_in(job, record, "error" if failed else "ok", _until(record, last, None))


@receiver(signals.job_state_changed, dispatch_uid="django_fencedjobs.integrations.sentry.state")
def job_state_changed(*, transition: Any, **kwargs: Any) -> None:
    """A job's change of state (:mod:`django_fencedjobs.notify`) is an event: the verdict
    per-run check-ins cannot carry. One issue per job and state (its fingerprint); that of
    an instance without a monitor (:func:`has_monitor`) per declared job and state. The
    same change of many instances together is one event, as it is one mail."""
    if not enabled():
        return
    import sentry_sdk

    state, severity = transition.current
    level: Literal["error", "warning", "info"] = (
        "error" if severity == "critical" else "warning" if severity == "warning" else "info"
    )
    name: str = transition.name
    members: tuple[str, ...] = transition.members
    declared: Job | None = transition.health.job
    job, key, grouped = name, None, name
    if members:
        job = grouped = transition.parent
    # An instance (or a name that reads as one, its job no longer declared).
    elif (parsed := instances.parse_name(name)) and (declared is None or declared.parent):
        job, key = parsed
        if not has_monitor(name, declared):
            grouped = job
    with sentry_sdk.new_scope() as scope:
        scope.fingerprint = ["django-fencedjobs", grouped, state]
        scope.set_tag("fencedjobs.job", job)
        if members:
            scope.set_tag("fencedjobs.instances", len(members))
            scope.set_extra("instances", list(members))
        elif key is not None:
            scope.set_tag("fencedjobs.instance", key)
        scope.set_tag("fencedjobs.state", state)
        scope.set_tag("fencedjobs.severity", severity)
        scope.set_extra("reason", transition.health.reason)
        scope.set_extra("previous_state", transition.previous[0])
        sentry_sdk.capture_message(f"{transition.subject}: {transition.health.reason}", level=level)


def _checks_in(job: Job | None, record: JobRun) -> bool:
    """Whether ``record``'s run sends check-ins: a run of the schedule (a retry included) of
    a job with a monitor; a backfill or a one-off is no slot the monitor expects."""
    return record.kind == RunKind.SCHEDULED and has_monitor(record.job, job)


def _check_in(job: Job | None, record: JobRun, status: str, duration: float | None = None) -> None:
    from sentry_sdk.crons import capture_checkin

    capture_checkin(
        monitor_slug=monitor_slug(record.job),
        check_in_id=check_in_id(record),
        status=status,
        duration=duration,
        # A worker that does not declare the job sends no config: the monitor keeps its own.
        monitor_config=monitor_config(job) if job is not None else None,  # type: ignore[arg-type]
    )


@dataclass(frozen=True)
class _Tasks:
    unfinished: int
    failed: int
    last_finished_at: datetime | None


def _tasks_of(record: JobRun) -> _Tasks | None:
    """The run's tasks, counted; None when it enqueued none, or they cannot be read (then
    the run's own outcome closes its check-in, as for a run without tasks)."""
    if "django_fencedjobs.integrations.tasks" not in sys.modules:
        return None  # run.enqueue() imports it: no run of this process enqueued a task
    try:
        found = (
            RunTask.objects.using(lease_db())
            .filter(run_id=record.pk)
            .aggregate(
                total=Count("pk"),
                unfinished=Count("pk", filter=Q(status__in=UNFINISHED_TASK)),
                failed=Count("pk", filter=Q(status=TaskStatus.FAILED)),
                last_finished_at=Max("finished_at"),
            )
        )
    except DatabaseError:
        logger.warning("could not read the tasks of run %s", record.pk, exc_info=True)
        return None
    if not found["total"]:
        return None
    return _Tasks(found["unfinished"], found["failed"], found["last_finished_at"])


def _until(record: JobRun, last_task: datetime | None, default: float | None) -> float | None:
    """Seconds from the run's start to the end of the later of the run and its last task."""
    ends = [end for end in (record.finished_at, last_task) if end is not None]
    if record.started_at is None or not ends or record.outcome == Outcome.ABANDONED:
        return default
    return (max(ends) - record.started_at).total_seconds()
