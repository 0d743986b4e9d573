"""Sentry Crons: a check-in for every run, with the monitor configured from the job.

Active when ``sentry-sdk`` is installed, ``sentry_sdk.init()`` has been called with a DSN
(``sentry_sdk.get_client().is_active()``) and ``FENCEDJOBS["SENTRY"]`` is true (the
default). Nothing else to set up: each check-in *upserts* the monitor, so a new job
appears in Sentry at its first run and a changed schedule is updated at the next.

* A run starts: ``in_progress``, with the monitor config.
* It ends: ``ok`` if it succeeded, ``error`` for every other outcome (failed, timed out,
  fence lost, interrupted), with its duration and the same check-in id.
* A slot recorded ``missed`` (past ``starting_deadline``) sends nothing: Sentry already
  marks a slot missed when no check-in arrives within ``checkin_margin``, and an ``error``
  would count the same absence twice.
* A run whose process died sends nothing more; Sentry marks its ``in_progress`` check-in
  timed out after ``max_runtime``.

**A run that enqueued tasks** (``run.enqueue``, :mod:`django_fencedjobs.integrations.tasks`)
is not ``ok`` until its tasks have finished. When it succeeds with tasks still unfinished,
its runner sends no closing check-in; the worker that finishes the run's last task does
(``run_tasks_finished``): ``ok``, or ``error`` when any task of the run failed, with the
duration from the run's start to its last task's end. A run whose tasks had all finished
when it ended is closed by its runner the same way; a run that did not succeed is closed
``error`` at once, whatever its tasks. The worker is another process, so the check-in id
is derived from the run alone (:func:`check_in_id`: a UUID 5 of the job, the run's pk and
its slot) and both processes send the same one. Each side writes its own end first and
then reads the other's (the runner its outcome, then the tasks; the worker its task's
status, then the run's outcome), so at least one of them closes the check-in (both may,
with the same id and status). If the tasks never finish (never handed over, no worker,
a worker that died), no closing check-in arrives and Sentry marks the check-in timed out
after ``max_runtime``; ``checkjobs`` calls the job late past the slot's deadline. The
workers' processes call ``sentry_sdk.init()`` too, or that is what happens to every such
check-in.

The monitor config (:func:`monitor_config`): the cron expression (aliases expanded) or the
interval in the largest whole unit, the job's zone, ``checkin_margin`` = grace + jitter and
``max_runtime`` = run_timeout (both in whole minutes, rounded up: Sentry's unit), and
``failure_issue_threshold`` = ``failure_threshold``, so Sentry opens an issue when
``checkjobs`` would call the job failing in a row.

**The verdict.** Check-ins are per run; a job can be failing with most runs ``ok`` (a
failure rate) or have no live runner at all. With ``FENCEDJOBS["NOTIFY"]`` on, each change
of a job's state (:mod:`django_fencedjobs.notify`) is also a Sentry event, one issue per
job and state: the same verdict as ``checkjobs`` and the admin.

**Instances** (a job declared with ``instances=True``). Sentry bills per monitor, and a
monitor has one schedule. By default (``instance_series="aggregated"``) an instance has no
monitor: its runs send no check-in. Its failures reach Sentry as the events of its changes
of state (with ``NOTIFY`` on): tagged ``fencedjobs.job`` (the declared job) and
``fencedjobs.instance`` (its key), and fingerprinted per declared job and state, so the
instances of a job that fail together are one issue whose events name each instance. A
job declared with ``instance_series="each"`` gets a monitor per instance, slug from the
instance's name (``job[key]``, cut and hashed past 50 characters by :func:`monitor_slug`),
configured from the instance's schedule, zone and jitter; its events of changes of state
are one issue per instance and state, like a job declared in code.
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
from django_fencedjobs.models import (
    UNFINISHED_TASK,
    JobRun,
    Outcome,
    RunKind,
    RunTask,
    TaskStatus,
)
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
    of a job declared with ``instance_series="each"``; not an instance of a job that keeps
    the default, ``"aggregated"``. ``job`` is None in a worker that does not declare it:
    then the declared job whose instance the name would be decides, if it is declared, and
    otherwise the check-in is sent without a config, which creates no monitor. (A backfill
    run or a one-off sends none either: :func:`_checks_in`.)"""
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
    schedule = job.valid_schedule
    config_schedule: dict[str, Any]
    if schedule.every is None:
        config_schedule = {"type": "crontab", "value": schedule.crontab}
    else:
        for unit, size in _UNITS:
            if schedule.every >= size and schedule.every % size == timedelta(0):
                config_schedule = {
                    "type": "interval",
                    "value": schedule.every // size,
                    "unit": unit,
                }
                break
        else:  # not a whole number of minutes: Sentry's smallest unit
            config_schedule = {
                "type": "interval",
                "value": _minutes(schedule.every),
                "unit": "minute",
            }
    return {
        "schedule": config_schedule,
        "timezone": schedule.timezone,
        "checkin_margin": _minutes(job.grace + schedule.jitter),
        "max_runtime": _minutes(job.run_timeout),
        "failure_issue_threshold": job.failure_threshold,
    }


