"""Is each job healthy? The one place that decides, for the admin, ``checkjobs`` and metrics.

A job's state is derived from stored facts (its :class:`~django_fencedjobs.models.JobLease`
row, its latest runs) and its declaration in code, against **one** reading of the clock.
Nothing here writes. In order of precedence (the first that applies wins):

============  ========  ===============================================================
state         severity  when
============  ========  ===============================================================
removed       healthy   a lease row exists but no job of that name is declared any more
                        (history is kept; nothing alerts)
invalid       critical  the declaration's schedule is invalid (``manage.py check``: E001..)
never_run     warning   declared, but its lease row does not exist: nothing that could
                        write has seen the job yet, so it cannot be judged late
paused        warning   an operator paused it
no_runner     critical  no live runner serves it, though runners have been seen
                        (:mod:`django_fencedjobs.runners`): reached ``RUNNER_TIMEOUT``
                        (30 s) after the last runner that ran it stopped beating, whatever
                        the job's interval
failing       critical  ``consecutive_failures >= job.failure_threshold``
failing       critical  the failure rate: of the job's latest ``FAILURE_RATE_RUNS`` runs
                        that ran to an end (succeeded, failed, timed out) within
                        ``FAILURE_RATE_PERIOD``, at least ``FAILURE_RATE_CRITICAL`` failed,
                        and at least ``failure_threshold`` (and 2) of them
late          critical  the dead man's switch: the first slot after the last success
                        (never succeeded: the first slot after the lease row was created,
                        i.e. after the job was first seen live, see
                        :mod:`django_fencedjobs.baseline`) plus ``run_timeout`` plus
                        ``grace`` has passed
late          critical  a task a run of the job enqueued (``run.enqueue``, see
                        :mod:`django_fencedjobs.integrations.tasks`) has not finished
                        (pending, ready or running) and its run's slot plus
                        ``run_timeout`` plus ``grace`` has passed
failing       critical  the job's latest task outcome is a failure: the latest slot among
                        its finished tasks has a failed task (a later slot whose tasks
                        all succeeded clears it)
failing       warning   it never succeeded and has failed (fewer times than the threshold)
failing       warning   the last run that ran to an end failed (``consecutive_failures``),
                        or at least ``FAILURE_RATE_WARNING`` of the window failed (and at
                        least 2 runs): a failing job never reads ok
running       healthy   a run holds an unexpired lease
never_run     healthy   no success yet, but the first slot's deadline has not passed
capped        warning   the latest finished run stopped at ``max_batches`` with work left
ok            healthy   none of the above
============  ========  ===============================================================

"Has passed" is strict: at the deadline instant itself a job is not yet late.

A run's tasks (:class:`~django_fencedjobs.models.RunTask`) are judged too: absence covers
the workers. A task still ``pending`` was never handed to its backend (the runner stopped
between its commit and the hand-over), one still ``ready`` was taken by no worker, one still
``running`` past the deadline has most likely lost its worker. :attr:`JobHealth.tasks`
holds what was read: the oldest slot with unfinished tasks and the latest slot with a
finished one (:class:`TaskSummary`).

Deciding is all this module does. Its callers present what it decided: the admin and
``checkjobs`` write the times (:mod:`django_fencedjobs.instants`, the same presentation
as the reasons here), ``checkjobs`` picks its exit status and writes JSON.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from enum import StrEnum
from typing import Any

from django.db.models import Count, F, Func, IntegerField, Max, Min, OuterRef, Subquery

from django_fencedjobs import clock, runners
from django_fencedjobs.conf import get_settings
from django_fencedjobs.db import lease_db
from django_fencedjobs.exceptions import UnknownJob
from django_fencedjobs.instants import format_instant
from django_fencedjobs.listing import describe_schedule
from django_fencedjobs.models import (
    FAILURE_OUTCOMES,
    FINISHED_TASK,
    RATED_OUTCOMES,
    UNFINISHED_TASK,
    JobLease,
    JobRun,
    Outcome,
    RunTask,
    TaskStatus,
)
from django_fencedjobs.registry import Job, registry
from django_fencedjobs.text import error_excerpt

__all__ = [
    "JobHealth",
    "RunSummary",
    "Severity",
    "State",
    "TaskSlot",
    "TaskSummary",
    "all_health",
    "job_health",
]

#: The fewest failures in the window that make a failure rate a verdict: one failure is
#: the last run's (judged on its own), not a rate.
MIN_RATE_FAILURES = 2
#: What an unfinished task past its deadline most likely means, by status.
UNFINISHED_MEANING = {
    TaskStatus.PENDING: "never handed to the task backend (the runner stopped between its "
    "commit and the hand-over)",
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
    #: The latest slot with a task that has finished: its outcome is the job's latest task
    #: outcome (a failure when ``failed``).
    last_outcome: TaskSlot | None = None


@dataclass(frozen=True)
class JobHealth:
    """One job's state, with a one-line human reason and the facts it was decided from."""

    name: str
    state: State
    severity: Severity
    reason: str
    #: The single clock reading the state was decided against (aware, UTC).
    checked_at: datetime
    #: The declaration; None when the job is no longer declared (state ``removed``).
    job: Job | None = field(default=None, repr=False, compare=False)
    #: The zone the job was declared with, as written.
    timezone: str = "UTC"
    #: The zone its times are read in: its schedule's, as resolved by the schedule; UTC for
    #: a job without a valid schedule (removed, invalid).
    tz: tzinfo = UTC
    schedule: str = ""
    last_success_at: datetime | None = None
    #: When the job is next due (the lease row's ``next_run_at``); before the row exists,
    #: the schedule's next fire time.
    next_run_at: datetime | None = None
    #: The slot whose run the dead man's switch waits for: the first after the last success
    #: (never succeeded: after the job was first seen).
    awaited_slot: datetime | None = None
    #: The dead man's switch: past this instant without a success, the job is late
    #: (``awaited_slot`` plus the run timeout plus grace).
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
    #: The failure rate's window (``FAILURE_RATE_RUNS`` latest runs that ran to an end,
    #: within ``FAILURE_RATE_PERIOD``): how many runs it holds, and how many of them failed.
    recent_runs: int = 0
    recent_failures: int = 0
    #: The live runners that run it (their owner labels; ``--once`` passes marked so).
    runners: tuple[str, ...] = ()

    @property
    def healthy(self) -> bool:
        return self.severity is Severity.HEALTHY

    @property
    def failure_rate(self) -> float | None:
        """Failed (or timed out) runs among the recent ones; None without any."""
        return self.recent_failures / self.recent_runs if self.recent_runs else None


