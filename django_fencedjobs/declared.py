"""The declared jobs and their lease rows: which jobs a runner considers
(:func:`runnable_jobs`), and the rows that follow the code (:func:`sync`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django_fencedjobs import lease
from django_fencedjobs.models import JobLease
from django_fencedjobs.registry import Job, registry

__all__ = ["runnable_jobs", "sync"]


def sync(jobs: Sequence[Job], now: datetime, fingerprints: dict[str, str] | None = None) -> bool:
    """Create lease rows for new jobs and recompute ``next_run_at`` for changed schedules;
    True when anything changed (the caller re-reads). ``fingerprints``: the stored schedule
    fingerprints by job name, when the caller read them already (a tick has)."""
    if fingerprints is None:
        rows = lease.read([job.name for job in jobs])
        fingerprints = {name: row.schedule_fingerprint for name, row in rows.items()}
    missing: list[JobLease] = []
    changed = False
    for job in jobs:
        if job.instances or job.parent is not None:
            continue  # instances' rows are written when the instances are saved
        schedule = job.valid_schedule
        stored = fingerprints.get(job.name)
        if stored is None:
            missing.append(
                JobLease(
                    name=job.name,
                    next_run_at=schedule.next_after(now),
                    schedule_fingerprint=schedule.fingerprint(),
                    created_at=now,
                )
            )
        elif stored != schedule.fingerprint():
            fingerprint, next_run_at = schedule.fingerprint(), schedule.next_after(now)
            changed = lease.reschedule(job.name, stored, fingerprint, next_run_at) or changed
    if missing:
        lease.create(missing)
    return changed or bool(missing)


def runnable_jobs(names: Sequence[str] | None = None) -> list[Job]:
    """The jobs to consider: the named ones (unknown names raise), or every job with a valid
    schedule."""
    if names:
        return [registry.get(name) for name in names]
    return [job for job in registry.all() if job.valid]
