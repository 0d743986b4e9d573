"""Jobs and the registry: what ``@job`` declares. ``@job`` never raises for a bad
declaration: the job is registered *invalid* (:attr:`Job.schedule` None,
:attr:`Job.schedule_error` and :attr:`Job.check_id` say why), so a typo in one job never
stops the web app from starting, nor the other jobs (docs/checks.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar, overload

from django_fencedjobs.checkids import CheckId
from django_fencedjobs.exceptions import JobDefinitionError, ScheduleError, UnknownJob
from django_fencedjobs.schedule import Schedule

#: A job's handler: called with the run's :class:`~django_fencedjobs.run.Run` (not named
#: here: the run module depends on this one) and an instance's keyword arguments.
Handler = Callable[..., Any]
F = TypeVar("F", bound=Handler)
Exclusion = Literal["lease", "advisory"]
InstanceSeries = Literal["aggregated", "each"]
#: How slots missed while nothing ran are caught up (docs/time.md).
Catchup = Literal["coalesce", "each", "latest"]
Overlap = Literal["buffer_one", "skip", "replace"]
#: Why a job is invalid.
JobError = ScheduleError | JobDefinitionError

DEFAULT_LEASE_TTL = timedelta(minutes=2)
DEFAULT_GRACE = timedelta(minutes=5)
DEFAULT_MAX_BATCHES = 100
DEFAULT_FAILURE_THRESHOLD = 3
#: With ``catchup="each"``, at most this many missed slots run, the latest ones.
DEFAULT_CATCHUP_LIMIT = 24
DEFAULT_RETRY_BACKOFF = timedelta(seconds=30)
#: A job without an explicit timeout gets half its shortest interval, at most this.
MAX_DEFAULT_TIMEOUT = timedelta(hours=1)


@dataclass(frozen=True, eq=False)
class JobOptions:
    """The options of :func:`job`, each named here once with its type and default: a
    :class:`Job` has them as attributes, ``@job`` takes them as keyword arguments (``cron``
    positional) and checks their types against these annotations."""

    cron: str | None = None
    every: timedelta | None = None
    timezone: str = "UTC"
    jitter: timedelta = timedelta(0)
    lease_ttl: timedelta = DEFAULT_LEASE_TTL
    #: As declared; None means "derived" (see :attr:`Job.run_timeout`).
    timeout: timedelta | None = None
    max_batches: int = DEFAULT_MAX_BATCHES
    grace: timedelta = DEFAULT_GRACE
    starting_deadline: timedelta | None = None
    exclusion: Exclusion = "lease"
    failure_threshold: int = DEFAULT_FAILURE_THRESHOLD
    #: The job has no schedule of its own: its instances (rows, :mod:`.instances`) do.
    instances: bool = False
    #: For a job with instances, the series of the channels that charge or strain per series
    #: (Prometheus, Sentry monitors): one per job (``"aggregated"``) or per instance (``"each"``).
    instance_series: InstanceSeries = "aggregated"
    #: Slots missed while nothing ran: one run for the latest covering them all (``"coalesce"``),
    #: one each, at most ``catchup_limit`` (``"each"``), or the latest alone (``"latest"``).
    catchup: Catchup = "coalesce"
    catchup_limit: int = DEFAULT_CATCHUP_LIMIT
    #: A failed or timed-out run is tried again this many times, through the lease, each
    #: attempt ``retry_backoff`` after the last (doubling), never at or past the next slot.
    retries: int = 0
    retry_backoff: timedelta = DEFAULT_RETRY_BACKOFF
    #: The calendars (:mod:`.calendars`, by name) whose dates and windows its slots avoid.
    exclude: Sequence[str] = ()
    #: A slot its calendars exclude runs instead at the next time they allow, before the
    #: schedule's next slot (docs/schedules.md, "Calendars"), rather than not at all.
    defer_excluded: bool = False
    #: A slot that comes while a run of the job is still going: run as soon as that run
    #: ends (``"buffer_one"``), recorded skipped (``"skip"``), or run at once, the other
    #: fenced off and stopped (``"replace"``: docs/time.md, "Overlap").
    overlap: Overlap = "buffer_one"


@dataclass(frozen=True, eq=False, kw_only=True)
class Job(JobOptions):
    """A declared job, built by :func:`job`, read by :func:`get_job`: valid, or *invalid*
    (``schedule`` None, never runs, ``schedule_error`` says why). Two jobs are equal only
    when they are the same object."""

    name: str
    func: Handler = field(repr=False)
    #: The schedule built from cron/every, timezone and jitter; None when they are invalid.
    parsed_schedule: Schedule | None
    #: What was found wrong when the job was declared (None: nothing), and the id of the
    #: system check that reports it.
    declaration_error: JobError | None = None
    declaration_check_id: CheckId | None = None
    #: For an instance (:mod:`django_fencedjobs.instances`), named ``parent[key]``: the job
    #: declared with ``instances=True``, the instance's key and its keyword arguments.
    parent: str | None = None
    key: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict, repr=False)

    @functools.cached_property
    def _problem(self) -> tuple[CheckId, JobError] | None:
        # What needs the schedule's shortest interval (a year of fire times) or the database
        # is looked for on first use: every web process declares every job at start-up.
        if self.instances and self.declaration_error is None:
            return None  # the schedules are its instances'
        if self.declaration_error is not None or self.parsed_schedule is None:
            # Only job() builds a Job, and it gives one or the other.
            error = self.declaration_error or JobDefinitionError(f"job {self.name!r}: no schedule")
            return self.declaration_check_id or CheckId.CRON, error
        return _schedule_problem(self, self.parsed_schedule)

    @property
    def schedule(self) -> Schedule | None:
        """The schedule; None when the job is invalid (:attr:`schedule_error` says why)."""
        return None if self._problem is not None else self.parsed_schedule

    @property
    def valid(self) -> bool:
        """The job runs: its declaration is valid (a job with instances has no schedule of
        its own, and is valid)."""
        return self._problem is None

    @property
    def schedule_error(self) -> JobError | None:
        """Why the job is invalid (None when it is valid): a :class:`ScheduleError` for its
        schedule, a :class:`JobDefinitionError` for another argument. The message names the
        job and the argument."""
        return self._problem[1] if self._problem is not None else None

    @property
    def check_id(self) -> CheckId | None:
        """The id of the system check that reports :attr:`schedule_error`."""
        return self._problem[0] if self._problem is not None else None

    @property
    def valid_schedule(self) -> Schedule:
        """The schedule, or the reason the job is invalid raised (the system checks report
        it too)."""
        schedule = self.schedule
        if schedule is None:
            raise self._problem[1] if self._problem else JobDefinitionError(self.name)
        return schedule

    @property
    def run_timeout(self) -> timedelta:
        """The timeout in force: as declared, or half the shortest interval (at most 1 hour)."""
        if self.timeout is not None:
            return self.timeout
        return min(self.valid_schedule.min_interval() / 2, MAX_DEFAULT_TIMEOUT)

    def late_after(self, slot: datetime) -> datetime:
        """The deadline of ``slot`` (plus :attr:`run_timeout` plus :attr:`grace`): past it
        without a success for the slot, or with its tasks unfinished, the job is late; at the
        instant itself, not yet."""
        return slot + self.run_timeout + self.grace


def _schedule_problem(job: Job, schedule: Schedule) -> tuple[CheckId, JobError] | None:
    interval = schedule.min_interval()
    if job.timeout is not None and job.timeout >= interval and job.overlap == "buffer_one":
        return CheckId.TIMEOUT, JobDefinitionError(
            f"job {job.name!r}: timeout {job.timeout} is not shorter than the shortest "
            f"interval between its runs ({interval}); a slow run would overlap the next."
        )
    if job.jitter >= interval:
        return CheckId.JITTER, JobDefinitionError(
            f"job {job.name!r}: jitter {job.jitter} is not shorter than the shortest "
            f"interval between its runs ({interval}); runs would swap order."
        )
    if job.exclusion == "advisory":
        from django_fencedjobs import db

        if problem := db.advisory_lock_problem():
            return CheckId.ADVISORY, JobDefinitionError(
                f"job {job.name!r}: exclusion='advisory' needs PostgreSQL advisory locks; "
                f"{problem}."
            )
    return None


class JobRegistry:
    """Jobs by name, in declaration order. Two different functions declared under one name
    make that name invalid (neither runs: which one was meant is a guess)."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self.duplicates: list[Job] = []
        #: Called with each job ``@job`` declares, once registered: the app's ``ready()``
        #: adds :func:`django_fencedjobs.instances.attach` (``send_digest.instances``).
        self.on_register: list[Callable[[Job], None]] = []

    def register(self, job: Job) -> None:
        existing = self._jobs.get(job.name)
        # Re-importing the same module (autoreload, tests) re-declares the same function;
        # two different functions under one name is a configuration error (E008).
        if existing is not None and _where(existing.func) != _where(job.func):
            self.duplicates.append(job)
            declared_by = [existing.func] + [d.func for d in self.duplicates if d.name == job.name]
            where = " and by ".join(_where(func) for func in declared_by)
            job = dataclasses.replace(
                existing,
                declaration_error=JobDefinitionError(
                    f"job {job.name!r} is declared twice: by {where}."
                ),
                declaration_check_id=CheckId.DUPLICATE,
            )
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

    @contextlib.contextmanager
    def isolated(self) -> Iterator[JobRegistry]:
        """Swap in an empty registry for the duration (tests)."""
        saved, saved_duplicates = self._jobs, self.duplicates
        self._jobs, self.duplicates = {}, []
        try:
            yield self
        finally:
            self._jobs, self.duplicates = saved, saved_duplicates


