"""Jobs whose ends are hard to record, beside a bystander, and a ``manage.py`` for the
child processes of tests/test_faults_poisoned_end.py.

    python -m tests.end_jobs runjobs [...]
    python -m tests.end_jobs checkjobs [...]

``FENCEDJOBS`` is overridden by ``FENCEDJOBS_TEST_EXTRA`` as in :mod:`tests.runner_jobs`.
``FENCEDJOBS_TEST_DIR`` names a folder: :data:`HELD` waits there for a file ``release``
before it returns (8 seconds at most), once it has written ``held-<fence>``.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

#: Counts 2**63 items: more than the items column holds.
POISON = "e.poison"
#: Counts ``Decimal(3)`` items past ``add_items``'s check, as a handler's code that
#: reaches into the run could: an end the database cannot be sent.
SMUGGLER = "e.smuggler"
#: Counts 2**63 items past ``add_items``'s check: an end the database refuses.
OVERFLOW = "e.overflow"
#: Does nothing, successfully, every second.
BYSTANDER = "e.bystander"
#: Waits for ``release`` in ``FENCEDJOBS_TEST_DIR``, then returns; every 10 seconds.
HELD = "e.held"

EVERY = timedelta(seconds=1)


def declare() -> None:
    from django_fencedjobs import job

    @job(every=EVERY, name=POISON)
    def poison(run):  # type: ignore[no-untyped-def]
        run.add_items(2**63)

    @job(every=EVERY, name=SMUGGLER)
    def smuggler(run):  # type: ignore[no-untyped-def]
        run._state.loose_items = Decimal(3)

    @job(every=EVERY, name=OVERFLOW)
    def overflow(run):  # type: ignore[no-untyped-def]
        run._state.loose_items = 2**63

    @job(every=EVERY, name=BYSTANDER)
    def bystander(run):  # type: ignore[no-untyped-def]
        run.add_items(1)

    @job(every=timedelta(seconds=10), name=HELD, timeout=timedelta(seconds=9))
    def held(run):  # type: ignore[no-untyped-def]
        directory = Path(os.environ["FENCEDJOBS_TEST_DIR"])
        (directory / f"held-{run.fence}").touch()
        deadline = time.monotonic() + 8
        while not (directory / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.02)


if __name__ == "__main__":
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import execute_from_command_line
    from django.db import connection
    from django.test import override_settings

    from tests.runner_jobs import extra

    declare()
    with override_settings(FENCEDJOBS=extra(settings.FENCEDJOBS)):
        connection.ensure_connection()
        execute_from_command_line(["manage.py", *sys.argv[1:]])
