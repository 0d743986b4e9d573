"""tests.settings plus an RQ task backend (django-tasks-rq on django-rq), for the processes
tests/test_tasks_rq.py starts: the runners that enqueue and the ``rqworker`` workers.

The Redis server is the test's own throwaway one (tests/redis_harness.py), named by
``$FENCEDJOBS_TEST_REDIS_URL``. Not in tests.settings: the suite's own process and its other
processes never talk to Redis, and a settings module that names a Redis server nobody started
would make every process that touched the backend wait on a connection that cannot succeed.
"""

import os

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS, LOGGING, TASKS

INSTALLED_APPS = [*INSTALLED_APPS, "django_rq", "django_tasks_rq"]

#: Unset: a port nothing listens on, so that a process started without it fails at once
#: ("connection refused") instead of finding some other Redis.
REDIS_URL = os.environ.get("FENCEDJOBS_TEST_REDIS_URL", "redis://127.0.0.1:1/0")

#: The queue's class puts faults on enqueueing while a test's marker file exists
#: (tests/rq_backends.py); without one it is django-rq's own.
RQ_QUEUES = {"default": {"URL": REDIS_URL, "QUEUE_CLASS": "tests.rq_backends.FaultyQueue"}}

TASKS = {**TASKS, "rq": {"BACKEND": "django_tasks_rq.RQBackend", "QUEUES": ["default"]}}

# The workers' own account (each job taken, its outcome) in their output, which the tests show
# when a wait fails: rq logs to ``rq.worker``, and tests.settings sends everything else nowhere.
LOGGING = {
    **LOGGING,
    "handlers": {**LOGGING["handlers"], "stderr": {"class": "logging.StreamHandler"}},
    "loggers": {**LOGGING["loggers"], "rq.worker": {"handlers": ["stderr"], "level": "INFO"}},
}

# -- fault tests (tests/test_tasks_rq_faults.py) ----------------------------------------------
# A second django-tasks-rq backend on the same queue, whose jobs meet the queue's faults
# (tests/rq_backends.py) where the test sets a marker: the runner killed between its commit
# and the hand-over, and Redis stopped right before the hand-over.
TASKS = {
    **TASKS,
    "rq_faulty": {"BACKEND": "django_tasks_rq.RQBackend", "QUEUES": ["default"]},
}

# -- django-tasks-db installed but not an app (tests/test_tasks_rq_without_db_app.py) ---------
# FENCEDJOBS_TEST_WITHOUT_TASKS_DB=1: a project on RQ alone, which has django-tasks-db in its
# environment (a dependency of something else) but not in INSTALLED_APPS: its models cannot
# even be imported.
if os.environ.get("FENCEDJOBS_TEST_WITHOUT_TASKS_DB"):
    INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "django_tasks_db"]
    TASKS = {
        alias: conf for alias, conf in TASKS.items() if "django_tasks_db" not in conf["BACKEND"]
    }
    TASKS["default"] = TASKS["rq"]

# -- a task scheduled in settings (tests/test_tasks_settings.py) -------------------------------
# FENCEDJOBS_TEST_RQ_SCHEDULE=1: tests.rq_tasks.fenced_write in FENCEDJOBS["TASK_SCHEDULE"],
# hourly, as the job RQ_SCHEDULED names it.
if os.environ.get("FENCEDJOBS_TEST_RQ_SCHEDULE"):
    from datetime import timedelta

    FENCEDJOBS = {
        "TASK_SCHEDULE": {
            "tests.rq_tasks.fenced_write": {
                "every": timedelta(hours=1),
                "args": ["rq.scheduled", 1],
                "name": "rq.scheduled",
            }
        }
    }
