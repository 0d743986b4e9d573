"""What the commands verify before they start, and how they say what stops them: one clear
line, never a traceback; and one bad job never stops the good ones."""

from __future__ import annotations

import argparse
import contextlib
import getpass
from collections.abc import Iterable, Iterator, Sequence

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError
from django.db import DatabaseError, connections
from django.db.models import Model

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


@contextlib.contextmanager
def command_errors(*refused: type[Exception], settings_returncode: int = 1) -> Iterator[None]:
    """A command's one-line errors: ``refused`` exceptions (exit 1), an invalid ``FENCEDJOBS``
    (exit ``settings_returncode``), a database that cannot be read (:func:`unavailable`)."""
    try:
        yield
    except refused as exc:
        raise CommandError(one_line(exc)) from None
    except ImproperlyConfigured as exc:
        line = f"FENCEDJOBS is invalid: {one_line(exc)}"
        raise CommandError(line, returncode=settings_returncode) from None
    except (DatabaseError, NotMigrated) as exc:
        raise unavailable(exc) from None


def check_settings() -> None:
    """:class:`~django.core.exceptions.ImproperlyConfigured`, one line, for an invalid
    ``FENCEDJOBS`` (a ``CLOCK`` that cannot be imported or called included)."""
    get_settings()
    clock.get_clock()


def select_jobs(names: Sequence[str] | None = None) -> tuple[list[Job], list[Job]]:
    """The named jobs (an unknown name raises :class:`UnknownJob`), or every declared job,
    split into the valid ones and the invalid ones."""
    selected = [instances.get_job(name) for name in names] if names else registry.all()
    return [job for job in selected if job.valid], [job for job in selected if not job.valid]


def invalid_job_line(job: Job) -> str:
    """One line saying that ``job`` is invalid, why, and the id of its system check."""
    reason = str(job.schedule_error).removeprefix(f"job {job.name!r}: ")
    return f"job {job.name!r} is invalid and does not run: {reason} ({job.check_id})"


def missing_tables(alias: str, models: Iterable[type[Model]]) -> list[str]:
    """The tables of ``models`` that the database ``alias`` lacks. One query."""
    connection = connections[alias]
    with connection.cursor() as cursor:
        present = set(connection.introspection.table_names(cursor))
    return [m._meta.db_table for m in models if m._meta.db_table not in present]


def check_tables() -> None:
    """Raise :class:`NotMigrated` when a table of the app is missing from its database
    (``migrate`` has not run there), and :class:`~django.db.DatabaseError` when the database
    cannot be reached."""
    alias = lease_db()
    missing = missing_tables(alias, apps.get_app_config("fencedjobs").get_models())
    if missing:
        raise NotMigrated(
            f"the fencedjobs tables are missing from the database {alias!r} "
            f"({', '.join(missing)}): run `manage.py migrate`"
        )


def shell_user() -> str | None:
    """The shell's user; None without one (a container's uid with no passwd entry)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


def positive_int(text: str) -> int:
    """An argparse ``type``: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value
