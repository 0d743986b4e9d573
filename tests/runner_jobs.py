"""Jobs for the runner and notification tests, and a ``manage.py`` for their child processes.

    python -m tests.runner_jobs runjobs [...]
    python -m tests.runner_jobs checkjobs [...]

``declare()`` registers the jobs (inside ``registry.isolated()`` in a test). A child process
declares the same jobs, then runs the command with ``FENCEDJOBS`` overridden by
``FENCEDJOBS_TEST_EXTRA``: JSON of keys to set, durations in seconds (see :func:`extra`).
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from typing import Any

#: Every minute, and once a day: "whatever the job's interval".
MINUTELY = "r.minutely"
DAILY = "r.daily"
#: Keys of ``FENCEDJOBS`` whose values are durations.
DURATIONS = {
    "RUNNER_BEAT",
    "RUNNER_TIMEOUT",
    "RUNNER_PASS_INTERVAL",
    "RUNNER_RETENTION",
    "LOOP_MAX_SLEEP",
    "FAILURE_RATE_PERIOD",
}


def declare() -> None:
    from django_fencedjobs import job

    @job(every=timedelta(minutes=1), name=MINUTELY)
    def minutely(run):  # type: ignore[no-untyped-def]
        pass

    @job("0 3 * * *", name=DAILY)
    def daily(run):  # type: ignore[no-untyped-def]
        pass


def extra(base: dict[str, Any] | None = None) -> dict[str, Any]:
    """``FENCEDJOBS`` for a child: ``base`` (the test settings' own) updated with
    ``FENCEDJOBS_TEST_EXTRA``."""
    values = json.loads(os.environ.get("FENCEDJOBS_TEST_EXTRA") or "{}")
    settings = dict(base or {})
    for key, value in values.items():
        settings[key] = timedelta(seconds=value) if key in DURATIONS and value else value
    return settings


if __name__ == "__main__":
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import execute_from_command_line
    from django.test import override_settings

    declare()
    with override_settings(FENCEDJOBS=extra(settings.FENCEDJOBS)):
        execute_from_command_line(["manage.py", *sys.argv[1:]])
