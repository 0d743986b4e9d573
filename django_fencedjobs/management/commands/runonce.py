"""``manage.py runonce``: one run of a job or an instance at an instant, outside its schedule
(the work is :func:`django_fencedjobs.backfills.run_once`'s); ``help`` below says how.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_fencedjobs import clock, instances, preflight
from django_fencedjobs.backfills import BackfillError, run_once
from django_fencedjobs.exceptions import UnknownJob
from django_fencedjobs.instants import format_instant, format_wait, format_with_utc, parse_instant

#: ``--at now``: the one-off is due at once.
NOW = "now"


class Command(BaseCommand):
    help = (
        "Run a job, or an instance job[key], once at an instant (--at, ISO 8601 with an "
        "offset, or now), with --kwargs (a JSON object) over its own arguments. The runners "
        "run it at that instant. An instant in the past is refused unless --past. Exit 0 "
        "when queued, 1 when the one-off cannot be made as asked, 2 for bad arguments, "
        f"{preflight.DATABASE_UNAVAILABLE} when the database cannot be read."
    )
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "name", metavar="JOB", help="The job, or an instance job[key], to run once."
        )
        parser.add_argument(
            "--at",
            required=True,
            type=_at,
            metavar="ISO|now",
            help="When it runs: an instant with its offset, or now.",
        )
        parser.add_argument(
            "--kwargs",
            type=_kwargs,
            default=None,
            metavar="JSON",
            help='Keyword arguments for the handler, over the job\'s own: {"fmt": "csv"}.',
        )
        parser.add_argument(
            "--past",
            action="store_true",
            help="Accept an --at in the past: the one-off runs at once, as the run of that "
            "instant (its slot).",
        )

    def handle(
        self,
        *args: Any,
        name: str,
        at: datetime | str,
        kwargs: dict[str, Any] | None,
        past: bool = False,
        **options: Any,
    ) -> None:
        with preflight.command_errors(BackfillError, UnknownJob):
            preflight.check_settings()
            preflight.check_tables()
            now = clock.now()
            when = at if isinstance(at, datetime) else now
            if when < now and not past:  # a bad argument: it would run at once
                raise CommandError(
                    f"--at {format_instant(when, UTC)} is in the past ({format_wait(now - when)} "
                    "ago): the one-off would run at once, as the run of that instant; give --at "
                    "now to run it now, or add --past to run it for that instant",
                    returncode=2,
                )
            row = run_once(name, when, kwargs=kwargs)
            tz = instances.get_job(name).valid_schedule.tz
        due = f"in {format_wait(when - now)}" if when > now else "at the next tick"
        self.stdout.write(f"One-off {row}: runs at {format_with_utc(when, tz)} ({due}).")


def _at(text: str) -> datetime | str:
    if text.strip().lower() == NOW:
        return NOW
    try:
        return parse_instant(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, or now") from None


def _kwargs(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f'expected a JSON object of keyword arguments, e.g. {{"fmt": "csv"}}, got {text!r}'
        )
    return value
