"""Is each job healthy? The one place that decides, for the admin, ``checkjobs`` and metrics.

A job's state is derived from stored facts (its lease row, its latest runs and their tasks)
and its declaration, against **one** reading of the clock; nothing here writes. The states,
severities and precedence are docs/alerting.md's table ("has passed" is strict: at the
deadline instant itself a job is not yet late).

**A slot is judged by its last attempt** (retries, a backfill of it, a run again after a
runner died). The failure rate's window holds the job's own slots (with a run of kind
``scheduled`` or ``once``), but for one whose retry is scheduled (the row's ``run_slot``);
the job's latest state is read from runs of those kinds only: a backfill never makes the
job look failing or ok now. One-offs and backfill slots are judged on their own lease rows
(:func:`assess_oneshot`), a run's tasks by the run's deadline (:attr:`JobHealth.tasks`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime, tzinfo
from enum import StrEnum
from typing import Any

from django.db.models import (
    Case,
    Count,
    Exists,
    F,
    Func,
    IntegerField,
    Max,
    Min,
    OuterRef,
    Q,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Coalesce

from django_fencedjobs import clock, instances, oneshots, runners
from django_fencedjobs.conf import get_settings
from django_fencedjobs.db import lease_db, without_jit
from django_fencedjobs.exceptions import UnknownJob
from django_fencedjobs.instants import format_instant
from django_fencedjobs.listing import describe_schedule
from django_fencedjobs.models import (
    FAILURE_OUTCOMES,
    FINISHED_TASK,
    LEASE_FREE,
    RATED_OUTCOMES,
    UNFINISHED_TASK,
    JobLease,
    JobNotice,
    JobRun,
    Outcome,
    RunKind,
    RunTask,
    TaskStatus,
)
from django_fencedjobs.registry import Job, registry
from django_fencedjobs.text import error_excerpt

__all__ = [
    "InstanceSummary",
    "JobFacts",
    "JobHealth",
    "RunSummary",
    "Severity",
    "State",
    "TaskSlot",
    "TaskSummary",
    "all_health",
    "assess_oneshot",
    "instance_summaries",
    "job_health",
]

#: The fewest failures in the window that make a failure rate a verdict: one is the last
#: run's, not a rate (and the lease row keeps the ages of the last two, for
#: :func:`_may_not_be_ok`).
MIN_RATE_FAILURES = 2
#: The most instances :func:`all_health` judges one by one when it judges every job; past
#: it, :func:`instance_summaries` counts them by their lease rows, so that 100,000 troubled
#: instances cost what 500 do.
INSTANCES_JUDGED = 500
#: What an unfinished task past its deadline most likely means, by status.
UNFINISHED_MEANING = {
    TaskStatus.PENDING: "not taken by the task backend yet (it refused the hand-over, or "
    "the runner stopped before it; a runner's relay hands it over)",
    TaskStatus.READY: "not started by any worker (is a worker running for its queue?)",
}


class State(StrEnum):
    OK = "ok"
    RUNNING = "running"
    LATE = "late"
    FAILING = "failing"
    NEVER_RUN = "never_run"
    PAUSED = "paused"
    NO_RUNNER = "no_runner"
    CAPPED = "capped"
    REMOVED = "removed"
    INVALID = "invalid"


class Severity(StrEnum):
    HEALTHY = "healthy"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        """0 for critical, 1 for warning, 2 for healthy: sort the worst first."""
        return {"critical": 0, "warning": 1, "healthy": 2}[self.value]


@dataclass(frozen=True)
class RunSummary:
    """The parts of a :class:`~django_fencedjobs.models.JobRun` that health reports."""

    pk: int
    scheduled_for: datetime
    started_at: datetime | None
    finished_at: datetime | None
    outcome: str
    capped: bool
    items: int
    error_excerpt: str
    #: :attr:`JobRun.duration <django_fencedjobs.models.JobRun.duration>`.
    duration: float | None = None

    @classmethod
    def of(cls, run: JobRun) -> RunSummary:
        return cls(
            pk=run.pk,
            scheduled_for=run.scheduled_for,
            started_at=run.started_at,
            finished_at=run.finished_at,
            outcome=run.outcome,
            capped=run.capped,
            items=run.items,
            error_excerpt=error_excerpt(run.error),
            duration=run.duration,
        )


@dataclass(frozen=True)
class TaskSlot:
    """The tasks one run of a job enqueued (one slot), counted by status."""

    #: The run's pk and slot (``JobRun.scheduled_for``).
    run_pk: int
    scheduled_for: datetime
    pending: int = 0
    ready: int = 0
    running: int = 0
    successful: int = 0
    failed: int = 0
    #: The earliest start among its running tasks.
    running_since: datetime | None = None
    #: A failed task's path and the last line of its error.
    failed_task: str = ""
    error_excerpt: str = ""
    #: Where its unfinished tasks wait, by status: "backend 'rq', queue 'default'".
    places: dict[str, str] = field(default_factory=dict)

    @property
    def unfinished(self) -> int:
        return self.pending + self.ready + self.running

    @property
    def total(self) -> int:
        return self.unfinished + self.successful + self.failed


@dataclass(frozen=True)
class TaskSummary:
    """What health reads of a job's tasks: two slots, whatever the number of its tasks."""

    #: The oldest slot with a task that has not finished (pending, ready or running).
    unfinished: TaskSlot | None = None
    #: The latest slot with a finished task: the job's latest task outcome.
    last_outcome: TaskSlot | None = None


