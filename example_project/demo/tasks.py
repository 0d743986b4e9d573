"""The demo's ``django.tasks`` task: run by a worker (``manage.py db_worker``), enqueued by
the scheduled job ``demo.write_digest`` (declared in ``jobs.py`` with ``schedule_task``).

The framework is ``django.tasks`` on Django 6 and the ``django-tasks`` backport on 5.2;
the backend is django-tasks-db's ``DatabaseBackend`` on the demo's own database
(``TASKS`` in ``example_project/settings.py``), so each run's enqueue commits with the run
(exactly once per slot) and the worker finds the task in the same database.
"""

from __future__ import annotations

import os
from importlib.util import find_spec
from typing import Any

from django.db.models import Q
from django.utils import timezone

from django_fencedjobs import fenced_atomic
from django_fencedjobs.models import RunTask, TaskDelivery
from example_project.demo.models import Digest, Reminder

if find_spec("django.tasks") is not None:  # Django 6.0+
    from django.tasks import TaskContext, task
else:  # Django 5.2: the backport
    from django_tasks import TaskContext, task  # type: ignore[no-redef,unused-ignore]


@task(takes_context=True)
def write_digest(context: TaskContext) -> dict[str, Any]:
    """Count the reminders sent and still pending, and record it as a ``Digest`` row.

    The write is fenced by the run that enqueued this task: it commits only while no later
    run of ``demo.write_digest`` has been granted the lease (after that it raises
    ``FenceLost`` and writes nothing).
    """
    backend, result_id = context.task_result.backend, str(context.task_result.id)
    with fenced_atomic():
        # By its id, or by its delivery's: on a backend outside the database (RQ) the
        # worker may start the task before the run has written the id on its record.
        delivered = TaskDelivery.objects.filter(backend=backend, result_id=result_id)
        record = RunTask.objects.only("fence").get(
            Q(result_id=result_id) | Q(pk__in=delivered.values("task_id")), backend=backend
        )
        digest = Digest.objects.create(
            written_at=timezone.now(),
            reminders_sent=Reminder.objects.exclude(sent_at=None).count(),
            reminders_pending=Reminder.objects.filter(sent_at=None).count(),
            worker_pid=os.getpid(),
            fence=record.fence,
        )
    return {"digest": digest.pk, "worker_pid": digest.worker_pid}
