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

The monitor config (:func:`monitor_config`): the cron expression (aliases expanded) or the
interval in the largest whole unit, the job's zone, ``checkin_margin`` = grace + jitter and
``max_runtime`` = run_timeout (both in whole minutes, rounded up: Sentry's unit), and
``failure_issue_threshold`` = ``failure_threshold``, so Sentry opens an issue when
``checkjobs`` would call the job failing.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import threading
from datetime import timedelta
from typing import Any

from django.dispatch import receiver

from django_fencedjobs import signals
from django_fencedjobs.conf import get_settings
from django_fencedjobs.models import JobRun, Outcome
from django_fencedjobs.registry import Job

logger = logging.getLogger("django_fencedjobs")

#: Sentry's limit on a monitor slug.
MAX_SLUG = 50
#: Check-in ids of runs in progress, by run pk; bounded in case outcomes are never recorded.
MAX_OPEN_CHECKINS = 10_000

_open: dict[int, str] = {}
_lock = threading.Lock()

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
    if not enabled():
        return
    from sentry_sdk.crons import capture_checkin

    check_in_id = capture_checkin(
        monitor_slug=monitor_slug(job.name),
        status="in_progress",
        monitor_config=monitor_config(job),  # type: ignore[arg-type]
    )
    if check_in_id is not None:
        with _lock:
            if len(_open) >= MAX_OPEN_CHECKINS:
                _open.pop(next(iter(_open)))
            _open[record.pk] = check_in_id


@receiver(signals.run_finished, dispatch_uid="django_fencedjobs.integrations.sentry.finished")
def run_finished(*, job: Job, record: JobRun, **kwargs: Any) -> None:
    with _lock:
        check_in_id = _open.pop(record.pk, None)
    if record.outcome == Outcome.MISSED or not enabled():
        return
    from sentry_sdk.crons import capture_checkin

    capture_checkin(
        monitor_slug=monitor_slug(job.name),
        check_in_id=check_in_id,
        status="ok" if record.outcome == Outcome.SUCCEEDED else "error",
        duration=record.duration,
        monitor_config=monitor_config(job),  # type: ignore[arg-type]
    )