@dataclass(frozen=True)
class JobFacts:
    """What one job's state is decided from, against one reading of the clock; a
    :class:`JobHealth` is the facts with the verdict."""

    name: str
    #: The single clock reading the state was decided against (aware, UTC).
    checked_at: datetime
    #: The declaration; None when the job is no longer declared (state ``removed``).
    job: Job | None = field(default=None, repr=False, compare=False)
    #: The zone the job was declared with, as written.
    timezone: str = "UTC"
    #: The zone its times are read in: its schedule's; UTC without a valid schedule.
    tz: tzinfo = UTC
    schedule: str = ""
    last_success_at: datetime | None = None
    #: When next due: the lease row's ``next_run_at``, or without a row the schedule's.
    next_run_at: datetime | None = None
    #: The dead man's switch: the slot it waits for (the first after the last success, or
    #: after the job was first seen), and past when, without a success, the job is late.
    awaited_slot: datetime | None = None
    expected_by: datetime | None = None
    consecutive_failures: int = 0
    failure_threshold: int | None = None
    paused: bool = False
    running: bool = False
    owner: str = ""
    fence: int = 0
    lease_until: datetime | None = None
    last_run: RunSummary | None = None
    last_finished_run: RunSummary | None = None
    #: Its runs' tasks; None for a job whose runs enqueued none (or none that health needs).
    tasks: TaskSummary | None = None
    #: The failure rate's window: its slots, how many failed, how many needed retries.
    recent_runs: int = 0
    recent_failures: int = 0
    recent_retried: int = 0
    #: The live runners that run it (their owner labels; ``--once`` passes marked so).
    runners: tuple[str, ...] = ()

    @property
    def failure_rate(self) -> float | None:
        """Failed (or timed out) runs among the recent ones; None without any."""
        return self.recent_failures / self.recent_runs if self.recent_runs else None

    def at(self, value: datetime, ref: datetime | None = None) -> str:
        """``value`` as a reason writes it, in the job's zone (:func:`format_instant`)."""
        return format_instant(value, self.tz, ref=ref)

    def judged(self, state: State, severity: Severity, reason: str) -> JobHealth:
        facts = {name: getattr(self, name) for name in _FACT_NAMES}
        return JobHealth(state=state, severity=severity, reason=reason, **facts)


@dataclass(frozen=True, kw_only=True)
class JobHealth(JobFacts):
    """One job's state, with a one-line human reason and the facts it was decided from."""

    state: State
    severity: Severity
    reason: str

    @property
    def healthy(self) -> bool:
        return self.severity is Severity.HEALTHY


#: A state, its severity and the one-line reason.
Verdict = tuple[State, Severity, str]
_FACT_NAMES = tuple(fact.name for fact in fields(JobFacts))


# -- reading ---------------------------------------------------------------------------------


def all_health(
    names: Sequence[str] | None = None,
    *,
    now: datetime | None = None,
    coverage: runners.Coverage | None = None,
) -> list[JobHealth]:
    """The health of every job (declared in code or present in the database), or of the named
    ones (:class:`UnknownJob` for a name that is neither), worst first, then by name.

    A constant number of queries whatever the number of jobs, each bounded whatever the
    length of their history (the lease rows with their subqueries: :func:`_read_leases`)."""
    if now is None:
        now = clock.now()
    leases = _read_leases(names, now)
    if names:
        unknown = [
            name for name in names if instances.declaring(name) is None and name not in leases
        ]
        if unknown:
            known = ", ".join(sorted(set(registry.names()) | set(leases))) or "none"
            raise UnknownJob(
                f"no job named {', '.join(map(repr, unknown))} is declared or recorded "
                f"(known: {known})"
            )
        wanted = list(dict.fromkeys(names))
    else:
        declared = [job.name for job in registry.all() if not job.instances]
        wanted = list(dict.fromkeys([*declared, *sorted(leases)]))
    run_ids = {
        pk
        for row in leases.values()
        for pk in (row.latest_run_id, row.latest_finished_id)  # type: ignore[attr-defined]
        if pk is not None
    }
    runs: dict[int, JobRun] = {}
    if run_ids:
        runs = {run.pk: run for run in JobRun.objects.using(lease_db()).filter(pk__in=run_ids)}
    tasks = _read_tasks(leases.values())
    if coverage is None:  # the runners seen, unless the caller has read them at ``now``
        coverage = runners.read(now)
    result = []
    for name in wanted:
        row = leases.get(name)
        if row is None:
            result.append(assess(name, _job_of(name, row), row, None, None, now, coverage=coverage))
        elif row.kind != RunKind.SCHEDULED:
            result.append(assess_oneshot(row, now, coverage=coverage))
        else:
            result.append(
                assess(
                    name,
                    _job_of(name, row),
                    row,
                    runs.get(row.latest_run_id),  # type: ignore[attr-defined]
                    runs.get(row.latest_finished_id),  # type: ignore[attr-defined]
                    now,
                    tasks=tasks.get(name),
                    coverage=coverage,
                    recent=(row.recent_runs or 0, row.recent_failures or 0),  # type: ignore[attr-defined]
                    retried=row.recent_retried or 0,  # type: ignore[attr-defined]
                )
            )
    result.sort(key=lambda h: (h.severity.rank, h.name))
    return result