def _target(func: object) -> object:
    """What a handler is made from: the function under a ``functools.partial``."""
    while isinstance(func, functools.partial):
        func = func.func
    return func


def _where(func: object) -> str:
    """``module.qualname`` of a handler: a function, a partial of one, a callable object."""
    target = _target(func)
    module = getattr(target, "__module__", None) or type(target).__module__
    qualname = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}.{qualname}"


registry = JobRegistry()


def get_job(name: str) -> Job:
    return registry.get(name)


def _runtime_types(hint: Any) -> tuple[type, ...]:
    """The classes a value of an option annotated ``hint`` is an instance of (``NoneType``
    for an optional one); a ``Literal``'s, the class of its values."""
    if typing.get_origin(hint) is Literal:
        return tuple({type(value) for value in typing.get_args(hint)})
    if isinstance(hint, types.UnionType):
        return tuple(kind for arg in typing.get_args(hint) for kind in _runtime_types(arg))
    return (typing.get_origin(hint) or hint,)


#: Each option's default and the classes its value may have, read from :class:`JobOptions`.
_DEFAULTS: dict[str, Any] = {
    option.name: option.default for option in dataclasses.fields(JobOptions)
}
_TYPES: dict[str, tuple[type, ...]] = {
    name: _runtime_types(hint) for name, hint in typing.get_type_hints(JobOptions).items()
}


