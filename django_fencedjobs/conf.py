"""The app's settings: one dict, ``settings.FENCEDJOBS``, read into a typed object. Every
key has a default; every value is checked for its type and range (:func:`problems`, the
system checks E010 and E014). The reference: docs/configuration.md.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from django_fencedjobs.checkids import CheckId


@dataclass(frozen=True)
class Settings:
    #: Dotted path to a zero-argument callable returning an aware datetime. The default reads
    #: the database's clock, so every host computes leases against one clock.
    CLOCK: str = "django_fencedjobs.clock.database_now"
    #: Label written to leases and runs; "" means "<hostname>:<pid>".
    OWNER: str = ""
    #: Send Sentry Crons check-ins when sentry-sdk is installed and initialised.
    SENTRY: bool = True
    #: Runs older than this are deleted by the runner, in bounded batches...
    RUN_RETENTION: timedelta = timedelta(days=30)
    #: ...but the newest this many runs of each job are always kept.
    RUNS_KEPT_PER_JOB: int = 100
    #: The loop never sleeps longer than this, so that changes made elsewhere are noticed.
    LOOP_MAX_SLEEP: timedelta = timedelta(seconds=30)
    #: Error text (traceback) stored on a failed run is cut to this many characters.
    ERROR_MAX_CHARS: int = 4000
    #: When set, the Prometheus metrics view answers only ``Authorization: Bearer <token>``.
    METRICS_TOKEN: str = ""
    #: How many jobs a runner process runs side by side (``runjobs --workers`` overrides).
    WORKERS: int = 4
    #: A runner with this many handlers abandoned at their timeout (threads only the end of
    #: the process ends) exits, for a new process to take over. None: its workers' count.
    MAX_ABANDONED_HANDLERS: int | None = None
    #: A pooler in transaction mode (PgBouncer) is in front of PostgreSQL: the system checks
    #: hold the lease database to what it needs (fencedjobs.E016).
    TRANSACTION_POOLER: bool = False
    #: The failure rate is read over a job's latest this many runs that ran to an end
    #: (succeeded, failed or timed out)...
    FAILURE_RATE_RUNS: int = 20
    #: ...scheduled within this long before now.
    FAILURE_RATE_PERIOD: timedelta = timedelta(hours=24)
    #: At this share of failures in that window (at least 2), the job is failing, warning...
    FAILURE_RATE_WARNING: float = 0.2
    #: ...at this share (and at least its failure_threshold failures, 2 or more), critical.
    FAILURE_RATE_CRITICAL: float = 0.5
    #: How often a runner loop writes its beat (its row's ``last_beat_at``).
    RUNNER_BEAT: timedelta = timedelta(seconds=5)
    #: A runner not seen for this long is dead: a job no live runner serves is no_runner.
    RUNNER_TIMEOUT: timedelta = timedelta(seconds=30)
    #: How often cron runs ``runjobs --once``: a job served only by passes is no_runner when
    #: the last is older than this plus RUNNER_TIMEOUT. None: judged by its deadlines alone.
    RUNNER_PASS_INTERVAL: timedelta | None = None
    #: The rows of runners not seen for this long are deleted (by a live runner).
    RUNNER_RETENTION: timedelta = timedelta(days=1)
    #: Tell each job's changes of state: mail to NOTIFY_EMAIL, and ``job_state_changed``.
    NOTIFY: bool = False
    #: Who gets the mail: "ADMINS" (``mail_admins``), or a list of addresses ([] for none).
    NOTIFY_EMAIL: str | list[str] | tuple[str, ...] = "ADMINS"
    #: A runner's relay hands over a run's task still pending this long after its commit.
    TASK_HANDOVER_GRACE: timedelta = timedelta(seconds=10)
    #: Tasks enqueued at every slot of a schedule, by the task's dotted path: a cron string,
    #: or a dict of ``schedule_task``'s arguments; each is a job, checked as ``@job``'s are.
    TASK_SCHEDULE: Mapping[str, str | Mapping[str, Any]] = field(default_factory=dict)

    @property
    def owner(self) -> str:
        return self.OWNER or f"{_host()}:{os.getpid()}"


@functools.lru_cache(maxsize=1)
def _host() -> str:
    """This host's name, asked once: every acquisition writes its owner (0.1 ms each)."""
    return socket.gethostname()


#: The smallest ``ERROR_MAX_CHARS``: room for the exception's last lines, what failed.
MIN_ERROR_MAX_CHARS = 200
#: The length of the owner columns of the lease and run tables.
MAX_OWNER_CHARS = 200


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(least: int) -> tuple[Callable[[Any], bool], str]:
    return lambda v: _is_int(v) and v >= least, f"an int of at least {least}"


def _timedelta(example: str, *, zero: bool = False) -> tuple[Callable[[Any], bool], str]:
    """A timedelta longer than zero (``zero``: or zero)."""
    return (
        lambda v: isinstance(v, timedelta) and (v >= timedelta(0) if zero else v > timedelta(0)),
        f"a datetime.timedelta {'of zero or more' if zero else 'longer than zero'}, e.g. {example}",
    )


def _is_task_schedule(value: object) -> bool:
    return isinstance(value, Mapping) and all(
        isinstance(path, str) and path and isinstance(entry, str | Mapping)
        for path, entry in value.items()
    )