def _job_of(name: str, row: JobLease | None) -> Job | None:
    """What ``name`` runs as: a job declared in code, or an instance's job (built from its
    row, read with the lease row); None when neither is declared any more."""
    if row is not None and row.instance is not None:
        base = instances.declaring(row.instance.job)
        return instances.instance_job(base, row.instance) if base is not None else None
    return registry.get(name) if name in registry else None


@dataclass(frozen=True)
class InstanceSummary:
    """The instances of one job declared with ``instances=True``, counted by state:
    :func:`all_health` lists those that may not be ok, at most :data:`INSTANCES_JUDGED`;
    every other enabled one is ok or running."""

    job: str
    total: int
    disabled: int
    #: The listed instances' states (the ones that may not be ok), counted.
    listed: dict[str, int]
    #: Why no live runner serves the job (then every enabled instance is ``no_runner``,
    #: critical); None when one does, or none was ever seen.
    no_runner: str | None = None
    #: When more may not be ok than were judged: each counted by its lease row (``invalid``,
    #: ``paused``, ``failing``, ``late``, and ``unjudged`` for the rest, which may warn).
    counted: dict[str, int] | None = None
    #: Of :attr:`counted`, the critical ones: invalid, late, or failing at the threshold.
    counted_critical: int = 0

    @property
    def states(self) -> dict[str, int]:
        """The enabled instances' states that are not ok, counted: ``no_runner`` for all of
        them, else :attr:`counted`, else :attr:`listed` (the healthy states left out)."""
        if self.no_runner is not None:
            enabled = self.total - self.disabled
            return {State.NO_RUNNER.value: enabled} if enabled else {}
        if self.counted is not None:
            return {state: count for state, count in self.counted.items() if count}
        return {s: n for s, n in self.listed.items() if s not in _HEALTHY_STATES and n}

    @property
    def ok(self) -> int:
        return self.total - self.disabled - sum(self.states.values())

    @property
    def severity(self) -> Severity:
        """Of the instances not listed: critical when no runner serves the enabled ones, or
        any counted one is critical (the listed ones are in :func:`all_health`'s list)."""
        if self.no_runner is not None and self.total > self.disabled:
            return Severity.CRITICAL
        if self.counted is not None:
            if self.counted_critical:
                return Severity.CRITICAL
            if any(count for state, count in self.counted.items() if state != UNJUDGED):
                return Severity.WARNING
        return Severity.HEALTHY

    @property
    def worst(self) -> str:
        """The worst state of the enabled instances, of :data:`STATES_WORST_FIRST`."""
        states = self.states
        return next((state for state in STATES_WORST_FIRST if states.get(state)), "ok")


_HEALTHY_STATES = {State.OK, State.RUNNING, State.NEVER_RUN, State.REMOVED}
#: The state of instances that may not be ok and were counted, not judged.
UNJUDGED = "unjudged"
#: The states of a job's instances, the worst first: what a page lists and links first.
STATES_WORST_FIRST = (
    State.NO_RUNNER.value,
    State.FAILING.value,
    State.LATE.value,
    State.INVALID.value,
    State.CAPPED.value,
    State.PAUSED.value,
    UNJUDGED,
)


def instance_summaries(
    healths: Iterable[JobHealth],
    *,
    coverage: runners.Coverage | None = None,
    now: datetime | None = None,
) -> list[InstanceSummary]:
    """Per job with instances: its instances counted (one query, a scan of their lease
    rows), the states of those in ``healths`` (:func:`all_health`'s list, judged at ``now``),
    and whether a live runner serves the job (``coverage``, read here when not given):
    without one, every enabled instance is ``no_runner``, noticed within ``RUNNER_TIMEOUT``
    and not at each instance's deadline."""
    healths = list(healths)
    if now is None:
        now = healths[0].checked_at if healths else clock.now()
    listed: dict[str, dict[str, int]] = {}
    for h in healths:
        if h.job is not None and h.job.parent is not None:
            states = listed.setdefault(h.job.parent, {})
            states[h.state] = states.get(h.state, 0) + 1
    threshold = Case(  # each instance's job's failure_threshold, in SQL
        *(
            When(parent=j.name, then=Value(j.failure_threshold))
            for j in registry.all()
            if j.instances
        ),
        default=Value(1),
        output_field=IntegerField(),
    )
    may = _may_not_be_ok(now, get_settings())
    unpaused = may & Q(paused=False)
    failing = unpaused & Q(consecutive_failures__gt=0)
    late = unpaused & Q(consecutive_failures=0, late_after__lt=now)
    invalid = may & Q(paused=True, instance__paused=False)
    rows = (
        JobLease.objects.using(lease_db())
        .filter(instance__isnull=False)
        .order_by()
        .values("instance__job")
        .annotate(
            total=Count("pk"),
            disabled=Count("pk", filter=Q(instance__enabled=False)),
            first_seen=Min("created_at"),
            n_may=Count("pk", filter=may),
            n_invalid=Count("pk", filter=invalid),
            n_paused=Count("pk", filter=may & Q(paused=True, instance__paused=True)),
            n_failing=Count("pk", filter=failing),
            n_late=Count("pk", filter=late),
            n_critical=Count(
                "pk",
                filter=invalid | late | (failing & Q(consecutive_failures__gte=threshold)),
            ),
        )
    )
    found: dict[str, dict[str, Any]] = {row["instance__job"]: dict(row) for row in rows}
    parents = [job.name for job in registry.all() if job.instances] + sorted(found)
    if coverage is None:
        coverage = runners.read(now)
    summaries = []
    for parent in dict.fromkeys(parents):
        row = found.get(parent, {})
        no_runner: str | None = None
        counted: dict[str, int] | None = None
        if row and parent in registry:  # a job no longer declared: counted, never judged
            no_runner = coverage.problem(
                parent, row["first_seen"], lambda at: format_instant(at, UTC)
            )
            if sum(listed.get(parent, {}).values()) < row["n_may"]:  # not every one judged
                counted = {s: row[f"n_{s}"] for s in ("invalid", "paused", "failing", "late")}
                counted[UNJUDGED] = row["n_may"] - sum(counted.values())
        summaries.append(
            InstanceSummary(
                job=parent,
                total=row.get("total", 0),
                disabled=row.get("disabled", 0),
                listed=listed.get(parent, {}),
                no_runner=no_runner,
                counted=counted,
                counted_critical=row.get("n_critical", 0),
            )
        )
    return summaries