def _typed(field_name: str, value: object) -> bool:
    """Whether ``value`` has the type of the job's option ``field_name``."""
    kinds = _TYPES[field_name]
    return isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool))


def _duration(field_name: str, value: Any, *, allow_zero: bool = False) -> str | None:
    """What is wrong with a duration argument, or None."""
    if not isinstance(value, timedelta):
        return f"{field_name} must be a datetime.timedelta, got {value!r}"
    if value < timedelta(0) or (value == timedelta(0) and not allow_zero):
        return f"{field_name} must be positive, got {value!r}"
    return None


def _positive_int(field_name: str, value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"{field_name} must be a positive int, got {value!r}"
    return None


def _choice(field_name: str, value: Any, allowed: tuple[Any, ...]) -> str | None:
    """What is wrong with an argument that takes one of ``allowed`` (of its type), or None."""
    if _typed(field_name, value) and value in allowed:
        return None
    *others, last = map(repr, allowed)
    return f"{field_name} must be {', '.join(others)} or {last}, got {value!r}"


def _handler_signature(func: Any) -> inspect.Signature:
    """``inspect.signature(func)``, read once per handler: the job of every instance a
    runner runs is checked against its handler, and reading a signature is not free."""
    try:
        return _signature_of(func)
    except TypeError:  # a callable object that cannot be a key (or no signature: raised again)
        return inspect.signature(func)


@functools.lru_cache(maxsize=256)
def _signature_of(func: Any) -> inspect.Signature:
    return inspect.signature(func)


def _handler_problem(
    job_name: str, func: object, *, kwargs: dict[str, Any] | None = None, partial: bool = False
) -> tuple[CheckId, JobError] | None:
    """Why ``func`` cannot be a job's handler, or None. The runner calls ``func(run)`` and
    takes its return as the end of the run: an async def, async generator or generator
    function returns an object without running its body (E011); a signature that cannot take
    the Run as its one positional argument would fail every run (E012). A partial or callable
    object is judged by what it calls. An instance's ``kwargs`` must bind too; ``partial``:
    the job declared with ``instances=True``, whose arguments are left to its instances."""
    if not callable(func):
        return CheckId.HANDLER_SIGNATURE, JobDefinitionError(
            f"job {job_name!r}: the handler {func!r} is not callable."
        )
    kind = _lazy_kind(func)
    if kind is not None:
        what, returns = kind
        return CheckId.HANDLER_KIND, JobDefinitionError(
            f"job {job_name!r}: the handler {_where(func)} is {what}: calling it returns "
            f"{returns} without running its body, so the job would do nothing."
        )
    try:
        signature = _handler_signature(func)
    except (TypeError, ValueError):
        return None  # no signature to read (some builtins): let it be
    try:
        if partial:
            signature.bind_partial(object())
        else:
            signature.bind(object(), **(kwargs or {}))
    except TypeError as exc:
        if kwargs is not None:  # an instance: its arguments (perhaps none) are the problem
            return CheckId.HANDLER_SIGNATURE, JobDefinitionError(
                f"job {job_name!r}: the handler {_where(func)}{signature} cannot be called "
                f"with the Run and the instance's arguments {sorted(kwargs)}: {exc}."
            )
        return CheckId.HANDLER_SIGNATURE, JobDefinitionError(
            f"job {job_name!r}: the handler {_where(func)}{signature} cannot take the Run "
            f"as its one positional argument."
        )
    return None


def _lazy_kind(func: object) -> tuple[str, str] | None:
    """What ``func`` is and what calling it returns, when that is an object instead of a run
    of its body (an async def, async generator or generator function); else None."""
    target = _target(func)
    candidates = [func, target]
    if not inspect.isroutine(target) and not inspect.isclass(target):
        candidates.append(inspect.getattr_static(type(target), "__call__", None))  # an object
    for candidate in candidates:
        if inspect.iscoroutinefunction(candidate):
            return "an async def function", "a coroutine"
        if inspect.isasyncgenfunction(candidate):
            return "an async generator function", "an async generator"
        if inspect.isgeneratorfunction(candidate):
            return "a generator function", "a generator"
    return None


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
    instances: bool = False,
    instance_series: InstanceSeries = "aggregated",
    catchup: Catchup = "coalesce",
    catchup_limit: int = DEFAULT_CATCHUP_LIMIT,
    retries: int = 0,
    retry_backoff: timedelta = DEFAULT_RETRY_BACKOFF,
    exclude: Sequence[str] = (),
    defer_excluded: bool = False,
    overlap: Overlap = "buffer_one",
) -> Callable[[F], F]: ...
def job(
    cron: str | F | None = None, /, *, name: str | None = None, **options: Any
) -> F | Callable[[F], F]:
    """Declare a scheduled job::

        @job("*/15 * * * *", timezone="Europe/Berlin", jitter=timedelta(minutes=3))
        def sync_invoices(run: Run) -> None: ...

    The function is returned unchanged (call it directly in unit tests); the declaration
    is available as ``sync_invoices.job``. Nothing is raised for a bad argument: the job is
    registered as invalid (see :class:`Job`) and ``manage.py check`` names the job and the
    argument.
    """
    if callable(cron):  # a bare @job: the function came where the schedule should be
        error = ScheduleError(
            f"job {_where(cron)!r}: @job needs a schedule: write "
            f"@job('*/15 * * * *') or @job(every=...) above it."
        )
        _declare(cron, name=None, problem=(CheckId.CRON, error), fields={})
        return cron

    unknown = [key for key in options if key not in _DEFAULTS or key == "cron"]
    if unknown:  # as Python says it of any function's unknown keyword argument
        raise TypeError(f"job() got an unexpected keyword argument {unknown[0]!r}")
    declared = {**_DEFAULTS, **options, "cron": cron}
    if isinstance(declared["exclude"], list):  # exclude=["de-holidays"] reads best
        declared["exclude"] = tuple(declared["exclude"])

    def decorate(func: F) -> F:
        _declare(func, name=name, problem=None, fields=declared)
        return func

    return decorate


