"""Django settings for the benchmarks.

The server comes from ``DATABASE_URL`` (PostgreSQL only: the benchmarks measure row
locks, ``SKIP LOCKED`` and durable commits). The benchmarks never write to the database
the URL names: ``bench/run.py`` creates a database of its own on that server and passes
its name in ``FENCEDJOBS_BENCH_DB``; it drops it at the end.
"""

from __future__ import annotations

import os
from datetime import timedelta

from django.core.exceptions import ImproperlyConfigured

# The Django boilerplate (apps, middleware, templates, time zone) is the test suite's.
from tests.settings import (  # noqa: F401
    ALLOWED_HOSTS,
    DEBUG,
    DEFAULT_AUTO_FIELD,
    INSTALLED_APPS,
    MIDDLEWARE,
    PASSWORD_HASHERS,
    STATIC_URL,
    TASKS,
    TEMPLATES,
    TIME_ZONE,
    USE_TZ,
    parse_database_url,
)

_url = os.environ.get("DATABASE_URL", "")
if not _url or _url.lower().startswith("sqlite"):
    raise ImproperlyConfigured(
        "the benchmarks need PostgreSQL: run `make bench`, or "
        "python3 scripts/throwaway_postgres.py --durable -- python bench/run.py"
    )
_db = parse_database_url(_url)
_db["NAME"] = os.environ.get("FENCEDJOBS_BENCH_DB") or _db["NAME"]
_db["CONN_MAX_AGE"] = None  # one connection per process, as a worker keeps it
DATABASES = {"default": _db}

SECRET_KEY = "django-fencedjobs-bench-not-secret"
INSTALLED_APPS = [*(app for app in INSTALLED_APPS if app != "tests.testapp"), "bench.benchapp"]
ROOT_URLCONF = "bench.urls"

# Warnings and errors of the runner reach stderr (a benchmark that records failed runs
# should be visible); its INFO records are not emitted, as in a default deployment.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler", "level": "WARNING"}},
    "root": {"handlers": ["stderr"], "level": "WARNING"},
}

FENCEDJOBS: dict[str, object] = {}
# P14's runner purges with this retention (bench/p14_history.py).
if os.environ.get("FENCEDJOBS_BENCH_RETENTION_HOURS"):
    FENCEDJOBS["RUN_RETENTION"] = timedelta(
        hours=float(os.environ["FENCEDJOBS_BENCH_RETENTION_HOURS"])
    )
    FENCEDJOBS["RUNS_KEPT_PER_JOB"] = int(os.environ["FENCEDJOBS_BENCH_RUNS_KEPT"])

#: An RQ task backend (django-tasks-rq), only when the benchmark that needs it names the Redis
#: server it started (bench/p8_tasks.py: a throwaway redis-server of its own). A settings module
#: naming a Redis server nobody started would leave every process that touched the backend
#: waiting on a connection that cannot succeed.
REDIS_URL_ENV = "FENCEDJOBS_BENCH_REDIS_URL"
if os.environ.get(REDIS_URL_ENV):
    INSTALLED_APPS = [*INSTALLED_APPS, "django_rq", "django_tasks_rq"]
    RQ_QUEUES = {"default": {"URL": os.environ[REDIS_URL_ENV]}}
    TASKS = {**TASKS, "rq": {"BACKEND": "django_tasks_rq.RQBackend", "QUEUES": ["default"]}}