def job_health(name: str, *, now: datetime | None = None) -> JobHealth:
    """The health of one job (:class:`UnknownJob` if it is neither declared nor recorded)."""
    (health,) = all_health([name], now=now)
    return health


def _count(rows: Any) -> Subquery:
    """``SELECT COUNT(*)`` of ``rows``, as a scalar subquery (no ``GROUP BY``)."""
    counted = rows.order_by().annotate(n=Func(F("pk"), function="COUNT")).values("n")
    return Subquery(counted, output_field=IntegerField())


def _read_leases(names: Sequence[str] | None, now: datetime) -> dict[str, JobLease]:
    settings = get_settings()
    # The failure rate's window: the job's latest FAILURE_RATE_RUNS own slots whose last
    # attempt ran to an end, within FAILURE_RATE_PERIOD (a LIMIT on the (job, -scheduled_for)
    # index), but for a failed attempt whose retry the job's row has scheduled.
    since = now - settings.FAILURE_RATE_PERIOD
    window = (
        JobRun.objects.filter(~_later_attempt(since))  # each slot's last attempt
        .filter(
            _own_slot(),
            job=OuterRef(OuterRef("name")),
            outcome__in=RATED_OUTCOMES,
            scheduled_for__gt=since,
        )
        .exclude(scheduled_for=Coalesce(OuterRef(OuterRef("run_slot")), Value(LEASE_FREE)))
        .order_by("-scheduled_for")
        .values("pk")[: settings.FAILURE_RATE_RUNS]
    )
    in_window = JobRun.objects.filter(pk__in=Subquery(window))
    # The job's latest state: its own runs (scheduled, retries, one-offs), never a backfill's.
    recent = (
        JobRun.objects.filter(job=OuterRef("name"))
        .exclude(kind=RunKind.BACKFILL)
        .order_by("-scheduled_for", "-attempt")
    )
    # A task carries its run's fence, and a job's later runs have higher fences: the runs
    # of its oldest unfinished task and of its latest finished one, without joining the runs.
    tasks = RunTask.objects.filter(job=OuterRef("name"))
    rows = (
        JobLease.objects.using(lease_db())
        .select_related("instance")
        .annotate(
            latest_run_id=Subquery(recent.values("pk")[:1]),
            latest_finished_id=Subquery(
                recent.exclude(outcome=Outcome.RUNNING)
                .filter(_probed(~_later_attempt()))
                .values("pk")[:1]
            ),
            tasks_waiting_run_id=Subquery(
                tasks.filter(status__in=UNFINISHED_TASK).order_by("fence").values("run_id")[:1]
            ),
            tasks_outcome_run_id=Subquery(
                tasks.filter(status__in=FINISHED_TASK).order_by("-fence").values("run_id")[:1]
            ),
            recent_runs=_count(in_window),
            recent_failures=_count(in_window.filter(outcome__in=FAILURE_OUTCOMES)),
            recent_retried=_count(in_window.filter(attempt__gt=1).exclude(kind=RunKind.BACKFILL)),
        )
    )
    if names:
        rows = rows.filter(name__in=list(names))
    else:
        # The instances that may not be ok, the first INSTANCES_JUDGED by name: one scan of
        # the lease rows, stopped there; the subqueries above run for those rows only.
        judged = (
            JobLease.objects.filter(_may_not_be_ok(now, settings))
            .order_by("name")
            .values("name")[:INSTANCES_JUDGED]
        )
        rows = rows.filter(
            Q(instance__isnull=True, kind=RunKind.SCHEDULED)
            | Q(name__in=Subquery(judged))
            | _late_oneoffs(now)
            # A one-off notified late: judged again, so that its recovery is told too.
            | Q(kind=RunKind.ONCE, name__in=JobNotice.objects.exclude(state=State.OK).values("job"))
        )
    with without_jit():
        return {row.name: row for row in rows}


def _later_attempt(since: datetime | None = None) -> Exists:
    """Whether a later attempt of the run's slot exists (negated: the run is its slot's
    last attempt). One probe of the unique ``(job, scheduled_for, attempt)`` index.

    ``since``: the runs asked about are all of slots after it. PostgreSQL plans ``NOT
    EXISTS`` as an anti-join over the job's attempts: the bound keeps it to those slots."""
    later = JobRun.objects.filter(
        job=OuterRef("job"),
        scheduled_for=OuterRef("scheduled_for"),
        attempt__gt=OuterRef("attempt"),
    )
    if since is not None:
        later = later.filter(scheduled_for__gt=since)
    return Exists(later)


