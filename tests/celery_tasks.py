"""Tasks on django-tasks-fennel's Celery backend (``celery``, tests/celery_settings.py) that
tests/test_tasks_celery.py's jobs enqueue: module-level, so that a Celery worker registers
them (``--include tests.celery_tasks``). django-tasks-fennel registers each one in Celery's
registry as ``django_tasks:<its module path>`` when it is declared.

Imported only by processes that run with tests.celery_settings (the runners and the
workers): declaring a task checks its backend, which the suite's own settings do not have.
"""

from __future__ import annotations

from importlib.util import find_spec

from django_fencedjobs import fenced_atomic
from tests.testapp.models import Write

# django-tasks-fennel uses the framework built into Django 6, and the backport on 5.2.
if find_spec("django.tasks"):
    from django.tasks import task
else:
    from django_tasks import task


@task(backend="celery")
def fenced_write(job: str, seq: int) -> None:
    """Write one row, fenced by the run that enqueued this task."""
    with fenced_atomic():
        Write.objects.create(job=job, fence=-1, seq=seq)


@task(backend="celery_faulty")
def faulty_fenced_write(job: str, seq: int) -> None:
    """:func:`fenced_write` on the Celery backend whose ``enqueue`` can kill its process
    (tests/celery_backends.py)."""
    with fenced_atomic():
        Write.objects.create(job=job, fence=-1, seq=seq)
