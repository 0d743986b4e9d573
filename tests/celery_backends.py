"""A django-tasks-fennel backend with a fault on ``enqueue``, for tests/test_tasks_celery.py.

:class:`FaultyCeleryBackend` is django-tasks-fennel's ``CeleryBackend``, except that its
``enqueue`` (the hand-over, right after a run's transaction committed, or the relay's)
SIGKILLs its process while the file named by ``$FENCEDJOBS_TEST_KILL_ON_ENQUEUE`` exists (as
tests/taskapp/backends.py's ``KillOnEnqueueBackend``), before anything reached the broker:
the run's record of the task is committed (``pending``), Celery never got the task.

Imported only by processes that run with tests.celery_settings.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from django_tasks_fennel import CeleryBackend

from tests.taskapp.backends import KILL_MARKER_ENV


class FaultyCeleryBackend(CeleryBackend):
    """``CeleryBackend`` whose ``enqueue`` SIGKILLs its process while the kill marker exists."""

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        marker = os.environ.get(KILL_MARKER_ENV)
        if marker and os.path.exists(marker):
            os.kill(os.getpid(), signal.SIGKILL)
        return super().enqueue(task, args, kwargs)