def _probed(condition: Any) -> Q:
    """``condition``, kept a filter of each row rather than a join: for a scan that stops at
    a ``LIMIT``, a probe per row read beats an anti-join over every run of the job first.
    (PostgreSQL turns only a top-level ``NOT EXISTS`` into a join, not one inside an ``OR``.)"""
    return Q(condition) | Q(pk__isnull=True)


def _own_slot() -> Exists:
    """Whether the run's slot is one the job ran itself (a run of it not of kind
    ``backfill``): a backfill repairs or fails the job's slots, and adds none."""
    return Exists(
        JobRun.objects.filter(job=OuterRef("job"), scheduled_for=OuterRef("scheduled_for")).exclude(
            kind=RunKind.BACKFILL
        )
    )


def _late_oneoffs(now: datetime) -> Q:
    """The one-offs :func:`all_health` lists when it judges every job: not done, past their
    stored deadline and not held by a run. The condition includes the partial index's
    (``fencedjobs_oneshot_due``), so that only the pending one-shot rows are read."""
    return (
        Q(paused=False)
        & ~Q(kind=RunKind.SCHEDULED)
        & Q(kind=RunKind.ONCE, late_after__lt=now)
        & (Q(owner="") | Q(lease_until__lte=now))
    )


def _may_not_be_ok(now: datetime, settings: Any) -> Q:
    """The instances :func:`all_health` judges one by one when it judges every job: those
    that may be in a state other than ok, running or disabled, found by indexes whatever
    their number and history (each condition below is one way not to be ok)."""
    period = now - settings.FAILURE_RATE_PERIOD
    capped = JobRun.objects.filter(~_later_attempt(period)).filter(
        capped=True, scheduled_for__gt=period
    )
    troubled_tasks = RunTask.objects.filter(
        status__in=[*UNFINISHED_TASK, TaskStatus.FAILED], run__scheduled_for__gt=period
    )
    return Q(instance__enabled=True) & (  # a disabled one is counted, never listed
        Q(paused=True)  # enabled but paused: invalid, or paused by an operator
        | Q(consecutive_failures__gt=0)
        # Two failures within the failure rate's window of runs: the rate may warn.
        | Q(previous_failure_age__lte=settings.FAILURE_RATE_RUNS)
        | Q(late_after__isnull=True, paused=False)
        | Q(late_after__lt=now, paused=False)
        | Q(name__in=capped.values("job"))
        | Q(name__in=troubled_tasks.values("job"))
        # Notified in another state: judged again, so that its recovery is told too.
        | Q(name__in=JobNotice.objects.exclude(state=State.OK).values("job"))
    )


def _read_tasks(leases: Iterable[JobLease]) -> dict[str, TaskSummary]:
    """Each job's :class:`TaskSummary`, from the two runs :func:`_read_leases` found for it:
    one query (none when no job has tasks), one row per run, status and task path."""
    wanted = {
        row.name: (row.tasks_waiting_run_id, row.tasks_outcome_run_id)  # type: ignore[attr-defined]
        for row in leases
    }
    run_ids = {pk for pair in wanted.values() for pk in pair if pk is not None}
    if not run_ids:
        return {}
    groups = (
        RunTask.objects.using(lease_db())
        .filter(run_id__in=run_ids)
        .order_by()
        .values("run_id", "run__scheduled_for", "status", "task_path", "backend", "queue_name")
        # Within one run, status and path: the earliest start, and one failed task's error.
        .annotate(count=Count("pk"), started=Min("started_at"), error=Max("error"))
    )
    counts: dict[int, dict[str, Any]] = {}
    for group in sorted(groups, key=lambda g: (g["run_id"], g["task_path"])):
        slot = counts.setdefault(
            group["run_id"],
            {"run_pk": group["run_id"], "scheduled_for": group["run__scheduled_for"]},
        )
        status = group["status"]
        slot[status] = slot.get(status, 0) + group["count"]
        if status in UNFINISHED_TASK:
            place = f"backend {group['backend']!r}" + (
                f", queue {group['queue_name']!r}" if group["queue_name"] else ""
            )
            places = slot.setdefault("places", {})
            if place not in places.get(status, ""):
                places[status] = "; ".join(filter(None, (places.get(status), place)))
        if status == TaskStatus.RUNNING and group["started"] is not None:
            slot["running_since"] = min(filter(None, (slot.get("running_since"), group["started"])))
        if status == TaskStatus.FAILED and not slot.get("failed_task"):
            slot.update(failed_task=group["task_path"], error_excerpt=error_excerpt(group["error"]))
    slots = {pk: TaskSlot(**fields) for pk, fields in counts.items()}
    return {
        name: TaskSummary(unfinished=slots.get(waiting), last_outcome=slots.get(outcome))
        for name, (waiting, outcome) in wanted.items()
        if waiting is not None or outcome is not None
    }


# -- deciding ----------------------------------------------------------------------------------


