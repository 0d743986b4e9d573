"""``manage.py jobctl``: the admin's operations on a job, an instance or every instance of a
job, from a shell or a runbook (the work is :mod:`django_fencedjobs.manual`'s); ``help`` below
says how, and the exit statuses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_fencedjobs import instances, manual, preflight
from django_fencedjobs.db import LOCK_WAIT
from django_fencedjobs.exceptions import UnknownJob
from django_fencedjobs.registry import Job

#: The exit status for a busy lease row: EX_TEMPFAIL of sysexits.h, "a temporary failure;
#: the user is invited to retry". Distinct from every other status of the app's commands.
BUSY = 75

OPERATIONS: dict[str, Callable[[Job, bool, str], manual.Operated]] = {
    "pause": lambda job, from_now, by: manual.pause(job),
    "resume": lambda job, from_now, by: manual.resume(job, from_now=from_now, by=by),
    "skip": lambda job, from_now, by: manual.skip_next_slot(job, by=by),
}
#: What each operation did to every instance of a job (``job[*]``), and what it left.
TALLIES = {
    "pause": ("paused", "already paused"),
    "resume": ("resumed", "not paused"),
    "skip": ("skipped the next slot of", ""),
}


class Command(BaseCommand):
    help = (
        "Pause a job, an instance job[key] or every instance job[*] (no run starts until it "
        "is resumed; a run in progress goes on), resume it, or skip its next slot (its next "
        f"run moves to the slot after). Waits at most {LOCK_WAIT:g}s for a lease row, as the "
        "admin does. Exit 0 when done or nothing needed changing, 1 for an unknown or "
        f"invalid job, 2 for bad arguments, {preflight.DATABASE_UNAVAILABLE} for an "
        f"unreachable database, {BUSY} when a run kept a row locked: try again."
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
            "name",
            metavar="NAME",
            help="The job's name, as `manage.py runjobs --list` shows it; an instance's, "
            "job[key]; or job[*] for every instance of the job.",
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
        user = preflight.shell_user()  # who operates, as a skipped slot's record names them
        by = f"{manual.OPERATOR} ({user})" if user else manual.OPERATOR
        with preflight.command_errors():
            preflight.check_settings()
            preflight.check_tables()
            try:
                every = manual.every_instance(name)
                if every is not None:
                    operate = OPERATIONS[operation]
                    base = name[: -len("[*]")]
                    tally = manual.operate_each(every, lambda job: operate(job, from_now, by), base)
                else:
                    done = OPERATIONS[operation](_operable(name), from_now, by)
            except manual.JobBusy as exc:
                raise CommandError(str(exc), returncode=BUSY) from None
            except UnknownJob as exc:
                raise CommandError(str(exc)) from None
        if every is None:
            self.stdout.write(done.line)
            return
        self.stdout.write(tally.line(*TALLIES[operation]))
        if tally.busy:
            listed = ", ".join(tally.busy[:5]) + (", ..." if len(tally.busy) > 5 else "")
            raise CommandError(
                f"{len(tally.busy)} instance(s) busy: a run is inside a fenced transaction on "
                f"the lease row of {listed}; nothing changed for them, try again",
                returncode=BUSY,
            )


def _operable(name: str) -> Job:
    """The job or instance ``name`` names, if it can be operated on: a job declared with
    ``instances=True`` runs as its instances, and an invalid job or instance not at all."""
    job = instances.get_job(name)
    if job.instances:
        raise CommandError(
            f"job {name!r} runs as its instances: name one, '{name}[KEY]', or every one, "
            f"'{name}[*]'"
        )
    if job.schedule is None:
        raise CommandError(preflight.invalid_job_line(job))
    return job
