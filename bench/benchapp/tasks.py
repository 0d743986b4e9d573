"""The task P8 enqueues (bench/p8_tasks.py): it does nothing, so that what is measured is
the enqueueing and the worker's pick-up, not the task."""

from __future__ import annotations

from importlib.util import find_spec

if find_spec("django.tasks"):
    from django.tasks import task
else:
    from django_tasks import task


@task()
def noop(seq: int) -> int:
    return seq
