"""The task P8 enqueues on RQ (bench/p8_tasks.py): ``noop`` on the ``rq`` backend, which
bench/settings.py configures only when the benchmark has started a Redis server. Imported
only then: declaring a task checks that its backend exists."""

from __future__ import annotations

from importlib.util import find_spec

if find_spec("django.tasks"):
    from django.tasks import task
else:
    from django_tasks import task


@task(backend="rq")
def rq_noop(seq: int) -> int:
    return seq
