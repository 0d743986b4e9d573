"""Django settings for the benchmarks.

The server comes from ``DATABASE_URL`` (PostgreSQL only: the benchmarks measure row
locks, ``SKIP LOCKED`` and durable commits). The benchmarks never write to the database
the URL names: ``bench/run.py`` creates a database of its own on that server and passes
its name in ``FENCEDJOBS_BENCH_DB``; it drops it at the end.
"""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

from tests.settings import parse_database_url

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
    "bench.benchapp",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "bench.urls"

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
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Warnings and errors of the runner reach stderr (a benchmark that records failed runs
# should be visible); its INFO records are not emitted, as in a default deployment.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler", "level": "WARNING"}},
    "root": {"handlers": ["stderr"], "level": "WARNING"},
}

FENCEDJOBS: dict[str, object] = {}
