"""Tasks the scheduled-task tests enqueue (tests/test_tasks*.py): module-level, so that a
worker process can import them by path."""

from __future__ import annotations

from importlib.util import find_spec

from django_fencedjobs import fenced_atomic
from tests.testapp.models import Write

if find_spec("django.tasks"):
    from django.tasks import task
else:
    from django_tasks import task


@task()
def record_write(job: str, seq: int) -> None:
    """Write one row, fenced by the run that enqueued this task."""
    with fenced_atomic():
        Write.objects.create(job=job, fence=-1, seq=seq)


@task()
def plain_write(job: str, seq: int) -> None:
    """Write one row, not fenced."""
    Write.objects.create(job=job, fence=-1, seq=seq)


@task()
def fail(message: str) -> None:
    raise RuntimeError(message)


@task(backend="immediate")
def immediate_write(job: str, seq: int) -> None:
    with fenced_atomic():
        Write.objects.create(job=job, fence=-1, seq=seq)
