"""Backfills and one-offs: an operator's runs of chosen slots (from code, ``manage.py
backfill`` / ``runonce``, the admin).

A backfill of ``[start, end)`` queues one lease row per selected slot
(:mod:`django_fencedjobs.oneshots`), run by the runners at most ``concurrency`` at once,
each under its own lease and fence, as the slot's next attempt (kind ``backfill``). A
one-off is one run at an instant, with arguments of its own if wanted (kind ``once``).
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Max

from django_fencedjobs import clock, instances, lease, oneshots
from django_fencedjobs.checkids import CheckId
from django_fencedjobs.db import lease_db
from django_fencedjobs.exceptions import FencedJobsError, UnknownJob
from django_fencedjobs.instants import iso_utc
from django_fencedjobs.models import (
    LEASE_FREE,
    Backfill,
    BackfillSelection,
    JobLease,
    JobRun,
    Outcome,
    RunKind,
    Watermark,
)
from django_fencedjobs.registry import Job

#: A backfill queues at most this many slots: a wider range is split by the operator.
MAX_BACKFILL_SLOTS = 10_000


class BackfillError(FencedJobsError, ValueError):
    """A backfill or one-off that cannot be made as asked; the message says why."""


@dataclass(frozen=True)
class PlannedSlot:
    slot: datetime
    #: The attempt its backfill run will be (1 when the slot has no run yet).
    attempt: int
    #: The outcome of the slot's last attempt, "" when it has none.
    last_outcome: str


@dataclass
class BackfillPlan:
    """What a backfill would queue (:func:`plan_backfill`), and the slots it leaves."""

    job: str
    start: datetime
    end: datetime
    selection: str
    slots: list[PlannedSlot] = field(default_factory=list)
    #: Slots in the range it leaves, and why.
    left: list[tuple[datetime, str]] = field(default_factory=list)


def _target(name: str) -> Job:
    try:
        job = instances.get_job(name)
    except UnknownJob as exc:
        raise BackfillError(str(exc)) from None
    if job.instances:
        raise BackfillError(
            f"job {name!r} runs as its instances: name one, {name}[key], to backfill or run it"
        )
    if job.schedule is None:
        raise BackfillError(f"job {name!r} is invalid and does not run: {job.schedule_error}")
    return job


def _declared(job: Job) -> Job:
    """The declared job whose lease rows ``job``'s one-shot rows join (``parent``)."""
    parent = instances.declaring(job.name)
    if parent is None:
        raise BackfillError(f"job {job.name!r} is not declared in this process")
    return parent


def _aware(value: datetime, what: str) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise BackfillError(f"{what} {value.isoformat()} is naive: give a zone or an offset")


def plan_backfill(
    name: str, start: datetime, end: datetime, *, selection: str = BackfillSelection.MISSING
) -> BackfillPlan:
    """The dry run of :func:`backfill`: the slots of job (or instance) ``name`` in
    ``[start, end)`` it would queue, oldest first, and those it would leave and why."""
    return _plan(_target(name), start, end, selection)


def _plan(job: Job, start: datetime, end: datetime, selection: str) -> BackfillPlan:
    _aware(start, "from")
    _aware(end, "to")
    if selection not in BackfillSelection.values:
        raise BackfillError(
            f"slots must be one of {', '.join(BackfillSelection.values)}, got {selection!r}"
        )
    if end <= start:
        raise BackfillError(f"to ({iso_utc(end)}) must be after from ({iso_utc(start)})")
    if end > clock.now():
        raise BackfillError(
            f"to ({iso_utc(end)}) is in the future: a backfill runs past slots only"
        )
    # fire_times is (start, end]: one microsecond earlier makes it [start, end).
    slots = job.valid_schedule.fire_times(
        start - start.resolution, end - end.resolution, limit=MAX_BACKFILL_SLOTS + 1
    )
    if len(slots) > MAX_BACKFILL_SLOTS:
        raise BackfillError(
            f"{iso_utc(start)} to {iso_utc(end)} holds more than {MAX_BACKFILL_SLOTS} slots "
            f"of {job.name!r}: backfill a shorter range at a time"
        )
    plan = BackfillPlan(job.name, start, end, selection)
    if not slots:
        return plan
    last = _last_attempts(job.name, slots)
    queued = _queued(job.name, slots)
    for slot in slots:
        attempt, outcome = last.get(slot, (0, ""))
        if slot in queued:
            plan.left.append((slot, "queued already, by an earlier backfill"))
        elif outcome == Outcome.RUNNING:
            plan.left.append((slot, "running now"))
        elif selection == BackfillSelection.MISSING and attempt:
            plan.left.append((slot, f"has a run ({outcome})"))
        elif selection == BackfillSelection.FAILED and outcome in ("", Outcome.SUCCEEDED):
            plan.left.append((slot, "succeeded" if outcome else "has no run"))
        else:
            plan.slots.append(PlannedSlot(slot, attempt + 1, outcome))
    return plan


