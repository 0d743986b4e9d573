"""tests.settings plus one app from tests/checkapps, for `manage.py check` in a subprocess.

FENCEDJOBS_CHECK_APP names the app (e.g. "e004"); FENCEDJOBS_CHECK_ROUTE_ELSEWHERE=1 routes
the app's tables to a second database; FENCEDJOBS_CHECK_ISOLATION=1 sets the default
database's isolation level to REPEATABLE READ; FENCEDJOBS_CHECK_CLOCK sets FENCEDJOBS["CLOCK"];
FENCEDJOBS_CHECK_SETTINGS replaces FENCEDJOBS with a Python expression (``timedelta`` is in
scope), e.g. ``{"LOOP_MAX_SLEEP": 30}``.
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
