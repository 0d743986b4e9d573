"""Task backends for the scheduled-task tests.

``run.enqueue`` hands a task to a backend that does not write to the lease database right
after the run's transaction commits, then records the backend's id of it.

* :class:`KillOnEnqueueBackend` (the fault tests): the built-in ``ImmediateBackend``, except
  that it kills its own process (SIGKILL) on ``enqueue`` while a marker file exists: the
  crash between that commit and the hand-over. The run's record of the task is committed
  (``pending``), the backend never got the task.
* :class:`FastWorkerBackend` (in process): a remote backend whose worker starts and
  finishes the task before the runner has recorded the task's id.
"""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from importlib.util import find_spec
from typing import Any

from django.utils import timezone

if find_spec("django.tasks"):
    from django.tasks import TaskResult, TaskResultStatus
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.backends.immediate import ImmediateBackend
    from django.tasks.signals import task_finished, task_started
    from django.utils.crypto import get_random_string as _random

    def get_random_id() -> str:
        return _random(32)
else:
    from django_tasks import TaskResult, TaskResultStatus
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.backends.immediate import ImmediateBackend
    from django_tasks.signals import task_finished, task_started
    from django_tasks.utils import get_random_id

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


class FastWorkerBackend(BaseTaskBackend):
    """A remote backend with a worker faster than the runner.

    ``enqueue`` queues the task (``READY``). Its worker, elsewhere, starts it as soon as it is
    queued: when the runner reads the task back (``get_result``) it reads it ``RUNNING``, and
    right after that read the worker finishes it and reports its start and its end
    (``task_started``, ``task_finished``, as a worker process sends them), all before the
    runner has recorded the task's id. The task's function is not called (its worker is
    imaginary); its outcome is a success.
    """

    supports_get_result = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.results: dict[str, Any] = {}

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        self.validate_task(task)
        result = TaskResult(
            task=task,
            id=get_random_id(),
            status=TaskResultStatus.READY,
            enqueued_at=timezone.now(),
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=list(args),
            kwargs=dict(kwargs),
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        self.results[result.id] = result
        return result

    def get_result(self, result_id: str) -> Any:
        queued = self.results[result_id]
        started = timezone.now()
        running = replace(
            queued,
            status=TaskResultStatus.RUNNING,
            started_at=started,
            last_attempted_at=started,
            worker_ids=["fast-worker"],
        )
        task_started.send(type(self), task_result=running)
        finished = replace(running, status=TaskResultStatus.SUCCESSFUL, finished_at=timezone.now())
        task_finished.send(type(self), task_result=finished)
        self.results[result_id] = finished
        return running  # as read, just before the worker finished it


class FlakyBackend(ImmediateBackend):
    """``ImmediateBackend`` that refuses the next :attr:`refusals` enqueues (a broker that is
    down), in this process."""

    refusals = 0

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        if FlakyBackend.refusals > 0:
            FlakyBackend.refusals -= 1
            raise ConnectionError("the broker is down")
        return super().enqueue(task, args, kwargs)
