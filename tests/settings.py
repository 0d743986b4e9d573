"""Django settings for the django-fencedjobs test suite.

The database comes from the environment:

* ``DATABASE_URL`` (``postgres://``, ``postgresql://`` or ``sqlite:///``):
  that database. ``make test`` gets one from ``scripts/throwaway_postgres.py``.
* unset: SQLite in a file (not ``:memory:``: fault tests use several
  processes), at ``$FENCEDJOBS_TEST_SQLITE`` or in the temp directory.

``FENCEDJOBS_TEST_DB`` (``postgres`` or ``sqlite``), when set, says which one
the run is meant to use: ``sqlite`` ignores a PostgreSQL ``DATABASE_URL``;
``postgres`` refuses to fall back to SQLite.

``FENCEDJOBS_TEST_VIA`` says how a PostgreSQL database is reached (the pooler tests,
``tests/test_poolers.py``, set it for the processes they start):

* ``direct`` (or unset): straight to the server.
* ``pgbouncer``: through the PgBouncer in transaction pooling that
  ``scripts/throwaway_postgres.py`` starts (``FENCEDJOBS_TEST_PGBOUNCER_URL``): the same
  database, user and options, the pooler's host and port; server-side cursors off, as
  Django's docs require behind a transaction pooler.
* ``pool``: Django's own connection pool (``OPTIONS["pool"]``, psycopg-pool).
"""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta
from importlib.util import find_spec
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

# One id per test run, inherited by processes the tests start, so that
# parallel runs against one server or one temp directory do not collide.
RUN_ID = os.environ.setdefault("FENCEDJOBS_TEST_RUN_ID", str(os.getpid()))