def assess(
    name: str,
    job: Job | None,
    lease: JobLease | None,
    latest: JobRun | None,
    finished: JobRun | None,
    now: datetime,
    *,
    tasks: TaskSummary | None = None,
    recent: tuple[int, int] = (0, 0),
    retried: int = 0,
    coverage: runners.Coverage | None = None,
) -> JobHealth:
    """Decide one job's state from its declaration, lease row, latest runs, their tasks, its
    failure rate's window (``recent``: slots, of which failed; ``retried``: how many needed
    retries) and the runners seen (``coverage``), at ``now``. Pure: no query, no clock; a
    verdict reached early carries the facts read so far."""
    facts = _recorded(
        JobFacts(
            name=name,
            checked_at=now,
            job=job,
            tasks=tasks,
            recent_runs=recent[0],
            recent_failures=recent[1],
            recent_retried=retried,
            last_run=RunSummary.of(latest) if latest is not None else None,
            last_finished_run=RunSummary.of(finished) if finished is not None else None,
        ),
        lease,
    )
    if job is None:
        return facts.judged(
            State.REMOVED,
            Severity.HEALTHY,
            "no longer declared in code (removed or renamed); its history is kept",
        )
    facts = replace(facts, timezone=job.timezone, failure_threshold=job.failure_threshold)
    schedule = job.schedule
    if schedule is None:
        why = f"{job.schedule_error} ({job.check_id})" if job.check_id else str(job.schedule_error)
        return facts.judged(State.INVALID, Severity.CRITICAL, why)
    facts = replace(facts, tz=schedule.tz, schedule=describe_schedule(schedule))
    if lease is None:  # `migrate`, `checkjobs` and the admin create it when they see the job
        return replace(facts, next_run_at=schedule.next_after(now)).judged(
            State.NEVER_RUN,
            Severity.WARNING,
            "not recorded yet (no lease row), so it cannot be late: `migrate`, `checkjobs` "
            "and the admin record a job when they first see it, if they may write to the "
            "database",
        )
    # The dead man's switch: the first slot after the last success (never succeeded: after
    # the job was first seen) must succeed by its deadline; a slot an operator skipped since
    # (the job's latest end, recorded skipped) or a calendar excluded is not awaited, the
    # one after it is; or, when the excluded slot was deferred, its run at that instant.
    since = lease.last_success_at or lease.created_at
    skipped = facts.last_finished_run
    if skipped is not None and skipped.outcome in (Outcome.SKIPPED, Outcome.EXCLUDED):
        since = max(since, skipped.scheduled_for)
    awaited = schedule.next_after(since)
    if skipped and skipped.outcome == Outcome.EXCLUDED and skipped.scheduled_for == lease.run_slot:
        awaited = lease.next_run_at  # deferred (defer_excluded): its run then
    facts = replace(facts, awaited_slot=awaited, expected_by=job.late_after(awaited))
    if lease.paused:
        return facts.judged(*_paused(facts, lease))
    if coverage is not None:
        served = job.parent or name  # runners run an instance's job
        facts = replace(facts, runners=tuple(r.label for r in coverage.serving(served)))
        if problem := coverage.problem(served, lease.created_at, facts.at):
            return facts.judged(State.NO_RUNNER, Severity.CRITICAL, problem)
    state, severity, reason = _judge(facts, job)
    if facts.recent_retried:  # said, and never changes the state
        reason += f"; {facts.recent_retried} of the last {facts.recent_runs} slots needed retries"
    return facts.judged(state, severity, reason)


def assess_oneshot(
    row: JobLease, now: datetime, *, coverage: runners.Coverage | None = None
) -> JobHealth:
    """Decide the state of a one-off's or backfill slot's lease row ``row`` at ``now``: a
    one-off not done and not held past its stored deadline is late (``no_runner`` when no
    live runner serves its job); any other is healthy. Pure, as :func:`assess`; times are
    in the zone of the job it belongs to (its runs are judged as that job's)."""
    declared = registry.get(row.parent) if row.parent in registry else None
    facts = _recorded(JobFacts(name=row.name, checked_at=now), row)
    if declared is not None and declared.schedule is not None:
        facts = replace(facts, timezone=declared.timezone, tz=declared.schedule.tz)
    slot = row.run_slot
    what = "one-off" if row.kind == RunKind.ONCE else "backfill slot"
    at = facts.at(slot) if slot is not None else "?"
    target = oneshots.target_of(row.name)
    if row.paused:
        return facts.judged(State.OK, Severity.HEALTHY, f"the {what} of {target} at {at} is done")
    if facts.running:
        until = facts.at(facts.lease_until, ref=now) if facts.lease_until else "?"
        return facts.judged(
            State.RUNNING,
            Severity.HEALTHY,
            f"the {what} of {target} at {at} is running on {facts.owner} (fence "
            f"{facts.fence}); lease until {until}",
        )
    deadline = row.late_after if row.kind == RunKind.ONCE else None
    facts = replace(facts, awaited_slot=slot, expected_by=deadline)
    if deadline is None or now <= deadline:
        by = f", expected by {facts.at(deadline, ref=slot)}" if deadline is not None else ""
        return facts.judged(
            State.NEVER_RUN, Severity.HEALTHY, f"the {what} of {target} at {at} has not run{by}"
        )
    late = (
        f"the one-off of {target} at {at} has not run: expected by "
        f"{facts.at(deadline, ref=slot)}, {runners.duration_text(now - deadline)} late"
    )
    if row.next_run_at > now:
        late += f"; its next attempt is due {facts.at(row.next_run_at, ref=now)}"
    if coverage is not None:
        facts = replace(facts, runners=tuple(r.label for r in coverage.serving(row.parent)))
        if problem := coverage.problem(row.parent, row.created_at, facts.at):
            return facts.judged(State.NO_RUNNER, Severity.CRITICAL, f"{late}; {problem}")
    return facts.judged(State.LATE, Severity.CRITICAL, late)


