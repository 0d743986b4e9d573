"""Jobs for the monitoring tests, and a ``manage.py`` for running commands in a subprocess.

``declare()`` registers the jobs (call it inside ``registry.isolated()`` in a test, so the
global registry stays clean). Run as ``python -m tests.monitoring_jobs checkjobs --json``
in a child process: it declares the same jobs, then runs the command.
``FENCEDJOBS_TEST_CLOCK=tests.monitoring_jobs.env_clock`` makes the child's clock read
``FENCEDJOBS_TEST_NOW`` (ISO 8601), so parent and child agree on "now".
"""

from __future__ import annotations

import os
import sys
from datetime import datetime

FINE = "m.fine"
BROKEN = "m.broken"
STALLED = "m.stalled"


def declare() -> None:
    from django_fencedjobs import job

    @job("*/15 * * * *", name=FINE)
    def fine(run):  # type: ignore[no-untyped-def]
        pass

    @job("*/15 * * * *", name=BROKEN)
    def broken(run):  # type: ignore[no-untyped-def]
        raise RuntimeError("upstream said no")

    @job("*/15 * * * *", name=STALLED)
    def stalled(run):  # type: ignore[no-untyped-def]
        pass


def env_clock() -> datetime:
    return datetime.fromisoformat(os.environ["FENCEDJOBS_TEST_NOW"])


if __name__ == "__main__":
    import django

    django.setup()
    declare()
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", *sys.argv[1:]])
