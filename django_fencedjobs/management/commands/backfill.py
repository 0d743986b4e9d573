"""``manage.py backfill``: queue runs of a job's past slots, from a shell or a runbook (the
work is :mod:`django_fencedjobs.backfills`'); ``help`` below says how, and the exit statuses.
"""

from __future__ import annotations

import argparse
from datetime import datetime, tzinfo
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_fencedjobs import instances, preflight
from django_fencedjobs.backfills import BackfillError, BackfillPlan, backfill, plan_backfill
from django_fencedjobs.exceptions import UnknownJob
from django_fencedjobs.instants import format_instant, format_with_utc, parse_instant
from django_fencedjobs.models import BackfillSelection


class Command(BaseCommand):
    help = (
        "Queue runs of a job's slots in [--from, --to) for the runners: the slots with no "
        "run (--slots missing, the default), those whose last attempt did not succeed "
        "(failed), or all. JOB is a job or an instance, job[key]. Instants are ISO 8601 with "
        "an offset (2026-11-29T06:00:00+01:00, or Z for UTC). --dry-run lists what would be "
        "queued and what is left, and why, and queues nothing. Exit 0 when done, 1 when the "
        "backfill cannot be made as asked, 2 for bad arguments."
    )
    # A backfill of one job must not be held up by another job's configuration.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "name", metavar="JOB", help="The job, or an instance job[key], to backfill."
        )
        parser.add_argument(
            "--from",
            dest="start",
            required=True,
            type=_instant,
            metavar="ISO",
            help="The range's start (included), with its offset.",
        )
        parser.add_argument(
            "--to",
            dest="end",
            required=True,
            type=_instant,
            metavar="ISO",
            help="The range's end (excluded), with its offset; not in the future.",
        )
        parser.add_argument(
            "--slots",
            dest="selection",
            choices=BackfillSelection.values,
            default=BackfillSelection.MISSING,
            help="missing: slots with no run (default); failed: slots whose last attempt "
            "did not succeed; all: every slot.",
        )
        parser.add_argument(
            "--at-once",
            dest="concurrency",
            type=preflight.positive_int,
            default=1,
            metavar="N",
            help="At most N of its slots run at the same time (default 1).",
        )
        parser.add_argument(
            "--newest-first",
            action="store_true",
            help="Run the latest slot first (default: the oldest first).",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="List what would be queued and what is left, and why; queue nothing.",
        )

    def handle(
        self,
        *args: Any,
        name: str,
        start: datetime,
        end: datetime,
        selection: str,
        concurrency: int,
        newest_first: bool,
        dry_run: bool,
        **options: Any,
    ) -> None:
        order = "newest first" if newest_first else "oldest first"
        how = f"{selection} slots, {concurrency} at once, {order}"
        with preflight.command_errors(BackfillError, UnknownJob):
            preflight.check_settings()
            preflight.check_tables()
            plan = plan_backfill(name, start, end, selection=selection)
            tz = instances.get_job(name).valid_schedule.tz
            span = _span(plan, tz)
            if dry_run:
                for line in _plan_lines(plan, tz, newest_first=newest_first):
                    self.stdout.write(line)
                self.stdout.write(
                    f"Dry run: would queue {_slots(len(plan.slots))} of {name} {span} ({how}), "
                    f"leave {len(plan.left)}; nothing queued."
                )
                return
            if not plan.slots:
                self.stdout.write(
                    f"Nothing to queue: none of the {_slots(len(plan.left))} of {name} {span} "
                    f"is selected ({selection}); --dry-run says why."
                )
                return
            user = preflight.shell_user()  # who asked, for the backfill's record
            request, queued = backfill(
                name,
                start,
                end,
                selection=selection,
                concurrency=concurrency,
                newest_first=newest_first,
                requested_by=f"{user} (manage.py backfill)" if user else "manage.py backfill",
            )
        self.stdout.write(
            f"Backfill {request.pk}: queued {_slots(len(queued.slots))} of {name} {span} "
            f"({how}), left {len(queued.left)}."
        )


def _plan_lines(plan: BackfillPlan, tz: tzinfo, *, newest_first: bool) -> list[str]:
    """Each slot of the range, in the order the backfill would run them: ``queue`` with its
    attempt and last outcome, or ``leave`` and why."""
    lines: list[tuple[datetime, str]] = []
    for planned in plan.slots:
        last = f"last {planned.last_outcome}" if planned.last_outcome else "no run yet"
        when = format_with_utc(planned.slot, tz)
        lines.append((planned.slot, f"queue {when}  attempt {planned.attempt}, {last}"))
    for slot, reason in plan.left:
        lines.append((slot, f"leave {format_with_utc(slot, tz)}  {reason}"))
    lines.sort(key=lambda line: line[0], reverse=newest_first)
    return [line for _, line in lines]


def _span(plan: BackfillPlan, tz: tzinfo) -> str:
    """``from 2026-11-29 06:00:00 UTC to 09:00:00`` in the job's zone."""
    start = format_instant(plan.start, tz)
    return f"from {start} to {format_instant(plan.end, tz, ref=plan.start)}"


def _slots(n: int) -> str:
    return f"{n} slot{'' if n == 1 else 's'}"


def _instant(text: str) -> datetime:
    try:
        return parse_instant(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
