"""Tasks on the RQ backend (``rq``, tests/rq_settings.py) that tests/test_tasks_rq.py's jobs
enqueue: module-level, so that an ``rqworker`` process imports them by path.

Imported only by processes that run with tests.rq_settings (the runners and the workers):
declaring a task checks its backend, which the suite's own settings do not have.
"""

from __future__ import annotations

from importlib.util import find_spec

from django_fencedjobs import fenced_atomic
from tests.testapp.models import Write

if find_spec("django.tasks"):
    from django.tasks import task
else:
    from django_tasks import task


@task(backend="rq")
def fenced_write(job: str, seq: int) -> None:
    """Write one row, fenced by the run that enqueued this task."""
    with fenced_atomic():
        Write.objects.create(job=job, fence=-1, seq=seq)


# -- fault tests (tests/test_tasks_rq_faults.py) ----------------------------------------------


@task(backend="rq_faulty")
def faulty_fenced_write(job: str, seq: int) -> None:
    """:func:`fenced_write` on the RQ backend whose ``enqueue`` can kill its process or wait
    (tests/rq_backends.py)."""
    with fenced_atomic():
        Write.objects.create(job=job, fence=-1, seq=seq)


@task(backend="rq")
def held_fenced_write(job: str, seq: int, directory: str, commit_first: bool) -> None:
    """One fenced write, held until the file ``release`` exists in ``directory``, having
    created ``task-held`` there: held inside the fenced block with its write not committed,
    or (``commit_first``) after the block committed it."""
    import time
    from pathlib import Path

    here = Path(directory)

    def hold() -> None:
        (here / "task-held").touch()
        while not (here / "release").exists():
            time.sleep(0.02)

    with fenced_atomic():
        Write.objects.create(job=job, fence=-1, seq=seq)
        if not commit_first:
            hold()
    if commit_first:
        hold()
