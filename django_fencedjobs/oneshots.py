"""Runs of one slot outside the schedule: one-offs at an instant, and a backfill's slots.

Each is a lease row of its own, named ``target@once:<instant>`` or ``target@backfill:<slot>``
(``target`` a job, or an instance ``job[key]``), with the slot in ``run_slot`` and the
declared job in ``parent``: its own lease, fence and watermarks (a backfill never moves the
target's), claimed by :func:`django_fencedjobs.lease.claim_oneshots`. Its runs are the
target's: the handler's ``run.job`` is the target (:func:`job_for`) and they are recorded
as the target's, so a slot is judged by its last attempt whatever its kind; only the lease
is the row's (``RunState.lease_name``). The row stays due while a run holds it, so a run
whose runner died is taken again; its end marks the row done (``paused``), or retries it.
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
    """The job the one-shot row ``name`` runs as, as the handler sees it: its target (a
    declared job, or an instance with its ``parent`` and ``key``), with the one-off's
    arguments over the target's. :class:`~django_fencedjobs.exceptions.UnknownJob` when
    the target is gone (an instance deleted)."""
    target = instances.get_job(target_of(name))
    return dataclasses.replace(target, kwargs={**target.kwargs, **kwargs}) if kwargs else target


__all__ = ["job_for", "row_name", "target_of"]
