"""Django settings for the soak's processes (the driver and every runner it starts).

The server comes from ``DATABASE_URL`` (PostgreSQL only: the soak restarts the server,
inspects ``pg_stat_activity`` and records commit order with triggers). The soak never
writes to the database the URL names: the driver creates a database of its own on that
server, passes its name in ``FENCEDJOBS_SOAK_DB``, and drops it at the end.

Each process labels its connections ``soak:<runner>:<pid>`` (``application_name``), so
that the driver can tell from ``pg_stat_activity`` whether a process it stopped was inside
a transaction, and its lease owner is ``<runner>:<pid>``.
"""

from __future__ import annotations

import os
from datetime import timedelta

from django.core.exceptions import ImproperlyConfigured

# The Django boilerplate is the test suite's.
from tests.settings import (  # noqa: F401
    DEFAULT_AUTO_FIELD,
    PASSWORD_HASHERS,
    TIME_ZONE,
    USE_TZ,
    parse_database_url,
)

RUNNER = os.environ.get("SOAK_RUNNER", "driver")
# Behind a pooler (make soak-pgbouncer) the driver alone connects to the server directly.
_url = (RUNNER == "driver" and os.environ.get("FENCEDJOBS_SOAK_DRIVER_URL")) or os.environ.get(
    "DATABASE_URL", ""
)
if not _url.lower().startswith(("postgres://", "postgresql://", "pgsql://")):
    raise ImproperlyConfigured(
        "the soak needs PostgreSQL: run `make soak`, or "
        "python3 scripts/throwaway_postgres.py -- .venv/bin/python scripts/soak.py"
    )
_db = parse_database_url(_url)
_db["NAME"] = os.environ.get("FENCEDJOBS_SOAK_DB") or _db["NAME"]
_db["OPTIONS"] = {
    **_db["OPTIONS"],
    "application_name": f"soak:{RUNNER}:{os.getpid()}",
    # A connection attempt during a server restart fails in seconds, not minutes.
    "connect_timeout": 5,
}
DATABASES = {"default": _db}

SECRET_KEY = "django-fencedjobs-soak-not-secret"
DEBUG = False
ALLOWED_HOSTS: list[str] = []
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_fencedjobs",
    "soak.soakapp",
]

# The runners' records (run started/finished, fence lost, database unavailable...) go to
# stderr, which the driver writes to one log file per process.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(process)d %(levelname)s %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["stderr"], "level": "WARNING"},
    "loggers": {"django_fencedjobs": {"level": "INFO"}},
}

FENCEDJOBS = {
    "OWNER": f"{RUNNER}:{os.getpid()}",
    "SENTRY": False,
    # Slot accounting reads every run of the soak: none may be purged.
    "RUN_RETENTION": timedelta(days=3650),
    "RUNS_KEPT_PER_JOB": 1_000_000,
    "LOOP_MAX_SLEEP": timedelta(seconds=5),
}