def _is_share(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 1


#: For each key: whether a value is acceptable, and what is expected, in words.
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "CLOCK": (
        lambda v: isinstance(v, str) and bool(v),
        "the dotted path (a str) of a zero-argument callable returning an aware datetime, "
        "e.g. 'django_fencedjobs.clock.system_now'",
    ),
    "OWNER": (
        lambda v: isinstance(v, str) and len(v) <= MAX_OWNER_CHARS,
        f"a str of at most {MAX_OWNER_CHARS} characters ('' for hostname:pid)",
    ),
    "SENTRY": (lambda v: isinstance(v, bool), "True or False"),
    "RUN_RETENTION": _timedelta("timedelta(days=30)"),
    "RUNS_KEPT_PER_JOB": _int(0),
    "LOOP_MAX_SLEEP": _timedelta("timedelta(seconds=30)", zero=True),
    "ERROR_MAX_CHARS": _int(MIN_ERROR_MAX_CHARS),
    "METRICS_TOKEN": (lambda v: isinstance(v, str), "a str ('' for no token)"),
    "WORKERS": _int(1),
    "MAX_ABANDONED_HANDLERS": (
        lambda v: v is None or (_is_int(v) and v >= 1),
        "an int of at least 1, or None (as many as the runner's workers)",
    ),
    "TRANSACTION_POOLER": (lambda v: isinstance(v, bool), "True or False"),
    "FAILURE_RATE_RUNS": _int(2),
    "FAILURE_RATE_PERIOD": _timedelta("timedelta(hours=24)"),
    "FAILURE_RATE_WARNING": (_is_share, "a number above 0 and at most 1, e.g. 0.2"),
    "FAILURE_RATE_CRITICAL": (_is_share, "a number above 0 and at most 1, e.g. 0.5"),
    "RUNNER_BEAT": _timedelta("timedelta(seconds=5)"),
    "RUNNER_TIMEOUT": _timedelta("timedelta(seconds=30)"),
    "RUNNER_PASS_INTERVAL": (
        lambda v: v is None or (isinstance(v, timedelta) and v > timedelta(0)),
        "a datetime.timedelta longer than zero (how often cron runs runjobs --once), or None",
    ),
    "RUNNER_RETENTION": _timedelta("timedelta(days=1)"),
    "NOTIFY": (lambda v: isinstance(v, bool), "True or False"),
    "TASK_HANDOVER_GRACE": _timedelta("timedelta(seconds=10)", zero=True),
    "TASK_SCHEDULE": (
        _is_task_schedule,
        "a dict of task paths (str) to a cron string or a dict of schedule_task()'s "
        "arguments, e.g. {'myproject.tasks.digest': '0 8 * * *'}",
    ),
    "NOTIFY_EMAIL": (
        lambda v: (
            v == "ADMINS"
            or (isinstance(v, list | tuple) and all(isinstance(a, str) and "@" in a for a in v))
        ),
        '"ADMINS", or a list of e-mail addresses ([] for no mail)',
    ),
}

#: Keys whose values must agree: (check, message) over the merged settings.
_ACROSS: tuple[tuple[Callable[[Settings], bool], str], ...] = (
    (
        lambda s: s.FAILURE_RATE_WARNING <= s.FAILURE_RATE_CRITICAL,
        "FENCEDJOBS['FAILURE_RATE_WARNING'] must be at most FAILURE_RATE_CRITICAL",
    ),
    (
        lambda s: s.RUNNER_TIMEOUT >= 2 * s.RUNNER_BEAT,
        "FENCEDJOBS['RUNNER_TIMEOUT'] must be at least twice RUNNER_BEAT, so that one late "
        "beat does not make a live runner read dead",
    ),
)


def problems() -> list[tuple[CheckId, str]]:
    """What is wrong with ``settings.FENCEDJOBS``: (check id, message) pairs, one per bad
    key, each message one line. Empty when it is valid. The ``CLOCK`` path is not imported
    here (see :func:`django_fencedjobs.clock.get_clock`)."""
    raw = getattr(django_settings, "FENCEDJOBS", None)
    if raw is None:
        return []
    if not isinstance(raw, Mapping):
        return [(CheckId.SETTINGS, f"FENCEDJOBS must be a dict, got {type(raw).__name__} {raw!r}")]
    found: list[tuple[CheckId, str]] = []
    unknown = sorted(str(key) for key in raw if key not in _RULES)
    if unknown:
        found.append(
            (
                CheckId.SETTINGS,
                f"FENCEDJOBS has unknown key(s) {', '.join(unknown)}; "
                f"known keys: {', '.join(sorted(_RULES))}.",
            )
        )
    found.extend(
        (CheckId.SETTINGS_VALUE, f"FENCEDJOBS[{key!r}] must be {expected}, got {raw[key]!r}")
        for key, (acceptable, expected) in _RULES.items()
        if key in raw and not acceptable(raw[key])
    )
    if not found:
        merged = Settings(**dict(raw))
        found.extend((CheckId.SETTINGS_VALUE, message) for ok, message in _ACROSS if not ok(merged))
    return found


_cached: Settings | None = None


def get_settings() -> Settings:
    """The current settings, read once and re-read when a test overrides ``FENCEDJOBS``.
    Raises ``ImproperlyConfigured`` with every :func:`problems` on one line, so that nothing
    downstream fails on a bad value."""
    global _cached
    if _cached is None:
        found = problems()
        if found:
            raise ImproperlyConfigured("; ".join(message for _, message in found))
        _cached = Settings(**dict(getattr(django_settings, "FENCEDJOBS", None) or {}))
    return _cached


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    global _cached
    if setting == "FENCEDJOBS":
        _cached = None