def _last_attempts(name: str, slots: list[datetime]) -> dict[datetime, tuple[int, str]]:
    """Each slot's last attempt number and outcome (slots with no run are left out)."""
    rows = (
        JobRun.objects.using(lease_db())
        .filter(job=name, scheduled_for__gte=slots[0], scheduled_for__lte=slots[-1])
        .order_by("scheduled_for", "attempt")
        .values_list("scheduled_for", "attempt", "outcome")
    )
    return {slot: (attempt, outcome) for slot, attempt, outcome in rows}


def _queued(name: str, slots: list[datetime]) -> set[datetime]:
    """The slots with a backfill row not done yet."""
    found = (
        JobLease.objects.using(lease_db())
        .filter(
            name__startswith=f"{name}{oneshots.SEPARATOR}{RunKind.BACKFILL}:",
            kind=RunKind.BACKFILL,
            paused=False,
            run_slot__gte=slots[0],
            run_slot__lte=slots[-1],
        )
        .values_list("run_slot", flat=True)
    )
    return {slot for slot in found if slot is not None}


def backfill(
    name: str,
    start: datetime,
    end: datetime,
    *,
    selection: str = BackfillSelection.MISSING,
    concurrency: int = 1,
    newest_first: bool = False,
    requested_by: str = "",
) -> tuple[Backfill, BackfillPlan]:
    """Queue a run of each slot :func:`plan_backfill` selects, all or none: the runners run
    at most ``concurrency`` at once, oldest (or newest) first. Returns the backfill and its
    plan."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise BackfillError(f"at once must be a positive int, got {concurrency!r}")
    job = _target(name)
    plan = _plan(job, start, end, selection)
    parent = _declared(job)
    alias = lease_db()
    now = clock.now()
    ordered = list(reversed(plan.slots)) if newest_first else plan.slots
    with transaction.atomic(using=alias):
        request = Backfill.objects.using(alias).create(
            job=job.name,
            start=start,
            end=end,
            selection=selection,
            newest_first=newest_first,
            concurrency=concurrency,
            slots=len(plan.slots),
            requested_by=requested_by,
            created_at=now,
        )
        for position, planned in enumerate(ordered):
            # All due now; the claim takes the earliest next_run_at first: the order asked for.
            due = now - (len(ordered) - position) * now.resolution
            _queue(
                job, parent, RunKind.BACKFILL, planned.slot, planned.attempt, due, backfill=request
            )
    return request, plan


def _queue(
    job: Job, parent: Job, kind: str, slot: datetime, attempt: int, due: datetime, **more: Any
) -> str:
    """Create or re-arm the one-shot row of ``job``'s ``slot`` (``more``: its ``backfill``,
    ``kwargs``, ``late_after``); return its name. A row done before (a slot backfilled
    again) is re-armed with its fence kept (fences never go down) and its own watermarks
    cleared (the slot is worked again from its interval's start)."""
    name = oneshots.row_name(job.name, kind, slot)
    alias = lease_db()
    fields = {
        "parent": parent.name,
        "kind": kind,
        "run_slot": slot,
        "attempt": attempt,
        "next_run_at": due,
        "lease_until": LEASE_FREE,
        "paused": False,
        "backfill": None,
        "kwargs": None,
        "late_after": None,
        **more,
    }
    rearmed = JobLease.objects.using(alias).filter(name=name, paused=True).update(**fields)
    if rearmed:
        Watermark.objects.using(alias).filter(job=name).delete()
        return name
    try:
        with transaction.atomic(using=alias):
            lease.create(
                [JobLease(name=name, created_at=clock.now(), **fields)], ignore_conflicts=False
            )
    except IntegrityError:
        raise BackfillError(f"{name} is queued already") from None
    return name


def run_once(name: str, at: datetime, *, kwargs: dict[str, Any] | None = None) -> str:
    """Run job (or instance) ``name`` once at ``at``, with ``kwargs`` over its own
    arguments: recorded as a run of kind ``once`` for slot ``at``, late (health, checkjobs,
    the admin) when it has not run ``grace`` after ``at``. Returns the one-off's name."""
    job = _target(name)
    _aware(at, "at")
    try:
        json.dumps(kwargs or {})
    except TypeError as exc:
        raise BackfillError(f"the one-off's arguments must be JSON: {exc}") from None
    try:
        inspect.signature(job.func).bind(None, **{**job.kwargs, **(kwargs or {})})
    except TypeError as exc:
        raise BackfillError(
            f"job {job.name!r}: the handler cannot take these arguments: {exc} "
            f"({CheckId.HANDLER_SIGNATURE})"
        ) from None
    except ValueError:  # no signature to read (a builtin): let the run say
        pass
    parent = _declared(job)
    attempts = (
        JobRun.objects.using(lease_db())
        .filter(job=job.name, scheduled_for=at)
        .aggregate(last=Max("attempt"))["last"]
    )
    more = {"kwargs": kwargs or None, "late_after": job.late_after(at)}
    return _queue(job, parent, RunKind.ONCE, at, (attempts or 0) + 1, at, **more)


__all__ = [
    "MAX_BACKFILL_SLOTS",
    "BackfillError",
    "BackfillPlan",
    "PlannedSlot",
    "backfill",
    "plan_backfill",
    "run_once",
]
