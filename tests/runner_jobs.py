"""Jobs for the runner and notification tests, and a ``manage.py`` for their child processes.

    python -m tests.runner_jobs runjobs [...]
    python -m tests.runner_jobs checkjobs [...]

``declare()`` registers the jobs (inside ``registry.isolated()`` in a test). A child process
declares the same jobs, then runs the command with ``FENCEDJOBS`` overridden by
``FENCEDJOBS_TEST_EXTRA``: JSON of keys to set, durations in seconds (see :func:`extra`).

``FENCEDJOBS_TEST_SMTP_PORT`` points Django's SMTP backend at 127.0.0.1:PORT (ADMINS:
``admin@example.com``). ``FENCEDJOBS_TEST_GO`` names a file: the command starts once it
exists, so that several processes start it at once.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from typing import Any

#: Every minute, and once a day: "whatever the job's interval".
MINUTELY = "r.minutely"
DAILY = "r.daily"
#: A job that always fails (declared when asked: ``FENCEDJOBS_TEST_BROKEN=1`` in a child).
BROKEN = "r.broken"
#: Keys of ``FENCEDJOBS`` whose values are durations.
DURATIONS = {
    "RUNNER_BEAT",
    "RUNNER_TIMEOUT",
    "RUNNER_PASS_INTERVAL",
    "RUNNER_RETENTION",
    "LOOP_MAX_SLEEP",
    "FAILURE_RATE_PERIOD",
}


def declare(*, broken: bool = False) -> None:
    """The minutely and the daily job; with ``broken``, also :data:`BROKEN`, which fails."""
    from django_fencedjobs import job

    if broken:

        @job(every=timedelta(minutes=1), name=BROKEN)
        def fails(run):  # type: ignore[no-untyped-def]
            raise RuntimeError("upstream said no")

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


def mail_settings() -> dict[str, Any]:
    """Django's mail settings for a child, from ``FENCEDJOBS_TEST_SMTP_PORT``."""
    port = os.environ.get("FENCEDJOBS_TEST_SMTP_PORT")
    if not port:
        return {}
    return {
        "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
        "EMAIL_HOST": "127.0.0.1",
        "EMAIL_PORT": int(port),
        "EMAIL_TIMEOUT": 10,
        "ADMINS": [("Ops", "admin@example.com")],
        "SERVER_EMAIL": "jobs@example.com",
    }


def wait_for_go() -> None:
    go = os.environ.get("FENCEDJOBS_TEST_GO")
    if not go:
        return
    deadline = time.monotonic() + 60
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            sys.exit("no go within 60 s")
        time.sleep(0.005)


if __name__ == "__main__":
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import execute_from_command_line
    from django.db import connection
    from django.test import override_settings

    declare(broken=os.environ.get("FENCEDJOBS_TEST_BROKEN") == "1")
    with override_settings(FENCEDJOBS=extra(settings.FENCEDJOBS), **mail_settings()):
        connection.ensure_connection()  # connected before the start
        wait_for_go()
        execute_from_command_line(["manage.py", *sys.argv[1:]])