def _signature() -> inspect.Signature:
    """``job``'s signature with every keyword argument, as type checkers read it (its
    overload), for ``help(job)`` and ``inspect.signature(job)``."""
    implementation = inspect.signature(job)
    written_out = inspect.signature(typing.get_overloads(job)[-1])
    cron = implementation.parameters["cron"]
    keywords = [p for p in written_out.parameters.values() if p.kind is p.KEYWORD_ONLY]
    return implementation.replace(parameters=[cron, *keywords])


job.__signature__ = _signature()  # type: ignore[attr-defined]


def _declare(
    func: Any,
    *,
    name: object,
    problem: tuple[CheckId, JobError] | None,
    fields: dict[str, Any],
) -> Job:
    """Register ``func`` as a job, valid or not, set ``func.job`` and call the registry's
    :attr:`~JobRegistry.on_register` hooks."""
    default_name = _where(func)
    job_name = default_name if name is None else name
    wrong: list[str | None] = []
    if not isinstance(job_name, str) or not job_name or len(job_name) > 200:
        wrong.append(f"name must be 1 to 200 characters, got {job_name!r}")
        job_name = default_name
    if fields.get("instances") is True and not (fields["cron"] is None and fields["every"] is None):
        wrong.append("instances=True takes no cron or every: each instance has its own schedule")
    declared = build(func, job_name, fields, problem=problem, wrong=wrong)
    registry.register(declared)
    with contextlib.suppress(AttributeError, TypeError):
        func.job = declared
    for hook in registry.on_register:
        hook(declared)
    return declared


