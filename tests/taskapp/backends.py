"""A task backend for the fault tests: the built-in ``ImmediateBackend``, except that it
kills its own process (SIGKILL) on ``enqueue`` while a marker file exists.

``run.enqueue`` hands a task to a backend that does not write to the lease database right
after the run's transaction commits. Killing the process inside ``enqueue`` is the crash
between that commit and the hand-over: the run's record of the task is committed
(``pending``), the backend never got the task.
"""

from __future__ import annotations

import os
import signal
from importlib.util import find_spec
from typing import Any

if find_spec("django.tasks"):
    from django.tasks.backends.immediate import ImmediateBackend
else:
    from django_tasks.backends.immediate import ImmediateBackend

#: The environment variable naming the marker file (absolute path).
KILL_MARKER_ENV = "FENCEDJOBS_TEST_KILL_ON_ENQUEUE"


class KillOnEnqueueBackend(ImmediateBackend):
    """``ImmediateBackend`` whose ``enqueue`` SIGKILLs the calling process while the file
    named by ``$FENCEDJOBS_TEST_KILL_ON_ENQUEUE`` exists."""

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        marker = os.environ.get(KILL_MARKER_ENV)
        if marker and os.path.exists(marker):
            os.kill(os.getpid(), signal.SIGKILL)
        return super().enqueue(task, args, kwargs)
