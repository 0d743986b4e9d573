"""Tasks the scheduled-task tests enqueue (tests/test_tasks*.py): module-level, so that a
worker process can import them by path."""

from __future__ import annotations

import os
import time
from importlib.util import find_spec
from pathlib import Path

from django.db import connection

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


#: What :func:`immediate_note` was called with, in this process, in order, and whether a
#: transaction was open on the database when it ran: a side effect that no transaction rolls
#: back, so a test sees whether (and when) the task ran at all.
NOTES: list[tuple[str, int, bool]] = []


@task(backend="immediate")
def immediate_note(job: str, seq: int) -> None:
    """Note the call (outside any transaction), then write one row fenced by its run."""
    NOTES.append((job, seq, connection.in_atomic_block))
    with fenced_atomic():
        Write.objects.create(job=job, fence=-1, seq=seq)


@task()
def block_until(job: str, seq: int, started: str, release: str) -> None:
    """Create the file ``started``, wait (at most a minute) for the file ``release``, then
    write one row fenced by its run: a task a test can catch in the middle (and SIGKILL its
    worker there)."""
    Path(started).touch()
    deadline = time.monotonic() + 60
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.01)
    with fenced_atomic():
        Write.objects.create(job=job, fence=-1, seq=seq)


@task(backend="killable")
def handed_over_write(job: str, seq: int) -> None:
    """One fenced write, on the backend that can kill the process handing it over
    (:class:`tests.taskapp.backends.KillOnEnqueueBackend`)."""
    with fenced_atomic():
        Write.objects.create(job=job, fence=-1, seq=seq)


@task()
def hold_in_fence(job: str, seq: int, entered: str, release: str) -> None:
    """Write one row fenced by its run and, still inside the fenced block (the lease row
    locked), create the file ``entered`` and wait (at most a minute) for the file
    ``release``: a task a test can pause in the middle of its fenced transaction."""
    with fenced_atomic():
        Write.objects.create(job=job, fence=-1, seq=seq)
        Path(entered).touch()
        deadline = time.monotonic() + 60
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.01)


@task(backend="flaky")
def flaky_write(job: str, seq: int) -> None:
    with fenced_atomic():
        Write.objects.create(job=job, fence=-1, seq=seq)
