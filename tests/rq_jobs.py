"""The jobs tests/test_tasks_rq.py runs, and the runner processes that run them.

    python -m tests.rq_jobs JOB [JOB ...]

runs ``runjobs --once`` over the named jobs in a process of its own, with the environment
the test gives it (``rq_env``: its test database, tests.rq_settings, its Redis server).

Declared by :func:`register`, never at import (as tests/faults/jobs.py's): the runner calls
it in the child, the test inside ``registry.isolated()``. A handler imports its task when it
runs: the task module needs the RQ backend, which only tests.rq_settings configures.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the package's models need Django set up, which main() does first
    from django_fencedjobs import Run

#: A run enqueues one :func:`tests.rq_tasks.fenced_write` of its fence, on the RQ backend.
RQ_FENCED_WRITE = "rq.fenced_write"

#: A run enqueues :data:`FAN_OUT` :func:`tests.rq_tasks.fenced_write` tasks (seq 0, 1, ...)
#: in one fenced block: one batch hand-over (tests/test_tasks_rq_batch.py).
RQ_FAN_OUT = "rq.fan_out"
FAN_OUT = 120

HOURLY = timedelta(hours=1)


def enqueue_fenced_write(run: Run) -> None:
    from tests.rq_tasks import fenced_write

    run.enqueue(fenced_write, run.job.name, run.fence)


def enqueue_fan_out(run: Run) -> None:
    from django_fencedjobs import fenced_atomic
    from tests.rq_tasks import fenced_write

    with fenced_atomic():
        for seq in range(FAN_OUT):
            run.enqueue(fenced_write, run.job.name, seq)


def register() -> None:
    """Declare the jobs in the current registry. Idempotent (same functions, same names)."""
    from django_fencedjobs import job

    job(every=HOURLY, name=RQ_FENCED_WRITE, timeout=timedelta(minutes=5))(enqueue_fenced_write)
    job(every=HOURLY, name=RQ_FAN_OUT, timeout=timedelta(minutes=5))(enqueue_fan_out)


#: The environment variable naming a marker file: while it exists, a hand-over waits right
#: before its claim (``relay.claim``), having created ``<marker>.reached``
#: (tests/test_tasks_rq_batch.py: a run's own hand-over and a relay that race).
HOLD_CLAIM_ENV = "FENCEDJOBS_TEST_HOLD_BEFORE_CLAIM"


def _hold_before_claim() -> None:
    """While ``$FENCEDJOBS_TEST_HOLD_BEFORE_CLAIM`` exists, wait at each claim of a
    hand-over, before its statement."""
    import time
    from pathlib import Path

    from django_fencedjobs.integrations import relay

    marker = os.environ.get(HOLD_CLAIM_ENV)
    if not marker:
        return
    claim = relay.claim

    def held(records):  # type: ignore[no-untyped-def]
        if os.path.exists(marker):
            Path(marker + ".reached").touch()
            deadline = time.monotonic() + 60
            while os.path.exists(marker) and time.monotonic() < deadline:
                time.sleep(0.02)
        return claim(records)

    relay.claim = held


def main(argv: list[str]) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.rq_settings")
    import django

    django.setup()
    from django.core.management import call_command

    register()
    _hold_before_claim()
    call_command("runjobs", "--once", *[word for name in argv for word in ("--job", name)])
    return 0


def relay_main() -> int:
    """One look of a runner's relay (``relay_pending``), as its chore does; prints how
    many tasks it handed over (``taken N``)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.rq_settings")
    import django

    django.setup()
    from django_fencedjobs.integrations.tasks import relay_pending

    _hold_before_claim()
    print(f"taken {relay_pending()}")
    return 0


