"""Every exception the public API raises (docs/api.md, "Exceptions"). :class:`FencedJobsError`
(an ``Exception``) for what the caller can handle; :class:`RunAborted` (a ``BaseException``)
for what ends a run, so that a handler's ``except Exception:`` cannot swallow the end of its
run. Each class's docstring is its default message and says what to do about it.
"""

from __future__ import annotations


def _docstring(exc: BaseException) -> str:
    """The class's docstring on one line: it is wrapped for the source, not for a log line."""
    return " ".join((type(exc).__doc__ or "").split())


class FencedJobsError(Exception):
    """django-fencedjobs failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or _docstring(self))


class RunAborted(BaseException):
    """The run is over: its handler must not go on. Not an ``Exception``, so that ``except
    Exception`` in a handler cannot swallow it; the runner records the run's outcome."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or _docstring(self))


class ScheduleError(FencedJobsError, ValueError):
    """The schedule is invalid: give a 5-field cron expression or every=timedelta, and a named
    IANA zone such as "Europe/Berlin"."""

    def __init__(
        self, message: str | None = None, *, argument: str | None = None, fixed_offset: bool = False
    ) -> None:
        super().__init__(message)
        #: The argument to fix: "cron", "every", "timezone", "jitter" or "key" of ``Schedule``,
        #: "after", "start", "end" or "limit" of its methods; None when not known.
        self.argument = argument
        #: True when ``timezone`` is a fixed UTC offset ("+02:00", "EST"), not an unknown name.
        self.fixed_offset = fixed_offset


class JobDefinitionError(FencedJobsError, ValueError):
    """The @job declaration is invalid: fix the argument named in the message."""


class UnknownJob(FencedJobsError, LookupError):
    """No job is registered under this name: check the name with `manage.py runjobs --list`."""


class NotInRun(FencedJobsError, RuntimeError):
    """fenced_atomic and the Run helpers only work inside a job's handler, while its run holds
    the lease. In a unit test, call the job through django_fencedjobs.testing.run_job_now()."""


class FenceLost(RunAborted):
    """This run no longer holds the job's lease: another run took it over (the lease expired while
    this one was paused or slow) or the run was revoked on timeout. Nothing written in the
    fenced block was committed. Do not retry inside the handler: the run is over."""


class DuplicateDelivery(FenceLost):
    """Inside a ``django.tasks`` task: another delivery of this same task (a relay's second
    hand-over, a broker's redelivery) has committed its fenced writes already, so this one
    writes nothing. The task's record counts it as a duplicate."""


class RunReplaced(RunAborted):
    """The job's next slot came while this run was still going, and the job is declared
    ``overlap="replace"``: the new slot's run takes the lease over, so this run's writes can
    no longer commit."""


class JobTimeout(RunAborted):
    """The run overran its timeout: its fence was revoked, so its writes can no longer commit.
    Raise the job's timeout, or make each run do less (max_batches)."""


class WatermarkError(FencedJobsError, ValueError):
    """The watermark can only move forward, inside fenced_atomic, in the run that owns it."""
