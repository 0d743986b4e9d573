"""What ``runjobs`` and ``checkjobs`` verify before they start, so that bad input gives one
clear line, never a traceback, and one bad job never stops the good ones.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.apps import apps
from django.core.management.base import CommandError
from django.db import connections

from django_fencedjobs import clock, instances
from django_fencedjobs.conf import get_settings
from django_fencedjobs.db import lease_db
from django_fencedjobs.exceptions import FencedJobsError
from django_fencedjobs.registry import Job, registry
from django_fencedjobs.text import one_line

#: The exit status of every command of the app when the database cannot be read: it is
#: unreachable, or ``migrate`` has not run on it. One code for every command (docs/running.md).
DATABASE_UNAVAILABLE = 3


class NotMigrated(FencedJobsError):
    """The app's tables do not exist in its database: run `manage.py migrate`."""


def unavailable(exc: Exception) -> CommandError:
    """A command's one-line error for a database it cannot read (``exc``: a
    ``DatabaseError``, or :class:`NotMigrated`), exit status :data:`DATABASE_UNAVAILABLE`."""
    line = str(exc) if isinstance(exc, NotMigrated) else f"database unavailable: {one_line(exc)}"
    return CommandError(line, returncode=DATABASE_UNAVAILABLE)


def check_settings() -> None:
    """Raise :class:`~django.core.exceptions.ImproperlyConfigured`, with a one-line message,
    when ``FENCEDJOBS`` is invalid: an unknown key, a value of the wrong type or range, a
    ``CLOCK`` that cannot be imported or called without arguments."""
    get_settings()
    clock.get_clock()


def select_jobs(names: Sequence[str] | None = None) -> tuple[list[Job], list[Job]]:
    """The named jobs (an unknown name raises :class:`UnknownJob`), or every declared job,
    split into the valid ones and the invalid ones."""
    selected = [instances.get_job(name) for name in names] if names else registry.all()
    valid = [job for job in selected if job.valid]
    invalid = [job for job in selected if not job.valid]
    return valid, invalid


def invalid_job_line(job: Job) -> str:
    """One line saying that ``job`` is invalid, why, and the id of its system check."""
    reason = str(job.schedule_error)
    prefix = f"job {job.name!r}: "
    if reason.startswith(prefix):
        reason = reason[len(prefix) :]
    return f"job {job.name!r} is invalid and does not run: {reason} ({job.check_id})"


def check_tables() -> None:
    """Raise :class:`NotMigrated` when a table of the app is missing from its database
    (``migrate`` has not run there), and :class:`~django.db.DatabaseError` when the database
    cannot be reached. One query: the database's list of tables."""
    alias = lease_db()
    connection = connections[alias]
    expected = [model._meta.db_table for model in apps.get_app_config("fencedjobs").get_models()]
    with connection.cursor() as cursor:
        present = set(connection.introspection.table_names(cursor))
    missing = [table for table in expected if table not in present]
    if missing:
        raise NotMigrated(
            f"the fencedjobs tables are missing from the database {alias!r} "
            f"({', '.join(missing)}): run `manage.py migrate`"
        )