def parse_database_url(url: str) -> dict[str, Any]:
    """The DATABASES entry for a postgres://, postgresql:// or sqlite:/// URL."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "sqlite":
        # sqlite:////abs/path, sqlite:///rel/path
        path = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": path or ":memory:"}
    if scheme not in ("postgres", "postgresql", "pgsql"):
        raise ImproperlyConfigured(f"DATABASE_URL: unsupported scheme {parts.scheme!r}")
    host = unquote(parts.hostname or "") if "%2f" not in parts.netloc.lower() else ""
    if not host and parts.netloc:
        # A socket directory, percent-encoded: postgres://user@%2Ftmp%2Fx/db
        host = unquote(parts.netloc.rsplit("@", 1)[-1].split(":", 1)[0])
    options = dict(parse_qsl(parts.query))
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "postgres",
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": options.pop("host", host),
        "PORT": str(parts.port or ""),
        "OPTIONS": options,
    }


def sqlite_database() -> dict[str, Any]:
    name = Path(
        os.environ.get("FENCEDJOBS_TEST_SQLITE")
        or Path(tempfile.gettempdir()) / "fencedjobs-tests.sqlite3"
    )
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(name),
        "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
        "TEST": {"NAME": str(name.with_name(f"{name.stem}-test-{RUN_ID}{name.suffix}"))},
    }


_wanted = os.environ.get("FENCEDJOBS_TEST_DB", "").lower()
_url = os.environ.get("DATABASE_URL", "")
if _wanted not in ("", "sqlite", "postgres", "postgresql"):
    raise ImproperlyConfigured(f"FENCEDJOBS_TEST_DB={_wanted!r}: use postgres or sqlite")
if _url and not (_wanted == "sqlite" and not _url.lower().startswith("sqlite:")):
    _db = parse_database_url(_url)
    if _db["ENGINE"].endswith("sqlite3"):
        _db.setdefault("OPTIONS", {}).update({"timeout": 20, "transaction_mode": "IMMEDIATE"})
    else:
        # Django creates and drops TEST NAME; make it unique per run so that
        # parallel runs against the same server do not collide.
        _db["TEST"] = {
            "NAME": os.environ.get("FENCEDJOBS_TEST_PG_NAME", f"test_fencedjobs_{RUN_ID}")
        }
elif _wanted.startswith("postgres"):
    raise ImproperlyConfigured(
        "FENCEDJOBS_TEST_DB=postgres but DATABASE_URL is not set; "
        "run through scripts/throwaway_postgres.py"
    )
else:
    _db = sqlite_database()
if _wanted == "sqlite" and not _db["ENGINE"].endswith("sqlite3"):
    raise ImproperlyConfigured("FENCEDJOBS_TEST_DB=sqlite but DATABASE_URL is not SQLite")

_via = os.environ.get("FENCEDJOBS_TEST_VIA", "").lower()
if _via not in ("", "direct", "pgbouncer", "pool"):
    raise ImproperlyConfigured(f"FENCEDJOBS_TEST_VIA={_via!r}: use direct, pgbouncer or pool")
if _via in ("pgbouncer", "pool") and not _db["ENGINE"].endswith("postgresql"):
    raise ImproperlyConfigured(f"FENCEDJOBS_TEST_VIA={_via} needs PostgreSQL")
if _via == "pgbouncer":
    _pooler_url = os.environ.get("FENCEDJOBS_TEST_PGBOUNCER_URL", "")
    if not _pooler_url:
        raise ImproperlyConfigured(
            "FENCEDJOBS_TEST_VIA=pgbouncer but FENCEDJOBS_TEST_PGBOUNCER_URL is not set "
            f"({os.environ.get('FENCEDJOBS_TEST_PGBOUNCER_ERROR') or 'no PgBouncer started'}); "
            "run through scripts/throwaway_postgres.py, with pgbouncer installed"
        )
    _pooler = parse_database_url(_pooler_url)
    _db.update(HOST=_pooler["HOST"], PORT=_pooler["PORT"], DISABLE_SERVER_SIDE_CURSORS=True)
elif _via == "pool":
    # Each thread borrows a connection for as long as Django keeps it and gives it back to
    # the process's pool on close: a run's connection serves other threads afterwards.
    _db["OPTIONS"] = {**_db["OPTIONS"], "pool": {"min_size": 1, "max_size": 16, "timeout": 10}}

DATABASES = {"default": _db}

SECRET_KEY = "django-fencedjobs-tests-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_fencedjobs",
    "django_tasks_db",
    "tests.testapp",
]

# Scheduled tasks (tests/test_tasks*.py): the database backend on the test database, and
# the immediate backend for the path that hands tasks over after the run commits.
_TASKS = "django.tasks" if find_spec("django.tasks") else "django_tasks"
TASKS = {
    "default": {"BACKEND": "django_tasks_db.backend.DatabaseBackend"},
    "immediate": {"BACKEND": f"{_TASKS}.backends.immediate.ImmediateBackend"},
    # ImmediateBackend that SIGKILLs its process on enqueue while a marker file exists: the
    # crash between a run's commit and the hand-over (tests/test_tasks_faults.py).
    "killable": {"BACKEND": "tests.taskapp.backends.KillOnEnqueueBackend"},
    # ImmediateBackend that refuses the next N enqueues (tests/test_tasks_relay.py).
    "flaky": {"BACKEND": "tests.taskapp.backends.FlakyBackend"},
}

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "tests.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

STATIC_URL = "/static/"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"null": {"class": "logging.NullHandler"}},
    "root": {"handlers": ["null"], "level": "WARNING"},
    "loggers": {
        "django": {"handlers": ["null"], "level": "WARNING", "propagate": True},
        "django.db.backends": {"level": "WARNING"},
    },
}

FENCEDJOBS: dict[str, Any] = {
    "CLOCK": os.environ.get("FENCEDJOBS_TEST_CLOCK", "django_fencedjobs.clock.database_now"),
}
# A fault test's processes that relay tasks (tests/test_tasks_faults.py) hand over a task
# still pending this many seconds after its commit, not the default 10.
if os.environ.get("FENCEDJOBS_TEST_HANDOVER_GRACE"):
    FENCEDJOBS["TASK_HANDOVER_GRACE"] = timedelta(
        seconds=float(os.environ["FENCEDJOBS_TEST_HANDOVER_GRACE"])
    )
