"""Settings of the example project, read from the environment with django-environ.

=================  ============================================================
variable           default
=================  ============================================================
``DEBUG``          ``True`` (a local demo)
``SECRET_KEY``     a development key; set a real one anywhere else
``ALLOWED_HOSTS``  ``127.0.0.1,localhost``
``DATABASE_URL``   ``sqlite:///example_project/db.sqlite3`` (beside this file);
                   e.g. ``postgres://user:password@localhost/demo`` for PostgreSQL
``LOG_LEVEL``      ``INFO`` for django_fencedjobs' JSON log lines on stderr
``TASKS_BACKEND``  ``db``: the scheduled task ``demo.write_digest`` on
                   django-tasks-db (``manage.py db_worker`` runs it); ``rq``: on
                   RQ, through django-tasks-rq (``manage.py rqworker --job-class
                   django_tasks_rq.Job default`` runs it; docs/demo.md)
``REDIS_URL``      ``redis://127.0.0.1:6379/0``: RQ's Redis, with
                   ``TASKS_BACKEND=rq``
=================  ============================================================
"""

from __future__ import annotations

from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent
REPO_ROOT = BASE_DIR.parent

env = environ.Env()

DEBUG = env.bool("DEBUG", default=True)
SECRET_KEY = env.str(
    "SECRET_KEY", default="django-insecure-fencedjobs-example-project-development-only"
)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]"])

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            # Wait up to 20 s for another process's write lock (the scheduler and the
            # web server share the file) instead of failing at once.
            "timeout": 20,
            # BEGIN IMMEDIATE: take SQLite's write lock when a transaction starts, not at
            # its first write. Fenced writes depend on it. fenced_atomic's fence check is
            # a write (a no-op UPDATE of the job's lease row): holding the write lock from
            # that statement to the commit is what keeps a successor from taking the
            # lease in between. In the default (deferred) mode a transaction that has
            # read first (a handler's query, Django's update_or_create, a run recorded
            # after a read) and then needs the write lock while the other process holds
            # it gets "database is locked" at once: SQLite does not wait (the timeout
            # above is not applied) because its snapshot is already stale. With
            # IMMEDIATE every transaction queues for the lock, for up to `timeout`.
            "transaction_mode": "IMMEDIATE",
        }
    )

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_fencedjobs",
    "django_tasks_db",  # the task queue's table, and `manage.py db_worker`
    "example_project.demo",  # app label "demo"
]

# Django's Tasks framework: built in from Django 6.0 (django.tasks), the django-tasks
# backport on 5.2 (both read this setting). The backend is django-tasks-db's
# DatabaseBackend, on the default database, where the leases are too: a run's enqueue is
# a write of its fenced transaction, so each slot's task is enqueued exactly once
# (docs/tasks.md). The demo runs `manage.py db_worker` next to runjobs to execute them.
TASKS = {
    "default": {"BACKEND": "django_tasks_db.backend.DatabaseBackend"},
}

# TASKS_BACKEND=rq: the same task on RQ (django-tasks-rq, the `rq` extra), a queue in Redis
# outside the database. The run's enqueue is then recorded with the run as an outbox row in
# its fenced transaction and handed to RQ right after the commit (by any runner's relay if
# that fails); `manage.py rqworker --job-class django_tasks_rq.Job default` runs it, its
# write still fenced by the run. docs/demo.md, "The scheduled task on RQ".
TASKS_BACKEND = env.str("TASKS_BACKEND", default="db")
if TASKS_BACKEND == "rq":
    INSTALLED_APPS += ["django_rq", "django_tasks_rq"]
    RQ_QUEUES = {"default": {"URL": env.str("REDIS_URL", default="redis://127.0.0.1:6379/0")}}
    TASKS = {"default": {"BACKEND": "django_tasks_rq.RQBackend", "QUEUES": ["default"]}}
elif TASKS_BACKEND != "db":
    raise ImproperlyConfigured(f"TASKS_BACKEND must be db or rq, not {TASKS_BACKEND!r}")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

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

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"

FENCEDJOBS: dict[str, object] = {
    # The defaults suit the demo: the database's clock, "<hostname>:<pid>" as the owner.
    # Each change of a job's state mailed to ADMINS (docs/alerting.md, "Notifications"):
    # `manage.py demo` turns it on for its runner.
    "NOTIFY": env.bool("FENCEDJOBS_NOTIFY", default=False),
}

# Where notifications go. The console backend prints each message on the standard output
# of the process that sends it; set EMAIL_BACKEND (and EMAIL_HOST, ...) for real mail.
ADMINS = [("Ops", env.str("ADMIN_EMAIL", default="ops@example.com"))]
SERVER_EMAIL = env.str("SERVER_EMAIL", default="jobs@example.com")
EMAIL_BACKEND = env.str("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")

LOG_LEVEL = env.str("LOG_LEVEL", default="INFO")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {"()": "example_project.logging.JsonFormatter"},
    },
    "handlers": {
        "json_stderr": {
            "class": "logging.StreamHandler",
            "stream": "ext://sys.stderr",
            "formatter": "json",
        },
    },
    "loggers": {
        # One JSON object per line, with the fields the runner passes in `extra=`
        # (event, job, fence, owner, scheduled_for, outcome, items, batches, ...).
        "django_fencedjobs": {"handlers": ["json_stderr"], "level": LOG_LEVEL, "propagate": False},
        "example_project": {"handlers": ["json_stderr"], "level": LOG_LEVEL, "propagate": False},
    },
}
