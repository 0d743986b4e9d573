"""Runs of one slot outside the schedule: one-offs at an instant, and a backfill's slots.

Each is a lease row of its own, named ``target@once:<instant>`` or
``target@backfill:<slot>`` (``target`` a job, or an instance ``job[key]``), of kind
``once`` or ``backfill``, with the slot in ``run_slot`` and the declared job in ``parent``.
So each has what any run has: its own lease and fence, and a record; the runners claim due
rows by the index on ``(parent, next_run_at)`` (:func:`django_fencedjobs.lease.claim_oneshots`)
as they claim instances.

* Its runs are the target's: the handler's ``run.job`` is the target (its name, an
  instance's ``key`` and ``parent``, :func:`job_for`), and they are recorded as the
  target's (``JobRun.job`` is the target, ``kind`` says which), so they are in the
  target's history and timeline, and a slot is judged by its last attempt whichever kind
  it was. Only the lease the run holds is the row's: its fence checks, renewals and end
  address the row by its name (``RunState.lease_name``).
* Its watermarks are the row's own (``Watermark.job`` is the row's name): a backfill run's
  windows tile its own interval from its own progress, and the target's live watermark
  is neither read nor moved.
* The row stays due while a run holds it: if the runner dies, the run is taken again (the
  next attempt) once its lease expires. Its end marks the row done (``paused``), or
  schedules its retry.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from django_fencedjobs import instances
from django_fencedjobs.instants import iso_utc
from django_fencedjobs.registry import Job

#: How a one-shot row's name marks its kind: ``target@once:...``, ``target@backfill:...``.
SEPARATOR = "@"


def row_name(target: str, kind: str, slot: datetime) -> str:
    """The lease row of ``target``'s one-off or backfill run of ``slot``."""
    return f"{target}{SEPARATOR}{kind}:{iso_utc(slot)}"


def target_of(name: str) -> str:
    """The job or instance a one-shot row's runs are recorded as."""
    return name.rpartition(SEPARATOR)[0]


def job_for(name: str, kwargs: dict[str, Any] | None) -> Job:
    """The job the one-shot row ``name`` runs as: its target (a declared job, or an
    instance with its ``parent`` and ``key``), with the one-off's arguments over the
    target's. The handler sees this job, as a scheduled run of the target does; the lease
    the run holds is the row's (``RunState.lease_name``).
    :class:`~django_fencedjobs.exceptions.UnknownJob` when the target is gone (an instance
    deleted)."""
    target = instances.get_job(target_of(name))
    if not kwargs:
        return target
    return dataclasses.replace(target, kwargs={**target.kwargs, **kwargs})


__all__ = ["job_for", "row_name", "target_of"]
