"""The ids of the app's system checks, each written once: every message of
:mod:`django_fencedjobs.checks`, the invalid declarations :mod:`django_fencedjobs.registry`
finds and the settings :mod:`django_fencedjobs.conf` refuses name their id from here.

docs/checks.md is the users' reference: what each id reports and how to fix it (a test
keeps the two the same). An id never changes meaning: users silence them by id
(``SILENCED_SYSTEM_CHECKS``). Imports nothing of the app, so any module may name an id.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["CheckId"]


class CheckId(StrEnum):
    """A check's id, a string (``CheckId.CRON == "fencedjobs.E001"``)."""

    # -- one job's declaration: the job is invalid, the others run ---------------------------
    #: The cron expression or ``every=`` is invalid, or no schedule is given.
    CRON = "fencedjobs.E001"
    #: The timezone is not a known IANA zone.
    ZONE = "fencedjobs.E002"
    #: The timezone is a fixed UTC offset.
    FIXED_OFFSET = "fencedjobs.E003"
    #: ``timeout`` is not shorter than the shortest interval.
    TIMEOUT = "fencedjobs.E004"
    #: ``jitter`` is not shorter than the shortest interval.
    JITTER = "fencedjobs.E005"
    #: ``lease_ttl`` is not positive.
    LEASE_TTL = "fencedjobs.E006"
    #: ``exclusion="advisory"`` on a database other than PostgreSQL.
    ADVISORY = "fencedjobs.E007"
    #: Two different functions declare the same job name.
    DUPLICATE = "fencedjobs.E008"
    #: The handler is an async def, async generator or generator function.
    HANDLER_KIND = "fencedjobs.E011"
    #: The handler cannot take the Run as its one positional argument, or is not callable.
    HANDLER_SIGNATURE = "fencedjobs.E012"
    #: An argument of ``@job`` has the wrong type or is out of range.
    ARGUMENT = "fencedjobs.E013"
    #: A ``FENCEDJOBS["TASK_SCHEDULE"]`` path names no task: it does not import, or is not
    #: a ``django.tasks`` task.
    TASK_PATH = "fencedjobs.E017"
    #: A calendar a job or instance names (``exclude=``) does not exist, or is invalid.
    CALENDAR = "fencedjobs.E018"
    #: A job's calendars exclude every one of its slots in the year ahead.
    CALENDAR_EXCLUDES_ALL = "fencedjobs.E019"

    # -- the installation -------------------------------------------------------------------
    #: The app's tables are routed to different databases, or not to the default one.
    ROUTING = "fencedjobs.E009"
    #: ``FENCEDJOBS`` is not a dict, has an unknown key, or its ``CLOCK`` is unusable.
    SETTINGS = "fencedjobs.E010"
    #: A ``FENCEDJOBS`` value has the wrong type or is out of range.
    SETTINGS_VALUE = "fencedjobs.E014"
    #: The lease database (PostgreSQL) is set stricter than READ COMMITTED.
    ISOLATION = "fencedjobs.E015"
    #: A transaction pooler is declared but server-side cursors or binding are on.
    TRANSACTION_POOLER = "fencedjobs.E016"

    # -- warnings ---------------------------------------------------------------------------
    #: A stampede: ten or more jobs without jitter start at one instant.
    STAMPEDE = "fencedjobs.W001"
    #: The lease database is SQLite without ``"transaction_mode": "IMMEDIATE"``.
    SQLITE_TRANSACTION_MODE = "fencedjobs.W002"
    #: django-tasks-db's queue is routed to a database other than the leases'.
    TASK_DATABASE = "fencedjobs.W003"
