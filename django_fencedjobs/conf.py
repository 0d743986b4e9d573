"""The app's settings: one dict, ``settings.FENCEDJOBS``, read into a typed object.

Every key has a default, so an empty (or missing) ``FENCEDJOBS`` is valid::

    FENCEDJOBS = {
        "CLOCK": "django_fencedjobs.clock.database_now",
        "OWNER": "",                       # label of this host in leases and runs
        "SENTRY": True,                    # send Sentry Crons check-ins when sentry-sdk is set up
        "RUN_RETENTION": timedelta(days=30),
        "RUNS_KEPT_PER_JOB": 100,
        "LOOP_MAX_SLEEP": timedelta(seconds=30),
        "ERROR_MAX_CHARS": 4000,
        "METRICS_TOKEN": "",               # bearer token the Prometheus metrics view requires
    }
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver


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
    #: The loop never sleeps longer than this, so paused/resumed jobs and "run now" are noticed.
    LOOP_MAX_SLEEP: timedelta = timedelta(seconds=30)
    #: Error text (traceback) stored on a failed run is cut to this many characters.
    ERROR_MAX_CHARS: int = 4000
    #: When set, the Prometheus metrics view answers only ``Authorization: Bearer <token>``.
    METRICS_TOKEN: str = ""

    @property
    def owner(self) -> str:
        return self.OWNER or f"{socket.gethostname()}:{os.getpid()}"


_cached: Settings | None = None


def get_settings() -> Settings:
    """The current settings, read once and re-read when a test overrides ``FENCEDJOBS``."""
    global _cached
    if _cached is None:
        raw: dict[str, Any] = dict(getattr(django_settings, "FENCEDJOBS", None) or {})
        known = {f.name for f in fields(Settings)}
        unknown = sorted(set(raw) - known)
        if unknown:
            from django.core.exceptions import ImproperlyConfigured

            raise ImproperlyConfigured(
                f"FENCEDJOBS has unknown key(s) {', '.join(unknown)}; "
                f"known keys: {', '.join(sorted(known))}."
            )
        _cached = Settings(**raw)
    return _cached


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    global _cached
    if setting == "FENCEDJOBS":
        _cached = None
        from django_fencedjobs import clock

        clock.reset()
