"""``manage.py importbeat``: django-celery-beat's periodic tasks as instances (the mapping is
:mod:`django_fencedjobs.beat`'s); ``help`` below says how, and the exit statuses.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_fencedjobs import beat, preflight


class Command(BaseCommand):
    help = (
        "Import django-celery-beat's periodic tasks as instances of jobs declared with "
        "@job(instances=True): a dry run that prints what it would create or change, and why "
        "a row cannot be imported, unless --commit. Exit 0 when every row maps, 1 when some "
        "cannot (--commit still writes the others), 2 for bad arguments, 3 when "
        "django-celery-beat's or the app's tables cannot be read."
    )
    # A project with one invalid job can still import: the rows of that job are refused.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--map",
            action="append",
            dest="maps",
            default=[],
            metavar="TASK=JOB",
            help="Import the rows of the celery task TASK as instances of JOB (repeatable). "
            "Default: the job named as the task.",
        )
        parser.add_argument(
            "--commit",
            action="store_true",
            help="Write the instances, each row in a transaction of its own. Default: a dry run.",
        )

    def handle(self, *args: Any, maps: list[str], commit: bool, **options: Any) -> None:
        try:
            mapping = beat.parse_maps(maps)
        except beat.BadMap as exc:
            raise CommandError(str(exc), returncode=2) from None
        counts: Counter[str] = Counter()
        unreadable = preflight.DATABASE_UNAVAILABLE  # nothing could be read (or written)
        with preflight.command_errors(settings_returncode=unreadable):
            try:
                preflight.check_settings()
                preflight.check_tables()
                for row in beat.import_rows(mapping, commit=commit):
                    counts[row.action] += 1
                    self.stdout.write(row.line)
            except beat.BeatUnavailable as exc:
                raise CommandError(str(exc), returncode=unreadable) from None
        self.stdout.write(beat.summary(counts, commit=commit))
        if counts["skip"]:
            total = sum(counts.values())
            raise CommandError(
                f"{counts['skip']} of {total} periodic task(s) cannot be imported: "
                "the skip lines say why",
                returncode=1,
            )