def _recorded(facts: JobFacts, lease: JobLease | None) -> JobFacts:
    """``facts`` with what ``lease`` holds (a lease counts as held while unexpired)."""
    if lease is None:
        return facts
    running = bool(lease.owner) and lease.lease_until > facts.checked_at
    return replace(
        facts,
        last_success_at=lease.last_success_at,
        next_run_at=lease.next_run_at,
        consecutive_failures=lease.consecutive_failures,
        paused=lease.paused,
        running=running,
        owner=lease.owner if running else "",
        fence=lease.fence,
        lease_until=lease.lease_until if running else None,
    )


def _paused(f: JobFacts, lease: JobLease) -> Verdict:
    since = f"last success {f.at(f.last_success_at)}" if f.last_success_at else "never succeeded"
    instance = lease.instance if lease.instance_id is not None else None
    disabled = instance is not None and not (instance.enabled and instance.paused)
    why = "disabled: no runs until enabled" if disabled else "paused: no runs until resumed"
    return State.PAUSED, Severity.WARNING, f"{why}; {since}"


def _judge(f: JobFacts, job: Job) -> Verdict:
    """The state of a declared, recorded job neither paused nor without a runner: the first
    of :data:`_RULES` that gives one, else a healthy state."""
    for rule in _RULES:
        verdict = rule(f, job)
        if verdict is not None:
            return verdict
    return _healthy(f, job)


def _failing(f: JobFacts, job: Job) -> Verdict | None:
    """Critical from ``failure_threshold`` consecutive failures on."""
    if f.consecutive_failures < job.failure_threshold:
        return None
    return (
        State.FAILING,
        Severity.CRITICAL,
        f"{f.consecutive_failures} consecutive failures "
        f"(threshold {job.failure_threshold}){_last_failure(f)}",
    )


def _failing_rate(f: JobFacts, job: Job) -> Verdict | None:
    """Critical from ``FAILURE_RATE_CRITICAL`` of the window failed, and at least
    ``failure_threshold`` (and 2) runs."""
    settings = get_settings()
    if f.recent_failures < max(MIN_RATE_FAILURES, job.failure_threshold) or (
        (f.failure_rate or 0.0) < settings.FAILURE_RATE_CRITICAL
    ):
        return None
    return (
        State.FAILING,
        Severity.CRITICAL,
        f"{_rated(f)}, critical from {settings.FAILURE_RATE_CRITICAL:.0%}){_last_failure(f)}",
    )


def _late(f: JobFacts, job: Job) -> Verdict | None:
    """The dead man's switch: no success by the awaited slot's deadline."""
    slot, deadline, success = f.awaited_slot, f.expected_by, f.last_success_at
    if slot is None or deadline is None or f.checked_at <= deadline:
        return None
    if success is not None:
        reason = (
            f"no successful run since {f.at(success)}; expected by {f.at(deadline, ref=success)}"
        )
    else:
        reason = (
            f"never succeeded; its first slot {f.at(slot)} was expected to "
            f"succeed by {f.at(deadline, ref=slot)}"
        )
    last = f.last_finished_run
    if last is not None and last.outcome != Outcome.SUCCEEDED:
        reason += f" (last run: {Outcome(last.outcome).label})"
    return State.LATE, Severity.CRITICAL, reason


def _tasks_late(f: JobFacts, job: Job) -> Verdict | None:
    """The run's own deadline bounds its tasks too: absence covers the workers."""
    waiting = f.tasks.unfinished if f.tasks is not None else None
    if waiting is None or f.checked_at <= (due := job.late_after(waiting.scheduled_for)):
        return None
    return State.LATE, Severity.CRITICAL, _unfinished_tasks(waiting, due, f.at)


def _tasks_failed(f: JobFacts, job: Job) -> Verdict | None:
    """The job's latest task outcome is a failure."""
    outcome = f.tasks.last_outcome if f.tasks is not None else None
    if outcome is None or not outcome.failed:
        return None
    failed = f"{outcome.failed} of {outcome.total} tasks" if outcome.total > 1 else "its task"
    excerpt = f": {outcome.error_excerpt}" if outcome.error_excerpt else ""
    return (
        State.FAILING,
        Severity.CRITICAL,
        f"the latest task outcome is a failure: {failed} of the slot "
        f"{f.at(outcome.scheduled_for)} failed; {outcome.failed_task}{excerpt}",
    )


def _failing_unproven(f: JobFacts, job: Job) -> Verdict | None:
    """A job that has failed is never healthy before its first success; below the
    threshold, a warning (critical from the threshold on, late past the deadline)."""
    if f.last_success_at is not None or not f.consecutive_failures:
        return None
    failures = f.consecutive_failures
    plural = "s" if failures != 1 else ""
    deadline = f"{f.at(f.expected_by, ref=f.awaited_slot)}" if f.expected_by else "?"
    return (
        State.FAILING,
        Severity.WARNING,
        f"{failures} failure{plural} and no success yet (critical at "
        f"{job.failure_threshold} consecutive failures){_last_failure(f)}{_in_progress(f)}; "
        f"a success is expected by {deadline}",
    )


