"""The jobs tests/test_tasks_celery.py runs, and the runner processes that run them.

    python -m tests.celery_jobs JOB [JOB ...]

runs ``runjobs --once`` over the named jobs in a process of its own, with the environment
the test gives it (``celery_env``: its test database, tests.celery_settings, its Redis
server).

Declared by :func:`register`, never at import (as tests/rq_jobs.py's): the runner calls it
in the child, the test inside ``registry.isolated()``. A handler imports its task when it
runs: the task module needs the Celery backend, which only tests.celery_settings configures.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the package's models need Django set up, which main() does first
    from django_fencedjobs import Run

#: A run enqueues one :func:`tests.celery_tasks.fenced_write` of its fence, on the Celery
#: backend.
CELERY_FENCED_WRITE = "celery.fenced_write"
#: Enqueues :func:`tests.celery_tasks.faulty_fenced_write` of its fence (tests/celery_backends.py's
#: backend, whose ``enqueue`` kills its process while a marker file exists). A short lease,
#: so that the lease of a runner killed in that ``enqueue`` runs out within seconds.
CELERY_FAULTY_WRITE = "celery.faulty_fenced_write"

HOURLY = timedelta(hours=1)


def enqueue_fenced_write(run: Run) -> None:
    from tests.celery_tasks import fenced_write

    run.enqueue(fenced_write, run.job.name, run.fence)


def enqueue_faulty_fenced_write(run: Run) -> None:
    from tests.celery_tasks import faulty_fenced_write

    run.enqueue(faulty_fenced_write, run.job.name, run.fence)


def register() -> None:
    """Declare the jobs in the current registry. Idempotent (same functions, same names)."""
    from django_fencedjobs import job

    job(every=HOURLY, name=CELERY_FENCED_WRITE, timeout=timedelta(minutes=5))(enqueue_fenced_write)
    job(
        every=HOURLY,
        name=CELERY_FAULTY_WRITE,
        timeout=timedelta(minutes=5),
        lease_ttl=timedelta(seconds=2),
    )(enqueue_faulty_fenced_write)


def main(argv: list[str]) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.celery_settings")
    import django

    django.setup()
    from django.core.management import call_command

    register()
    call_command("runjobs", "--once", *[word for name in argv for word in ("--job", name)])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