# -- reading ---------------------------------------------------------------------------------


def all_health(
    names: Sequence[str] | None = None, *, now: datetime | None = None
) -> list[JobHealth]:
    """The health of every job (declared in code or present in the database), or of the named
    ones (:class:`UnknownJob` for a name that is neither), worst first, then by name.

    A constant number of queries whatever the number of jobs: the runners' rows, the
    clock (when it is the
    database's), the lease rows with the ids of each job's latest run and latest finished run
    (two correlated subqueries, each one index lookup on ``(job, -scheduled_for)``), its
    failure rate's window counted (two more, each at most ``FAILURE_RATE_RUNS`` rows of the
    same index) and the two runs whose tasks health reads (two more, on the tasks'
    ``(status, job)`` index), those runs, and, when any job has tasks, the tasks of those
    runs counted by status.
    """
    if now is None:
        now = clock.now()
    leases = _read_leases(names, now)
    if names:
        unknown = [name for name in names if name not in registry and name not in leases]
        if unknown:
            known = ", ".join(sorted(set(registry.names()) | set(leases))) or "none"
            raise UnknownJob(
                f"no job named {', '.join(map(repr, unknown))} is declared or recorded "
                f"(known: {known})"
            )
        wanted = list(dict.fromkeys(names))
    else:
        wanted = list(dict.fromkeys([*registry.names(), *sorted(leases)]))
    run_ids = {
        pk
        for row in leases.values()
        for pk in (row.latest_run_id, row.latest_finished_id)  # type: ignore[attr-defined]
        if pk is not None
    }
    runs = (
        {run.pk: run for run in JobRun.objects.using(lease_db()).filter(pk__in=run_ids)}
        if run_ids
        else {}
    )
    tasks = _read_tasks(leases.values())
    coverage = runners.read(now)
    result = []
    for name in wanted:
        row = leases.get(name)
        latest = finished = None
        if row is not None:
            latest = runs.get(row.latest_run_id)  # type: ignore[attr-defined]
            finished = runs.get(row.latest_finished_id)  # type: ignore[attr-defined]
        job = registry.get(name) if name in registry else None
        result.append(
            assess(
                name,
                job,
                row,
                latest,
                finished,
                now,
                tasks=tasks.get(name),
                coverage=coverage,
                recent=(row.recent_runs or 0, row.recent_failures or 0)  # type: ignore[attr-defined]
                if row is not None
                else (0, 0),
            )
        )
    result.sort(key=lambda h: (h.severity.rank, h.name))
    return result


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
    # The failure rate's window: the job's latest FAILURE_RATE_RUNS runs that ran to an end,
    # within FAILURE_RATE_PERIOD; a LIMIT on the (job, -scheduled_for) index, per job.
    window = (
        JobRun.objects.filter(
            job=OuterRef(OuterRef("name")),
            outcome__in=RATED_OUTCOMES,
            scheduled_for__gt=now - settings.FAILURE_RATE_PERIOD,
        )
        .order_by("-scheduled_for")
        .values("pk")[: settings.FAILURE_RATE_RUNS]
    )
    in_window = JobRun.objects.filter(pk__in=Subquery(window))
    recent = JobRun.objects.filter(job=OuterRef("name")).order_by("-scheduled_for")
    # A task carries its run's fence, and a job's later runs have higher fences: the runs
    # of its oldest unfinished task and of its latest finished one, without joining the runs.
    tasks = RunTask.objects.filter(job=OuterRef("name"))
    rows = JobLease.objects.using(lease_db()).annotate(
        latest_run_id=Subquery(recent.values("pk")[:1]),
        latest_finished_id=Subquery(recent.exclude(outcome=Outcome.RUNNING).values("pk")[:1]),
        tasks_waiting_run_id=Subquery(
            tasks.filter(status__in=UNFINISHED_TASK).order_by("fence").values("run_id")[:1]
        ),
        tasks_outcome_run_id=Subquery(
            tasks.filter(status__in=FINISHED_TASK).order_by("-fence").values("run_id")[:1]
        ),
        recent_runs=_count(in_window),
        recent_failures=_count(in_window.filter(outcome__in=FAILURE_OUTCOMES)),
    )
    if names:
        rows = rows.filter(name__in=list(names))
    return {row.name: row for row in rows}


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
        .values("run_id", "run__scheduled_for", "status", "task_path")
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
        started = group["started"]
        if status == TaskStatus.RUNNING and started is not None:
            since = slot.get("running_since")
            slot["running_since"] = started if since is None else min(since, started)
        if status == TaskStatus.FAILED and not slot.get("failed_task"):
            slot.update(failed_task=group["task_path"], error_excerpt=error_excerpt(group["error"]))
    slots = {pk: TaskSlot(**fields) for pk, fields in counts.items()}
    return {
        name: TaskSummary(
            unfinished=slots.get(waiting) if waiting is not None else None,
            last_outcome=slots.get(outcome) if outcome is not None else None,
        )
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
    coverage: runners.Coverage | None = None,
) -> JobHealth:
    """Decide one job's state from its declaration, lease row, latest runs, the tasks of
    its runs (:class:`TaskSummary`), its failure rate's window (``recent``: runs, of
    which failed) and the runners seen (``coverage``), at ``now``.

    Pure: no query, no clock. :func:`all_health` gathers the inputs.
    """
    recent_runs, recent_failures = recent
    facts: dict[str, Any] = {
        "name": name,
        "checked_at": now,
        "job": job,
        "tasks": tasks,
        "recent_runs": recent_runs,
        "recent_failures": recent_failures,
    }
    if latest is not None:
        facts["last_run"] = RunSummary.of(latest)
    if finished is not None:
        facts["last_finished_run"] = RunSummary.of(finished)
    if lease is not None:
        running = bool(lease.owner) and lease.lease_until > now
        facts.update(
            last_success_at=lease.last_success_at,
            next_run_at=lease.next_run_at,
            consecutive_failures=lease.consecutive_failures,
            paused=lease.paused,
            running=running,
            owner=lease.owner if running else "",
            fence=lease.fence,
            lease_until=lease.lease_until if running else None,
        )

    if job is None:
        return _health(
            facts,
            State.REMOVED,
            Severity.HEALTHY,
            "no longer declared in code (removed or renamed); its history is kept",
        )
    facts.update(timezone=job.timezone, failure_threshold=job.failure_threshold)
    if job.schedule is None:
        return _health(facts, State.INVALID, Severity.CRITICAL, str(job.schedule_error))
    schedule = job.schedule
    tz = schedule.tz
    facts.update(tz=tz, schedule=describe_schedule(schedule))

    def at(value: datetime, ref: datetime | None = None) -> str:
        return format_instant(value, tz, ref=ref)

    if lease is None:
        # `migrate`, `checkjobs` and the admin create the row when they see the job: past
        # them, it is missing only where nothing that saw the job could write.
        facts["next_run_at"] = schedule.next_after(now)
        return _health(
            facts,
            State.NEVER_RUN,
            Severity.WARNING,
            "not recorded yet (no lease row), so it cannot be late: `migrate`, `checkjobs` "
            "and the admin record a job when they first see it, if they may write to the "
            "database",
        )

    anchor_from = lease.last_success_at or lease.created_at
    first_slot = schedule.next_after(anchor_from)
    expected_by = job.late_after(first_slot)
    facts.update(awaited_slot=first_slot, expected_by=expected_by)
    last_success = lease.last_success_at

    if lease.paused:
        since = f"; last success {at(last_success)}" if last_success else "; never succeeded"
        return _health(
            facts, State.PAUSED, Severity.WARNING, f"paused: no runs until resumed{since}"
        )
    if coverage is not None:
        facts["runners"] = tuple(r.label for r in coverage.serving(name))
        if problem := coverage.problem(name, lease.created_at, at):
            return _health(facts, State.NO_RUNNER, Severity.CRITICAL, problem)
    detail = ""
    if finished is not None and finished.outcome in FAILURE_OUTCOMES and finished.finished_at:
        detail = f"; last {Outcome(finished.outcome).label} at {at(finished.finished_at)}"
        if excerpt := error_excerpt(finished.error):
            detail += f": {excerpt}"
    if lease.consecutive_failures >= job.failure_threshold:
        return _health(
            facts,
            State.FAILING,
            Severity.CRITICAL,
            f"{lease.consecutive_failures} consecutive failures "
            f"(threshold {job.failure_threshold}){detail}",
        )
    settings = get_settings()
    rate = recent_failures / recent_runs if recent_runs else 0.0
    rated = f"{recent_failures} of its last {recent_runs} runs failed ({rate:.0%}"
    if (
        recent_failures >= max(MIN_RATE_FAILURES, job.failure_threshold)
        and rate >= settings.FAILURE_RATE_CRITICAL
    ):
        return _health(
            facts,
            State.FAILING,
            Severity.CRITICAL,
            f"{rated}, critical from {settings.FAILURE_RATE_CRITICAL:.0%}){detail}",
        )
    if now > expected_by:
        if last_success is not None:
            reason = (
                f"no successful run since {at(last_success)}; "
                f"expected by {at(expected_by, ref=last_success)}"
            )
        else:
            reason = (
                f"never succeeded; its first slot {at(first_slot)} was expected to "
                f"succeed by {at(expected_by, ref=first_slot)}"
            )
        if finished is not None and finished.outcome != Outcome.SUCCEEDED:
            reason += f" (last run: {Outcome(finished.outcome).label})"
        return _health(facts, State.LATE, Severity.CRITICAL, reason)
    waiting = tasks.unfinished if tasks is not None else None
    if waiting is not None:
        # The run's own deadline bounds its tasks too: absence covers the workers.
        tasks_due = job.late_after(waiting.scheduled_for)
        if now > tasks_due:
            return _health(
                facts, State.LATE, Severity.CRITICAL, _tasks_late(waiting, tasks_due, at)
            )
    outcome = tasks.last_outcome if tasks is not None else None
    if outcome is not None and outcome.failed:
        failed = f"{outcome.failed} of {outcome.total} tasks" if outcome.total > 1 else "its task"
        excerpt = f": {outcome.error_excerpt}" if outcome.error_excerpt else ""
        return _health(
            facts,
            State.FAILING,
            Severity.CRITICAL,
            f"the latest task outcome is a failure: {failed} of the slot "
            f"{at(outcome.scheduled_for)} failed; {outcome.failed_task}{excerpt}",
        )
    if last_success is None and lease.consecutive_failures:
        # A job that has failed is never healthy before its first success; below the
        # threshold, a warning (critical from the threshold on, late past the deadline).
        failures = lease.consecutive_failures
        plural = "s" if failures != 1 else ""
        in_progress = "; a new run is in progress" if facts["running"] else ""
        return _health(
            facts,
            State.FAILING,
            Severity.WARNING,
            f"{failures} failure{plural} and no success yet (critical at "
            f"{job.failure_threshold} consecutive failures){detail}{in_progress}; a success is "
            f"expected by {at(expected_by, ref=first_slot)}",
        )
    rate_warning = recent_failures >= MIN_RATE_FAILURES and rate >= settings.FAILURE_RATE_WARNING
    if lease.consecutive_failures or rate_warning:
        # A failing job never reads ok: the last run failed, or too many recent ones did.
        parts = []
        if lease.consecutive_failures:
            parts.append(
                f"the last run failed ({lease.consecutive_failures} in a row; critical at "
                f"{job.failure_threshold})"
            )
        if rate_warning:
            parts.append(
                f"{rated}; warning from {settings.FAILURE_RATE_WARNING:.0%}, critical from "
                f"{settings.FAILURE_RATE_CRITICAL:.0%})"
            )
        in_progress = "; a new run is in progress" if facts["running"] else ""
        return _health(
            facts,
            State.FAILING,
            Severity.WARNING,
            "; ".join(parts) + detail + in_progress,
        )
    if facts["running"]:
        since = ""
        if latest is not None and latest.outcome == Outcome.RUNNING and latest.started_at:
            since = f" since {at(latest.started_at)}"
        return _health(
            facts,
            State.RUNNING,
            Severity.HEALTHY,
            f"running{since} on {lease.owner} (fence {lease.fence}); "
            f"lease until {at(lease.lease_until, ref=now)}",
        )
    if last_success is None:
        return _health(
            facts,
            State.NEVER_RUN,
            Severity.HEALTHY,
            f"no successful run yet; first slot {at(first_slot)}, "
            f"expected by {at(expected_by, ref=first_slot)}",
        )
    if finished is not None and finished.capped:
        return _health(
            facts,
            State.CAPPED,
            Severity.WARNING,
            f"the last run stopped at max_batches ({job.max_batches}) with work left: a "
            f"backlog is building (raise max_batches or run more often)",
        )
    return _health(
        facts,
        State.OK,
        Severity.HEALTHY,
        f"last success {at(last_success)}; next run {_next(lease.next_run_at, now, tz)}",
    )


def _tasks_late(slot: TaskSlot, due: datetime, at: Callable[..., str]) -> str:
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
        parts.append(f"{n} {status.value}: {meaning}")
    return (
        f"{tasks} of the slot {at(slot.scheduled_for)} {has} not finished by "
        f"{at(due, ref=slot.scheduled_for)}: " + "; ".join(parts)
    )


def _health(facts: dict[str, Any], state: State, severity: Severity, reason: str) -> JobHealth:
    return JobHealth(state=state, severity=severity, reason=reason, **facts)


def _next(next_run_at: datetime, now: datetime, tz: tzinfo) -> str:
    return "due now" if next_run_at <= now else format_instant(next_run_at, tz, ref=now)