def build(
    func: Any,
    job_name: str,
    fields: dict[str, Any],
    *,
    problem: tuple[CheckId, JobError] | None = None,
    wrong: list[str | None] | None = None,
    kwargs: dict[str, Any] | None = None,
    **identity: Any,
) -> Job:
    """A :class:`Job` named ``job_name`` from its options ``fields``, valid or not: every
    argument checked as ``@job`` checks it, then the schedule, then the handler (called with
    ``kwargs`` when given: an instance's). Registers nothing. ``identity`` is an instance's
    ``parent`` and ``key``."""
    wrong = [] if wrong is None else wrong
    schedule: Schedule | None = None
    if fields and problem is None:
        problem = _argument_problem(job_name, fields, wrong, declared=not identity)
    if fields and problem is None and not fields.get("instances"):
        try:
            schedule = Schedule(
                cron=fields["cron"],
                every=fields["every"],
                timezone=fields["timezone"],
                jitter=fields["jitter"],
                key=job_name,
            )
        except ScheduleError as exc:  # the error says which argument, so which check
            error = ScheduleError(
                f"job {job_name!r}: {exc}", argument=exc.argument, fixed_offset=exc.fixed_offset
            )
            check_id = CheckId.ZONE if exc.argument == "timezone" else CheckId.CRON
            problem = (CheckId.FIXED_OFFSET if exc.fixed_offset else check_id, error)
    if problem is None:
        problem = _handler_problem(
            job_name, func, kwargs=kwargs, partial=bool(fields.get("instances"))
        )
    return Job(
        name=job_name,
        func=func,
        parsed_schedule=schedule,
        declaration_error=problem[1] if problem else None,
        declaration_check_id=problem[0] if problem else None,
        kwargs=kwargs or {},
        **identity,
        # An invalid job is shown (admin, checkjobs), never run: an argument of the wrong
        # type is left at its default, so that showing it cannot fail.
        **{key: value for key, value in fields.items() if _typed(key, value)},
    )


