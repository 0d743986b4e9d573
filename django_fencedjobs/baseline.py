"""The absence baseline: from when a job that never ran is expected to run.

A job that never succeeded is late once the first slot after its lease row's
``created_at``, plus ``run_timeout`` and ``grace``, has passed (:mod:`django_fencedjobs.health`).
So the row must exist as soon as the job's code is live, whether or not a runner runs that
code (the failure to catch). The first to see the job creates it: ``migrate``
(:func:`record_on_migrate`), an observer before it reports (``checkjobs``, the admin:
:func:`record_first_sightings`), or a runner. Observers only create missing rows, through
the runner's own :func:`~django_fencedjobs.declared.sync`: they may run other code than the
runner does. Racing creators are harmless: the unique job name wins once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.apps import AppConfig
from django.core import mail
from django.db import DatabaseError, connections, router, transaction
from django.db.migrations.loader import MigrationLoader

from django_fencedjobs import clock, db, declared, lease
from django_fencedjobs.models import JobLease

logger = logging.getLogger("django_fencedjobs")

__all__ = ["Sightings", "record_first_sightings", "record_on_migrate"]


@dataclass(frozen=True)
class Sightings:
    """What :func:`record_first_sightings` did."""

    #: Jobs whose lease row was created now: their baseline.
    recorded: list[str] = field(default_factory=list)
    #: Jobs with no lease row whose row the database refused to create (e.g. a database
    #: user that may only read): they stay ``never_run`` (warning) and cannot be late.
    refused: list[str] = field(default_factory=list)
    #: Why it was refused, on one line.
    error: str = ""


def record_first_sightings(now: datetime) -> Sightings:
    """Create the lease row, with ``created_at=now``, of every declared job with a valid
    schedule that has none yet. A read error (unreachable, not migrated) is raised; a refused
    write is logged and returned in :attr:`Sightings.refused`, and leaves the caller's
    transaction usable (it runs in its own transaction, or a savepoint inside the caller's)."""
    # A job with instances has no row of its own: its instances' rows are written when
    # they are saved, each its own first sighting.
    jobs = [job for job in declared.runnable_jobs() if not job.instances]
    if not jobs:
        return Sightings()
    existing = lease.read([job.name for job in jobs])
    new = [job for job in jobs if job.name not in existing]
    if not new:
        return Sightings()
    names = [job.name for job in new]
    try:
        with transaction.atomic(using=db.lease_db()):
            declared.sync(new, now, fingerprints={})  # no stored fingerprint: create only
    except DatabaseError as exc:
        error = " ".join(str(exc).split()) or type(exc).__name__
        logger.warning(
            "could not record the first sighting of %s (no lease row, so no late alert "
            "until one is created): %s",
            ", ".join(names),
            error,
            extra={"event": "first_sighting_refused", "jobs": names},
        )
        return Sightings(refused=names, error=error)
    logger.info(
        "first sighting of %s recorded",
        ", ".join(names),
        extra={"event": "first_sighting", "jobs": names},
    )
    return Sightings(recorded=names)


def record_on_migrate(
    sender: AppConfig,
    *,
    using: str,
    plan: list[Any] | None = None,
    verbosity: int = 1,
    **kwargs: Any,
) -> None:
    """``post_migrate``, connected for this app only: ``migrate`` with a job's code is its
    first sighting.

    Nothing from ``flush`` (it passes no plan), for a database other than the lease rows',
    before this app's migrations are all applied there (no current table to write to), or
    in Django's test environment (rows created then would carry the real clock into every
    test, where a test's first tick should create them). A database error is logged, never
    raised: the migrations are applied, and the next observer or runner records the jobs.
    """
    if plan is None or using != db.lease_db() or not router.allow_migrate_model(using, JobLease):
        return
    if hasattr(mail, "outbox"):  # set by django.test.utils.setup_test_environment()
        return
    try:
        loader = MigrationLoader(connections[using], ignore_no_migrations=True)
        leaves = loader.graph.leaf_nodes(sender.label)
        if not leaves or any(leaf not in loader.applied_migrations for leaf in leaves):
            return
        sightings = record_first_sightings(clock.now())
    except DatabaseError as exc:
        logger.warning(
            "migrate: could not record the declared jobs' first sighting: %s",
            exc,
            extra={"event": "first_sighting_refused"},
        )
        return
    if sightings.recorded and verbosity >= 2:
        stdout = kwargs.get("stdout")
        if stdout is not None:
            stdout.write(f"Recorded the first sighting of {', '.join(sightings.recorded)}")
