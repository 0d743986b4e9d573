"""``manage.py jobctl pause|resume|skip NAME``: the admin's operations on one job, from a
shell or a runbook. One line on stdout says what was done, or one line on stderr why not.

Exit status: 0 done, or nothing to change (already paused, not paused); 1 an unknown or
invalid job, an invalid ``FENCEDJOBS``, the database unreachable or not migrated; 2 bad
arguments (argparse's usage, then one line); :data:`BUSY` (75) a run kept the job's lease
row locked inside a fenced transaction past the bounded wait, so nothing changed: try
again. The work is :mod:`django_fencedjobs.manual`'s. A slot skipped (``skip``,
``resume --from-now``) is recorded as skipped by ``jobctl (<the shell's user>)``.
"""

from __future__ import annotations

import getpass
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from django_fencedjobs import manual, preflight
from django_fencedjobs.db import LOCK_WAIT
from django_fencedjobs.exceptions import UnknownJob
from django_fencedjobs.registry import Job, registry
from django_fencedjobs.text import one_line

#: The exit status for a busy lease row: EX_TEMPFAIL of sysexits.h, "a temporary failure;
#: the user is invited to retry". Distinct from every other status of the app's commands.
BUSY = 75

OPERATIONS: dict[str, Callable[[Job, bool, str], manual.Operated]] = {
    "pause": lambda job, from_now, by: manual.pause(job),
    "resume": lambda job, from_now, by: manual.resume(job, from_now=from_now, by=by),
    "skip": lambda job, from_now, by: manual.skip_next_slot(job, by=by),
}


def operator() -> str:
    """Who operates, as a skipped slot's record names them: ``jobctl (<user>)``, or
    ``jobctl`` when the shell's user cannot be told."""
    try:
        return f"{manual.OPERATOR} ({getpass.getuser()})"
    except (KeyError, OSError):  # no login name, and no passwd entry for the uid
        return manual.OPERATOR


class Command(BaseCommand):
    help = (
        "Pause a job (no run starts until it is resumed; a run in progress goes on), resume "
        "it, or skip its next slot (its next run moves to the slot after). Waits at most "
        f"{LOCK_WAIT:g}s for the job's lease row, as the admin does. Exit 0 when done or "
        f"nothing needed changing, 1 for an unknown or invalid job or an unreachable "
        f"database, 2 for bad arguments, {BUSY} when a run kept the row locked: try again."
    )
    # An operation on one job must not be held up by another job's configuration.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "operation",
            choices=tuple(OPERATIONS),
            help="pause: no run starts until resumed; resume; skip: skip the next slot.",
        )
        parser.add_argument(
            "name", metavar="NAME", help="The job's name, as `manage.py runjobs --list` shows it."
        )
        parser.add_argument(
            "--from-now",
            action="store_true",
            help="resume only: skip the slots that fell due while the job was paused (recorded "
            "as one missed run) instead of catching them up by the job's catchup policy.",
        )

    def handle(
        self, *args: Any, operation: str, name: str, from_now: bool = False, **options: Any
    ) -> None:
        if from_now and operation != "resume":
            raise CommandError("--from-now goes with resume only", returncode=2)
        try:
            preflight.check_settings()
            job = registry.get(name)
            if job.schedule is None:
                raise CommandError(preflight.invalid_job_line(job))
            preflight.check_tables()
            done = OPERATIONS[operation](job, from_now, operator())
        except manual.JobBusy as exc:
            raise CommandError(str(exc), returncode=BUSY) from None
        except (UnknownJob, preflight.NotMigrated) as exc:
            raise CommandError(str(exc)) from None
        except ImproperlyConfigured as exc:
            raise CommandError(f"FENCEDJOBS is invalid: {one_line(exc)}") from None
        except DatabaseError as exc:
            raise CommandError(f"database unavailable: {one_line(exc)}") from None
        self.stdout.write(done.line)
