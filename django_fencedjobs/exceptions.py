"""Every exception the public API raises.

One base class, :class:`FencedJobsError`. Each subclass's docstring is its
default message and says what to do about it.
"""

from __future__ import annotations


class FencedJobsError(Exception):
    """django-fencedjobs failed."""

    def __init__(self, message: str | None = None) -> None:
        # The docstring, on one line: it is wrapped for the source, not for a log line.
        super().__init__(message or " ".join((self.__doc__ or "").split()))


class ScheduleError(FencedJobsError, ValueError):
    """The schedule is invalid: give a 5-field cron expression or every=timedelta, and a named
    IANA zone such as "Europe/Berlin"."""


class JobDefinitionError(FencedJobsError, ValueError):
    """The @job declaration is invalid: fix the argument named in the message."""


class UnknownJob(FencedJobsError, LookupError):
    """No job is registered under this name: check the name with `manage.py runjobs --list`."""


class NotInRun(FencedJobsError, RuntimeError):
    """fenced_atomic and the Run helpers only work inside a job's handler, while its run holds
    the lease. In a unit test, call the job through django_fencedjobs.testing.run_job_now()."""


class FenceLost(FencedJobsError):
    """This run no longer holds the job's lease: another run took it over (the lease expired while
    this one was paused or slow) or the run was revoked on timeout. Nothing written in the
    fenced block was committed. Do not retry inside the handler: the run is over."""


class JobTimeout(FencedJobsError):
    """The run overran its timeout: its fence was revoked, so its writes can no longer commit.
    Raise the job's timeout, or make each run do less (max_batches)."""


class WatermarkError(FencedJobsError, ValueError):
    """The watermark can only move forward, inside fenced_atomic, in the run that owns it."""