def enqueue_plain_main() -> int:
    """Enqueue one :func:`tests.rq_tasks.fenced_write` by the task's own ``enqueue`` (the
    backend's, no run): prints its id, to compare its RQ job with a hand-over's."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.rq_settings")
    import django

    django.setup()
    from tests.rq_tasks import fenced_write

    print(fenced_write.enqueue("plain", 0).id)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


# -- fault tests (tests/test_tasks_rq_faults.py) ----------------------------------------------
#
#     python -c 'import sys, tests.rq_jobs as m; sys.exit(m.faults_main(sys.argv[1:]))' JOB
#
# runs ``runjobs --once`` over the named jobs with these jobs declared too; ``expire_main``
# does what an RQ worker's maintenance does once the executions of jobs whose worker died have
# expired.

#: Enqueues :func:`tests.rq_tasks.faulty_fenced_write` of its fence (tests/rq_backends.py's
#: backend, whose ``enqueue`` kills its process or waits while a marker file exists). A short
#: lease, so that the lease of a runner killed in that ``enqueue`` runs out within seconds.
RQ_FAULTY_WRITE = "rq.faulty_fenced_write"
#: Enqueue :func:`tests.rq_tasks.held_fenced_write` of its fence, held until released (files
#: in ``$FENCEDJOBS_TEST_RQ_DIR``): inside its fenced block, or after the block committed.
RQ_HELD_WRITE = "rq.held_fenced_write"
RQ_HELD_AFTER_COMMIT = "rq.held_after_commit"
#: The directory of the held tasks' files, given to the runners.
HELD_DIR_ENV = "FENCEDJOBS_TEST_RQ_DIR"


def enqueue_faulty_fenced_write(run: Run) -> None:
    from tests.rq_tasks import faulty_fenced_write

    run.enqueue(faulty_fenced_write, run.job.name, run.fence)


def enqueue_held_fenced_write(run: Run) -> None:
    from tests.rq_tasks import held_fenced_write

    directory = os.environ[HELD_DIR_ENV]
    commit_first = run.job.name == RQ_HELD_AFTER_COMMIT
    run.enqueue(held_fenced_write, run.job.name, run.fence, directory, commit_first)


def register_faults() -> None:
    """Declare the fault tests' jobs in the current registry. Idempotent."""
    from django_fencedjobs import job

    job(
        every=HOURLY,
        name=RQ_FAULTY_WRITE,
        timeout=timedelta(minutes=5),
        lease_ttl=timedelta(seconds=2),
    )(enqueue_faulty_fenced_write)
    for name in (RQ_HELD_WRITE, RQ_HELD_AFTER_COMMIT):
        job(every=HOURLY, name=name, timeout=timedelta(minutes=5))(enqueue_held_fenced_write)


def faults_main(argv: list[str]) -> int:
    """:func:`main` with the fault tests' jobs declared too."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.rq_settings")
    import django

    django.setup()
    from django.core.management import call_command

    register()
    register_faults()
    call_command("runjobs", "--once", *[word for name in argv for word in ("--job", name)])
    return 0


def expire_main(queue_name: str = "default") -> int:
    """What an RQ worker's maintenance (``clean_registries``, at its start and every 10
    minutes) does to a job whose worker died in it, once the job's execution has expired
    (its last heartbeat plus RQ's heartbeat TTL, 90 s by default): run now, as if the clock
    had passed the latest expiry in the queue's ``StartedJobRegistry``. RQ calls the job's
    failure callback (django-tasks-rq's reports the task failed) and, the job having no
    retries left, moves it to the ``FailedJobRegistry``. Prints the ids it moved."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.rq_settings")
    import django

    django.setup()
    import logging

    import django_rq
    from django_tasks_rq import Job as TaskJob

    # What RQ says of each job (and of a failure callback that raised), and a report of the
    # task's end that could not be recorded, on stderr.
    for logger in ("rq", "django_fencedjobs"):
        logging.getLogger(logger).addHandler(logging.StreamHandler())
    from rq.registry import StartedJobRegistry

    queue = django_rq.get_queue(queue_name, job_class=TaskJob)
    started = StartedJobRegistry(
        name=queue.name,
        connection=queue.connection,
        job_class=queue.job_class,
        serializer=queue.serializer,
    )
    scores = [score for _, score in queue.connection.zrange(started.key, 0, -1, withscores=True)]
    if not scores:
        return 0
    expired = started.get_expired_job_ids(max(scores) + 1)
    started.cleanup(timestamp=max(scores) + 1)
    print(*expired)
    return 0
