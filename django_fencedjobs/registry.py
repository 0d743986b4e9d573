"""Jobs and the registry: what ``@job`` declares.

``@job`` validates its arguments at import time and raises :class:`JobDefinitionError`
naming the job and the field. Schedule problems (invalid cron, unknown or fixed-offset zone)
are kept on the job and reported by ``manage.py check`` with stable ids, so a bad expression
in one job never hides the others.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from django_fencedjobs.exceptions import JobDefinitionError, ScheduleError, UnknownJob
from django_fencedjobs.schedule import Schedule

if TYPE_CHECKING:
    from django_fencedjobs.runner import Run

Handler = Callable[["Run"], Any]
F = TypeVar("F", bound=Handler)
Exclusion = Literal["lease", "advisory"]

DEFAULT_LEASE_TTL = timedelta(minutes=2)
DEFAULT_GRACE = timedelta(minutes=5)
DEFAULT_MAX_BATCHES = 100
DEFAULT_FAILURE_THRESHOLD = 3
#: A job without an explicit timeout gets half its shortest interval, at most this.
MAX_DEFAULT_TIMEOUT = timedelta(hours=1)


@dataclass(frozen=True, eq=False)
class Job:
    """A declared job. Build it with :func:`job`; read it with :func:`get_job`."""

    name: str
    func: Handler = field(repr=False)
    #: None when the declaration's schedule is invalid; :attr:`schedule_error` says why.
    schedule: Schedule | None
    schedule_error: ScheduleError | None = None
    cron: str | None = None
    every: timedelta | None = None
    timezone: str = "UTC"
    jitter: timedelta = timedelta(0)
    lease_ttl: timedelta = DEFAULT_LEASE_TTL
    #: As declared; None means "derived" (see :attr:`run_timeout`).
    timeout: timedelta | None = None
    max_batches: int = DEFAULT_MAX_BATCHES
    grace: timedelta = DEFAULT_GRACE
    starting_deadline: timedelta | None = None
    exclusion: Exclusion = "lease"
    failure_threshold: int = DEFAULT_FAILURE_THRESHOLD

    @property
    def valid_schedule(self) -> Schedule:
        """The schedule, or the reason it is invalid raised (the system checks report it too)."""
        if self.schedule is None:
            assert self.schedule_error is not None
            raise self.schedule_error
        return self.schedule

    @property
    def run_timeout(self) -> timedelta:
        """The timeout in force: as declared, or half the shortest interval (at most 1 hour)."""
        if self.timeout is not None:
            return self.timeout
        return min(self.valid_schedule.min_interval() / 2, MAX_DEFAULT_TIMEOUT)

    def __call__(self, run: Run) -> Any:
        return self.func(run)


class JobRegistry:
    """Jobs by name, in declaration order. Duplicates are kept for the system check."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self.duplicates: list[Job] = []

    def register(self, job: Job) -> None:
        existing = self._jobs.get(job.name)
        if existing is not None and existing.func is not job.func:
            # Re-importing the same module (autoreload, tests) re-declares the same function;
            # two different functions under one name is a configuration error (E008).
            if _same_function(existing.func, job.func):
                self._jobs[job.name] = job
                return
            self.duplicates.append(job)
            return
        self._jobs[job.name] = job

    def get(self, name: str) -> Job:
        try:
            return self._jobs[name]
        except KeyError:
            known = ", ".join(sorted(self._jobs)) or "none"
            raise UnknownJob(f"no job named {name!r} is registered (known: {known})") from None

    def all(self) -> list[Job]:
        return list(self._jobs.values())

    def names(self) -> list[str]:
        return list(self._jobs)

    def __contains__(self, name: object) -> bool:
        return name in self._jobs

    def __len__(self) -> int:
        return len(self._jobs)

    @contextlib.contextmanager
    def isolated(self) -> Iterator[JobRegistry]:
        """Swap in an empty registry for the duration (tests)."""
        saved, saved_duplicates = self._jobs, self.duplicates
        self._jobs, self.duplicates = {}, []
        try:
            yield self
        finally:
            self._jobs, self.duplicates = saved, saved_duplicates


def _same_function(a: Handler, b: Handler) -> bool:
    return (getattr(a, "__module__", None), getattr(a, "__qualname__", None)) == (
        getattr(b, "__module__", None),
        getattr(b, "__qualname__", None),
    )


registry = JobRegistry()


def get_job(name: str) -> Job:
    return registry.get(name)


def all_jobs() -> list[Job]:
    return registry.all()