@receiver(signals.run_started, dispatch_uid="django_fencedjobs.integrations.sentry.started")
def run_started(*, job: Job, record: JobRun, **kwargs: Any) -> None:
    if not _checks_in(job, record) or not enabled():
        return
    from sentry_sdk.crons import capture_checkin

    capture_checkin(
        monitor_slug=monitor_slug(job.name),
        check_in_id=check_in_id(record),
        status="in_progress",
        monitor_config=monitor_config(job),  # type: ignore[arg-type]
    )


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
    _close(job, record, failed=failed, duration=duration)


@receiver(signals.run_tasks_finished, dispatch_uid="django_fencedjobs.integrations.sentry.tasks")
def run_tasks_finished(*, job: Job | None, record: JobRun, failed: bool, **kwargs: Any) -> None:
    """The last task of a run finished (in a worker): close the run's check-in, if the run
    succeeded. A run still running is closed by its runner when it ends (its tasks have
    finished by then); one that did not succeed was closed ``error`` already."""
    if record.outcome != Outcome.SUCCEEDED or not _checks_in(job, record) or not enabled():
        return
    tasks = _tasks_of(record)
    last = tasks.last_finished_at if tasks is not None else None
    _close(job, record, failed=failed, duration=_until(record, last, None))


@receiver(signals.job_state_changed, dispatch_uid="django_fencedjobs.integrations.sentry.state")
def job_state_changed(*, transition: Any, **kwargs: Any) -> None:
    """A job's change of state (``FENCEDJOBS["NOTIFY"]``, :mod:`django_fencedjobs.notify`)
    is an event: the same verdict as ``checkjobs`` (a failure rate, no live runner, late),
    which per-run check-ins cannot carry. One issue per job and state (its fingerprint);
    ``error`` when critical, ``warning`` for a warning, ``info`` back to ok.

    An instance's event is tagged with its declared job and its key; that of an instance
    without a monitor of its own (:func:`has_monitor`) is grouped with its job's other
    instances, one issue per declared job and state. The same change of many instances
    together is one event (tagged with their job and how many; their names an extra), as
    it is one mail; so is a change of all of a job's instances (``job[*]``: no live
    runner)."""
    if not enabled():
        return
    import sentry_sdk

    state, severity = transition.current
    level: Literal["error", "warning", "info"] = (
        "error" if severity == "critical" else "warning" if severity == "warning" else "info"
    )
    name: str = transition.name
    members: tuple[str, ...] = transition.members
    job, key = name, None
    if members:
        job = grouped = transition.parent
    else:
        if (parsed := instances.parse_name(name)) is not None and _is_instance(
            transition.health.job
        ):
            job, key = parsed
        grouped = job if key is not None and not has_monitor(name, transition.health.job) else name
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
    """Whether ``record``'s run sends check-ins: a run of the schedule (a retry included)
    of a job with a monitor (:func:`has_monitor`). A backfill run or a one-off sends none:
    it is not a slot of the schedule the monitor expects."""
    return record.kind == RunKind.SCHEDULED and has_monitor(record.job, job)


def _is_instance(job: Job | None) -> bool:
    """The job is an instance's (its name ``job[key]``); for a name health knows no job
    of (its job no longer declared), whether it reads as one."""
    return job.parent is not None if job is not None else True


def _close(job: Job | None, record: JobRun, *, failed: bool, duration: float | None) -> None:
    from sentry_sdk.crons import capture_checkin

    capture_checkin(
        monitor_slug=monitor_slug(record.job),
        check_in_id=check_in_id(record),
        status="error" if failed else "ok",
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
