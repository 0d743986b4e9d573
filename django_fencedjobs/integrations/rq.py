"""Tasks for RQ handed over in one round trip: the batch form of a hand-over.

django-tasks-rq's ``RQBackend.enqueue`` takes one task per round trip to Redis. A run that
fans out to thousands hands them over here: the same RQ jobs (django-tasks-rq's job class,
callbacks and meta, ``at_front`` for the highest priority), built by RQ's ``enqueue_many``
into one ``MULTI``/``EXEC`` pipeline per queue. Each job's id is chosen here (``prefix`` and
the record's id), so its delivery is recorded before the job exists. A task deferred with
``run_after``, or a synchronous queue, goes through the backend's own ``enqueue``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from importlib.util import find_spec
from typing import Any

from django_fencedjobs.models import RunTask


def takes(task: Any) -> bool:
    """Whether ``task`` can be handed over in a batch: django-tasks-rq's backend (a
    subclass that enqueues its own way is left to its ``enqueue``), not deferred, its queue
    asynchronous."""
    if task.run_after is not None or find_spec("django_tasks_rq") is None:
        return False
    from django_tasks_rq.backend import RQBackend

    backend = task.get_backend()
    if not isinstance(backend, RQBackend) or type(backend).enqueue is not RQBackend.enqueue:
        return False
    from django_rq.settings import QUEUES

    # The queue's setting, as django-rq reads it, without building a queue (a connection).
    return bool(QUEUES[task.queue_name].get("ASYNC", True))


def hand_over(tasks: Sequence[tuple[RunTask, Any]], prefix: str) -> None:
    """Enqueue ``tasks`` (each with its record) on RQ, the job of each with the id
    ``prefix`` + its record's id: one pipeline, one round trip, per queue. Raises what
    Redis raises; a queue whose pipeline failed enqueued nothing (``MULTI``/``EXEC``)."""
    import django_rq
    from django_tasks.base import TASK_MAX_PRIORITY
    from django_tasks_rq.backend import Job, failed_callback, success_callback
    from rq import Callback, Queue

    on_failure, on_success = Callback(failed_callback), Callback(success_callback)
    by_queue: dict[str, list[Any]] = defaultdict(list)
    valid: set[Any] = set()
    for record, task in tasks:
        if task not in valid:
            task.get_backend().validate_task(task)
            valid.add(task)
        call = record.call or {}
        by_queue[task.queue_name].append(
            Queue.prepare_data(
                task.module_path,
                args=list(call.get("args", ())),
                kwargs=dict(call.get("kwargs", {})),
                job_id=f"{prefix}{record.pk}",
                at_front=task.priority == TASK_MAX_PRIORITY,
                meta={"backend_name": task.backend},
                on_failure=on_failure,
                on_success=on_success,
            )
        )
    for name, jobs in by_queue.items():
        queue = django_rq.get_queue(name, job_class=Job)
        with queue.connection.pipeline() as pipe:
            queue.enqueue_many(jobs, pipeline=pipe)
            pipe.execute()
    _tell_enqueued(tasks, prefix)


def _tell_enqueued(tasks: Sequence[tuple[RunTask, Any]], prefix: str) -> None:
    """Send ``task_enqueued`` for each task, as the backend's ``enqueue`` does, when anyone
    listens (django-tasks itself does, to log it)."""
    from django_tasks.base import TaskResult, TaskResultStatus
    from django_tasks.signals import task_enqueued

    from django_fencedjobs import clock

    now = None
    for record, task in tasks:
        sender = type(task.get_backend())
        if not task_enqueued.has_listeners(sender):
            continue
        call = record.call or {}
        now = now or clock.now()
        result: TaskResult[Any] = TaskResult(
            task=task,
            id=f"{prefix}{record.pk}",
            status=TaskResultStatus.READY,
            enqueued_at=now,
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=list(call.get("args", ())),
            kwargs=dict(call.get("kwargs", {})),
            backend=task.backend,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(sender, task_result=result)
