"""Helpers for testing your jobs (docs/writing-jobs.md, "Testing your job").

``run_job_now`` runs a job once through the real path (lease, fence, run record), so a
test exercises exactly what production does. Use a transactional test
(``django_db(transaction=True)``, ``TransactionTestCase``): the run's supervisor thread
renews the lease on its own database connection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django_fencedjobs import instances, manual
from django_fencedjobs.exceptions import FencedJobsError
from django_fencedjobs.models import JobRun
from django_fencedjobs.registry import Job


def run_job_now(job: str | Job | Callable[..., Any]) -> JobRun:
    """Make ``job`` due now and run it once; returns its recorded run.

    ``job`` is a name, a :class:`Job`, or the decorated function. Raises
    :class:`FencedJobsError` when the job is paused or another run holds its lease (a
    ``runjobs`` process using this database, or an earlier run that has not finished).
    The same path as ``manage.py runjobs --now NAME``.
    """
    return manual.run_now(_resolve(job))


def _resolve(job: str | Job | Callable[..., Any]) -> Job:
    if isinstance(job, Job):
        return job
    if isinstance(job, str):
        return instances.get_job(job)  # declared, or an instance by its name job[key]
    declared = getattr(job, "job", None)
    if not isinstance(declared, Job):
        raise FencedJobsError(
            f"run_job_now({job!r}): pass a job's name, a Job, or a function decorated with @job"
        )
    return declared
