"""tests.settings plus a Celery task backend (django-tasks-fennel), for the processes
tests/test_tasks_celery.py starts: the runners that enqueue and the ``celery worker`` workers.

Celery's broker and result backend are the test's own throwaway Redis server
(tests/redis_harness.py), named by ``$FENCEDJOBS_TEST_REDIS_URL``. Not in tests.settings, for
the reason tests/rq_settings.py gives: a settings module that names a Redis server nobody
started would make every process that touched the backend wait on a connection that cannot
succeed.

The Celery app is django-tasks-fennel's own (``django_tasks_fennel.app``): it reads the
``CELERY_`` settings below, and its app config makes it the current app of a process that
has none (a runner), so that the backend's ``enqueue`` sends to this broker.
"""

import os

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS, TASKS

INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks_fennel"]

#: Unset: a port nothing listens on, so that a process started without it fails at once
#: ("connection refused") instead of finding some other Redis.
REDIS_URL = os.environ.get("FENCEDJOBS_TEST_REDIS_URL", "redis://127.0.0.1:1/0")

CELERY_BROKER_URL = REDIS_URL
# The backend's get_result() reads the task's state here (the runner reads it back right
# after the hand-over); extended results name the worker that ran it.
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_RESULT_EXTENDED = True
# A broker that is not there is an error at once, not minutes of retries: a hand-over that
# cannot reach Redis fails, and the record says so.
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = False
CELERY_BROKER_CONNECTION_MAX_RETRIES = 0
# The worker's own account of each task (received, succeeded, failed) in its output.
CELERY_WORKER_HIJACK_ROOT_LOGGER = True

TASKS = {**TASKS, "celery": {"BACKEND": "django_tasks_fennel.CeleryBackend", "QUEUES": ["default"]}}

# -- fault tests ------------------------------------------------------------------------------
# django-tasks-fennel's backend that SIGKILLs its process in ``enqueue`` while a marker file
# exists (tests/celery_backends.py): the runner killed between its commit and the hand-over.
TASKS = {
    **TASKS,
    "celery_faulty": {
        "BACKEND": "tests.celery_backends.FaultyCeleryBackend",
        "QUEUES": ["default"],
    },
}