def _duration(job_name: str, field_name: str, value: Any, *, allow_zero: bool = False) -> None:
    if not isinstance(value, timedelta):
        raise JobDefinitionError(
            f"job {job_name!r}: {field_name} must be a datetime.timedelta, got {value!r}"
        )
    if value < timedelta(0) or (value == timedelta(0) and not allow_zero):
        raise JobDefinitionError(f"job {job_name!r}: {field_name} must be positive, got {value!r}")


@overload
def job(cron: F, /) -> F: ...
@overload
def job(
    cron: str | None = None,
    /,
    *,
    every: timedelta | None = None,
    name: str | None = None,
    timezone: str = "UTC",
    jitter: timedelta = timedelta(0),
    lease_ttl: timedelta = DEFAULT_LEASE_TTL,
    timeout: timedelta | None = None,
    max_batches: int = DEFAULT_MAX_BATCHES,
    grace: timedelta = DEFAULT_GRACE,
    starting_deadline: timedelta | None = None,
    exclusion: Exclusion = "lease",
    failure_threshold: int = DEFAULT_FAILURE_THRESHOLD,
) -> Callable[[F], F]: ...
def job(
    cron: str | F | None = None,
    /,
    *,
    every: timedelta | None = None,
    name: str | None = None,
    timezone: str = "UTC",
    jitter: timedelta = timedelta(0),
    lease_ttl: timedelta = DEFAULT_LEASE_TTL,
    timeout: timedelta | None = None,
    max_batches: int = DEFAULT_MAX_BATCHES,
    grace: timedelta = DEFAULT_GRACE,
    starting_deadline: timedelta | None = None,
    exclusion: Exclusion = "lease",
    failure_threshold: int = DEFAULT_FAILURE_THRESHOLD,
) -> F | Callable[[F], F]:
    """Declare a scheduled job::

        @job("*/15 * * * *", timezone="Europe/Berlin", jitter=timedelta(minutes=3))
        def sync_invoices(run: Run) -> None: ...

    The function is returned unchanged (call it directly in unit tests); the declaration
    is available as ``sync_invoices.job``.
    """
    if callable(cron):
        raise JobDefinitionError(
            f"@job needs a schedule: write @job('*/15 * * * *') or @job(every=...) above "
            f"{getattr(cron, '__qualname__', cron)!r}"
        )

    def decorate(func: F) -> F:
        job_name = name or f"{func.__module__}.{func.__qualname__}"
        if not isinstance(job_name, str) or not job_name or len(job_name) > 200:
            raise JobDefinitionError(f"job name must be 1 to 200 characters, got {job_name!r}")
        _duration(job_name, "jitter", jitter, allow_zero=True)
        _duration(job_name, "lease_ttl", lease_ttl, allow_zero=True)  # zero: check E006
        _duration(job_name, "grace", grace, allow_zero=True)
        if timeout is not None:
            _duration(job_name, "timeout", timeout)
        if starting_deadline is not None:
            _duration(job_name, "starting_deadline", starting_deadline)
        if not isinstance(max_batches, int) or max_batches < 1:
            raise JobDefinitionError(
                f"job {job_name!r}: max_batches must be a positive int, got {max_batches!r}"
            )
        if not isinstance(failure_threshold, int) or failure_threshold < 1:
            raise JobDefinitionError(
                f"job {job_name!r}: failure_threshold must be a positive int, "
                f"got {failure_threshold!r}"
            )
        if exclusion not in ("lease", "advisory"):
            raise JobDefinitionError(
                f"job {job_name!r}: exclusion must be 'lease' or 'advisory', got {exclusion!r}"
            )
        schedule: Schedule | None = None
        error: ScheduleError | None = None
        try:
            schedule = Schedule(
                cron=cron, every=every, timezone=timezone, jitter=jitter, key=job_name
            )
        except ScheduleError as exc:
            error = ScheduleError(f"job {job_name!r}: {exc}")
        declared = Job(
            name=job_name,
            func=func,
            schedule=schedule,
            schedule_error=error,
            cron=cron,
            every=every,
            timezone=timezone,
            jitter=jitter,
            lease_ttl=lease_ttl,
            timeout=timeout,
            max_batches=max_batches,
            grace=grace,
            starting_deadline=starting_deadline,
            exclusion=exclusion,
            failure_threshold=failure_threshold,
        )
        registry.register(declared)
        func.job = declared  # type: ignore[attr-defined]
        return func

    return decorate
