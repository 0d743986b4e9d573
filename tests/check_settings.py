"""tests.settings plus one app from tests/checkapps, for `manage.py check` in a subprocess.

FENCEDJOBS_CHECK_APP names the app (e.g. "e004"); FENCEDJOBS_CHECK_ROUTE_ELSEWHERE=1 routes
the app's tables to a second database; FENCEDJOBS_CHECK_CLOCK sets FENCEDJOBS["CLOCK"].
"""

import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES, INSTALLED_APPS

_app = os.environ.get("FENCEDJOBS_CHECK_APP")
if _app:
    INSTALLED_APPS = [*INSTALLED_APPS, f"tests.checkapps.{_app}"]

if os.environ.get("FENCEDJOBS_CHECK_ROUTE_ELSEWHERE"):
    DATABASES = {**DATABASES, "other": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
    DATABASE_ROUTERS = ["tests.check_settings.FencedJobsElsewhere"]

if os.environ.get("FENCEDJOBS_CHECK_CLOCK"):
    FENCEDJOBS = {"CLOCK": os.environ["FENCEDJOBS_CHECK_CLOCK"]}


class FencedJobsElsewhere:
    def db_for_write(self, model, **hints):
        return "other" if model._meta.app_label == "fencedjobs" else None

    db_for_read = db_for_write