def _failing_recently(f: JobFacts, job: Job) -> Verdict | None:
    """A failing job never reads ok: the last run failed, or too many recent ones did."""
    settings = get_settings()
    rate_warning = (
        f.recent_failures >= MIN_RATE_FAILURES
        and (f.failure_rate or 0.0) >= settings.FAILURE_RATE_WARNING
    )
    if not f.consecutive_failures and not rate_warning:
        return None
    parts = []
    if f.consecutive_failures:
        parts.append(
            f"the last run failed ({f.consecutive_failures} in a row; critical at "
            f"{job.failure_threshold})"
        )
    if rate_warning:
        parts.append(
            f"{_rated(f)}; warning from {settings.FAILURE_RATE_WARNING:.0%}, critical from "
            f"{settings.FAILURE_RATE_CRITICAL:.0%})"
        )
    reason = "; ".join(parts) + _last_failure(f) + _in_progress(f)
    return State.FAILING, Severity.WARNING, reason


#: The rules of :func:`_judge`, in order.
_RULES: tuple[Callable[[JobFacts, Job], Verdict | None], ...] = (
    _failing,
    _failing_rate,
    _late,
    _tasks_late,
    _tasks_failed,
    _failing_unproven,
    _failing_recently,
)


def _healthy(f: JobFacts, job: Job) -> Verdict:
    """No rule found a problem: running, not succeeded yet, capped, or ok."""
    if f.running:
        last = f.last_run
        since = ""
        if last is not None and last.outcome == Outcome.RUNNING and last.started_at:
            since = f" since {f.at(last.started_at)}"
        until = f.at(f.lease_until, ref=f.checked_at) if f.lease_until else "?"
        reason = f"running{since} on {f.owner} (fence {f.fence}); lease until {until}"
        return State.RUNNING, Severity.HEALTHY, reason
    if f.last_success_at is None:
        slot = f.at(f.awaited_slot) if f.awaited_slot else "?"
        deadline = f.at(f.expected_by, ref=f.awaited_slot) if f.expected_by else "?"
        reason = f"no successful run yet; first slot {slot}, expected by {deadline}"
        return State.NEVER_RUN, Severity.HEALTHY, reason + _excluded(f)
    if f.last_finished_run is not None and f.last_finished_run.capped:
        return (
            State.CAPPED,
            Severity.WARNING,
            f"the last run stopped at max_batches ({job.max_batches}) with work left: a "
            f"backlog is building (raise max_batches or run more often)",
        )
    next_run = "?"
    if f.next_run_at is not None:
        next_run = "due now" if f.next_run_at <= f.checked_at else f.at(f.next_run_at, f.checked_at)
    reason = f"last success {f.at(f.last_success_at)}; next run {next_run}"
    return State.OK, Severity.HEALTHY, reason + _excluded(f)


def _excluded(f: JobFacts) -> str:
    """``; the slot of <when> was excluded by <calendar>: <why>``, when the job's latest
    end was a slot a calendar excluded: not late, on purpose."""
    last = f.last_finished_run
    if last is None or last.outcome != Outcome.EXCLUDED:
        return ""
    return f"; the slot of {f.at(last.scheduled_for)} was excluded by {last.error_excerpt}"


def _last_failure(f: JobFacts) -> str:
    """``; last failed at <when>: <error>``, when the last run that ran to an end failed."""
    last = f.last_finished_run
    if last is None or last.outcome not in FAILURE_OUTCOMES or not last.finished_at:
        return ""
    detail = f"; last {Outcome(last.outcome).label} at {f.at(last.finished_at)}"
    return f"{detail}: {last.error_excerpt}" if last.error_excerpt else detail


def _rated(f: JobFacts) -> str:
    """The failure rate's window in words, its parenthesis left open for the threshold."""
    rate = f.failure_rate or 0.0
    return f"{f.recent_failures} of its last {f.recent_runs} runs failed ({rate:.0%}"


def _in_progress(f: JobFacts) -> str:
    return "; a new run is in progress" if f.running else ""


def _unfinished_tasks(slot: TaskSlot, due: datetime, at: Callable[..., str]) -> str:
    """Why unfinished tasks make a job late: how many, of which slot, and what each status
    most likely means."""
    count = slot.unfinished
    tasks = "1 task" if count == 1 else f"{count} tasks"
    has = "has" if count == 1 else "have"
    parts = []
    for status, n in (
        (TaskStatus.PENDING, slot.pending),
        (TaskStatus.READY, slot.ready),
        (TaskStatus.RUNNING, slot.running),
    ):
        if not n:
            continue
        if status == TaskStatus.RUNNING:
            first = "" if n == 1 else "the first "
            since = at(slot.running_since, ref=slot.scheduled_for) if slot.running_since else "?"
            their = "its" if n == 1 else "their"
            meaning = f"{first}started at {since} and not finished ({their} worker may have died)"
        else:
            meaning = UNFINISHED_MEANING[status]
        where = slot.places.get(status)
        parts.append(f"{n} {status.value}{f' on {where}' if where else ''}: {meaning}")
    return (
        f"{tasks} of the slot {at(slot.scheduled_for)} {has} not finished by "
        f"{at(due, ref=slot.scheduled_for)}: " + "; ".join(parts)
    )
