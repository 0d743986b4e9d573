"""Running a job by hand, now: ``manage.py runjobs --now NAME`` and
:func:`django_fencedjobs.testing.run_job_now`.

Such a run takes the real path: the job is made due now, and its lease is taken with the
same compare-and-set as a scheduled run's, so it never overlaps a run of the same job in
another process; it is recorded (a ``JobRun``), logged and signalled like any other, and
its writes are fenced. The schedule goes on as before: like every run, it moves the job's
next slot to the first one after now.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django_fencedjobs import clock, lease, runner
from django_fencedjobs.exceptions import FencedJobsError
from django_fencedjobs.models import JobLease, JobRun
from django_fencedjobs.registry import Job


def run_now(job: Job) -> JobRun:
    """Run ``job`` once, now, in this thread; return its recorded run (whatever its outcome).

    Raises :class:`FencedJobsError`, saying why in one line, when the run cannot start: the
    job is paused, or another run holds its lease. Then nothing is changed: the job is not
    made due, so no run is left queued behind the one that holds the lease.
    """
    now = clock.now()
    runner.sync([job], now)  # a job no runner has seen yet gets its row here
    _refuse_if_busy(job, now)
    lease.make_due(job.name, now)
    row = lease.read([job.name])[job.name]
    record = runner.run_job(job, row)
    if record is None:  # another runner took the lease between the check and now
        _refuse_if_busy(job, clock.now())
        raise FencedJobsError(
            f"job {job.name!r} could not be run now: another runner took its lease first"
        )
    return record


def _refuse_if_busy(job: Job, now: datetime) -> None:
    paused, owner, until = (
        JobLease.objects.using(lease.lease_db())
        .filter(name=job.name)
        .values_list("paused", "owner", "lease_until")
        .get()
    )
    if paused:
        raise FencedJobsError(f"job {job.name!r} is paused: resume it (in the admin) to run it")
    if until >= now:
        raise FencedJobsError(
            f"job {job.name!r} is running elsewhere: its lease is held by "
            f"{owner or 'another runner'} until {until.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
        )


__all__ = ["run_now"]
