"""An RQ queue with faults on enqueueing, for tests/test_tasks_rq_faults.py.

:class:`FaultyQueue` is django-rq's queue (``RQ_QUEUES``'s ``QUEUE_CLASS`` in
tests/rq_settings.py), except when a job is put on it (django-tasks-rq's ``enqueue``, one
task, or a batch hand-over's ``enqueue_many``: both forms meet the same faults) while a
marker file exists:

* ``$FENCEDJOBS_TEST_KILL_ON_ENQUEUE`` (as tests/taskapp/backends.py's
  ``KillOnEnqueueBackend``): the process SIGKILLs itself, before anything reached Redis. The
  run's record of the task is committed (``pending``); RQ never got the task.
* ``$FENCEDJOBS_TEST_HOLD_ON_ENQUEUE``: it creates ``<marker>.reached`` and waits until the
  marker is removed, then enqueues: the test does what it wants to Redis (stops it) in
  between.

Without a marker it is django-rq's queue; the workers use it too, and never enqueue.
Imported only by processes that run with tests.rq_settings (django-rq needs its queues).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from django_rq.queues import DjangoRQ

from tests.taskapp.backends import KILL_MARKER_ENV

#: The environment variable naming the hold marker file (absolute path).
HOLD_MARKER_ENV = "FENCEDJOBS_TEST_HOLD_ON_ENQUEUE"
#: How long a held enqueue waits for its marker to go before it gives up (and raises).
HOLD_WAIT = 60.0


def reached(marker: Path) -> Path:
    """The file a held enqueue creates when it reaches the hold."""
    return marker.with_name(marker.name + ".reached")


def _fault() -> None:
    kill = os.environ.get(KILL_MARKER_ENV)
    if kill and os.path.exists(kill):
        os.kill(os.getpid(), signal.SIGKILL)
    hold = os.environ.get(HOLD_MARKER_ENV)
    if hold and os.path.exists(hold):
        reached(Path(hold)).touch()
        deadline = time.monotonic() + HOLD_WAIT
        while os.path.exists(hold):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the hold marker {hold} was never removed")
            time.sleep(0.02)


class FaultyQueue(DjangoRQ):
    """django-rq's queue, which SIGKILLs its process while the kill marker exists, and
    waits while the hold marker exists, when a job is put on it."""

    def enqueue_job(self, *args: Any, **kwargs: Any) -> Any:
        _fault()
        return super().enqueue_job(*args, **kwargs)

    def enqueue_many(self, *args: Any, **kwargs: Any) -> Any:
        _fault()
        return super().enqueue_many(*args, **kwargs)
