"""``manage.py runonce JOB --at ISO|now [--kwargs JSON]``: one run of a job or an instance
at an instant, outside its schedule, with arguments of its own if wanted; the runners run
it, under its own lease, recorded as a run of kind ``once``. The work is
:func:`django_fencedjobs.backfills.run_once`'s.

Exit status: 0 queued; 1 a one-off that cannot be made as asked (an unknown or invalid job,
a job run as its instances, arguments its handler does not take, one queued already at that
instant), an invalid ``FENCEDJOBS``, the database unreachable or not migrated; 2 bad
arguments (argparse's usage, then one line): an instant without an offset or not ISO 8601,
``--kwargs`` that is not a JSON object. Nothing is queued unless the exit status is 0.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from django_fencedjobs import clock, instances, preflight
from django_fencedjobs.backfills import BackfillError, run_once
from django_fencedjobs.exceptions import UnknownJob
from django_fencedjobs.instants import format_wait, format_with_utc, parse_instant
from django_fencedjobs.text import one_line

#: ``--at now``: the one-off is due at once.
NOW = "now"


class Command(BaseCommand):
    help = (
        "Run a job, or an instance job[key], once at an instant (--at, ISO 8601 with an "
        "offset, or now), with --kwargs (a JSON object) over its own arguments. The runners "
        "run it at that instant. Exit 0 when queued, 1 when the one-off cannot be made as "
        "asked, 2 for bad arguments."
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

    def handle(
        self,
        *args: Any,
        name: str,
        at: datetime | str,
        kwargs: dict[str, Any] | None,
        **options: Any,
    ) -> None:
        try:
            preflight.check_settings()
            preflight.check_tables()
            now = clock.now()
            when = at if isinstance(at, datetime) else now
            row = run_once(name, when, kwargs=kwargs)
            tz = instances.get_job(name).valid_schedule.tz
        except (BackfillError, UnknownJob, preflight.NotMigrated) as exc:
            raise CommandError(one_line(exc)) from None
        except ImproperlyConfigured as exc:
            raise CommandError(f"FENCEDJOBS is invalid: {one_line(exc)}") from None
        except DatabaseError as exc:
            raise CommandError(f"database unavailable: {one_line(exc)}") from None
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