def _combination_problem(fields: dict[str, Any], declared: bool) -> str | None:
    """What is wrong with the options that go together: ``exclude`` and
    ``defer_excluded`` (as declared: an instance may name no calendar); ``overlap`` and
    ``exclusion``. None: nothing."""
    exclude = fields["exclude"]
    if not isinstance(exclude, tuple) or not all(isinstance(n, str) and n for n in exclude):
        return f"exclude must be a list of calendar names, got {exclude!r}"
    nothing_to_defer = declared and not exclude and not fields["instances"]
    if fields["defer_excluded"] is True and nothing_to_defer:
        return "defer_excluded=True defers the slots its calendars exclude: name them in exclude="
    if fields["overlap"] == "replace" and fields["exclusion"] == "advisory":
        return "overlap='replace' needs exclusion='lease': an advisory lock cannot fence"
    return None


def _argument_problem(
    job_name: str, fields: dict[str, Any], wrong: list[str | None], *, declared: bool = True
) -> tuple[CheckId, JobError] | None:
    """Every argument of the wrong type or range (E013), else a lease_ttl that is not
    positive (E006), else None."""
    for field_name, allow_zero in (
        ("jitter", True),
        ("lease_ttl", True),
        ("grace", True),
        ("retry_backoff", False),
    ):
        wrong.append(_duration(field_name, fields[field_name], allow_zero=allow_zero))
    for field_name in ("timeout", "starting_deadline"):
        if fields[field_name] is not None:
            wrong.append(_duration(field_name, fields[field_name]))
    for field_name in ("max_batches", "failure_threshold", "catchup_limit"):
        wrong.append(_positive_int(field_name, fields[field_name]))
    retries = fields["retries"]
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        wrong.append(f"retries must be an int of 0 or more, got {retries!r}")
    wrong.append(_combination_problem(fields, declared))
    for field_name, allowed in (
        ("catchup", typing.get_args(Catchup)),
        ("instances", (True, False)),
        ("defer_excluded", (True, False)),
        ("instance_series", typing.get_args(InstanceSeries)),
        ("exclusion", typing.get_args(Exclusion)),
        ("overlap", typing.get_args(Overlap)),
    ):
        wrong.append(_choice(field_name, fields[field_name], allowed))
    messages = [message for message in wrong if message]
    if messages:
        return CheckId.ARGUMENT, JobDefinitionError(f"job {job_name!r}: {'; '.join(messages)}")
    if fields["lease_ttl"] <= timedelta(0):
        return CheckId.LEASE_TTL, JobDefinitionError(
            f"job {job_name!r}: lease_ttl must be positive, got {fields['lease_ttl']}."
        )
    return None
