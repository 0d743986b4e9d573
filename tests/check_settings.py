"""tests.settings plus one app from tests/checkapps, for `manage.py check` in a subprocess.

FENCEDJOBS_CHECK_APP names the app (e.g. "e004"); FENCEDJOBS_CHECK_ROUTE_ELSEWHERE=1 routes
the app's tables to a second database; FENCEDJOBS_CHECK_ISOLATION=1 sets the default
database's isolation level to REPEATABLE READ; FENCEDJOBS_CHECK_CLOCK sets FENCEDJOBS["CLOCK"];
FENCEDJOBS_CHECK_SETTINGS replaces FENCEDJOBS with a Python expression (``timedelta`` is in
scope), e.g. ``{"LOOP_MAX_SLEEP": 30}``; FENCEDJOBS_CHECK_LOGGING and FENCEDJOBS_CHECK_SQLITE
are described where they are read, below.
"""

import os
from datetime import timedelta

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES, INSTALLED_APPS

_app = os.environ.get("FENCEDJOBS_CHECK_APP")
if _app:
    INSTALLED_APPS = [*INSTALLED_APPS, f"tests.checkapps.{_app}"]

if os.environ.get("FENCEDJOBS_CHECK_ROUTE_ELSEWHERE"):
    DATABASES = {**DATABASES, "other": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
    DATABASE_ROUTERS = ["tests.check_settings.FencedJobsElsewhere"]

if os.environ.get("FENCEDJOBS_CHECK_ISOLATION"):
    _default = DATABASES["default"]
    _options = {**_default.get("OPTIONS", {}), "isolation_level": 3}  # REPEATABLE READ
    DATABASES = {**DATABASES, "default": {**_default, "OPTIONS": _options}}

if os.environ.get("FENCEDJOBS_CHECK_CLOCK"):
    FENCEDJOBS = {"CLOCK": os.environ["FENCEDJOBS_CHECK_CLOCK"]}

if os.environ.get("FENCEDJOBS_CHECK_SETTINGS"):
    FENCEDJOBS = eval(os.environ["FENCEDJOBS_CHECK_SETTINGS"], {"timedelta": timedelta})


class FencedJobsElsewhere:
    def db_for_write(self, model, **hints):
        return "other" if model._meta.app_label == "fencedjobs" else None

    db_for_read = db_for_write


# FENCEDJOBS_CHECK_LOGGING: "none" leaves LOGGING out, as in a new project (Django's own
# defaults only); "handler" gives the django_fencedjobs logger a handler of its own;
# "root" gives the root logger one (the fencedjobs logger propagates to it).
_logging = os.environ.get("FENCEDJOBS_CHECK_LOGGING")
if _logging == "none":
    LOGGING: dict = {}
elif _logging in ("handler", "root"):
    _handler = {
        "class": "logging.StreamHandler",
        "stream": "ext://sys.stderr",
        "formatter": "mine",
    }
    LOGGING = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"mine": {"format": "MINE %(levelname)s %(message)s"}},
        "handlers": {"mine": _handler},
        **(
            {"loggers": {"django_fencedjobs": {"handlers": ["mine"], "level": "INFO"}}}
            if _logging == "handler"
            else {"root": {"handlers": ["mine"], "level": "INFO"}}
        ),
    }

# FENCEDJOBS_CHECK_SQLITE: the default database is this SQLite file, with
# FENCEDJOBS_CHECK_SQLITE_OPTIONS (a Python expression) as its OPTIONS.
if os.environ.get("FENCEDJOBS_CHECK_SQLITE"):
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ["FENCEDJOBS_CHECK_SQLITE"],
            "OPTIONS": eval(os.environ.get("FENCEDJOBS_CHECK_SQLITE_OPTIONS", "{}")),
        }
    }
