"""The absence baseline: from when a job that never ran is expected to run.

A job that never succeeded is late once the first slot after its lease row's
``created_at``, plus its ``run_timeout``, plus its ``grace``, has passed
(:mod:`django_fencedjobs.health`). So the row must exist as soon as the job's code is
live, whether or not a runner with that code exists: that is exactly the failure to
catch (the cron line or the service was never installed, or the runner still runs the
code from before the job was added). The first of these to see the job creates its row,
and so sets the baseline:

* ``manage.py migrate`` (:func:`record_on_migrate`, a ``post_migrate`` receiver);
* an observer before it reports: ``manage.py checkjobs`` and the admin's job pages
  (:func:`record_first_sightings`);
* a runner, at its first tick with the job.

Racing creators are harmless: the unique job name wins once. An observer only creates
missing rows, through the runner's own :func:`~django_fencedjobs.declared.sync`; it never
changes an existing one (it may run other code than the runner does).
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
    schedule that has none yet.

    An error while reading (the database is unreachable, or not migrated) is raised. A
    refused write is logged and returned in :attr:`Sightings.refused`: the caller still
    reports what there is. The write runs in its own transaction, or savepoint inside the
    caller's, so a refusal leaves the caller's transaction usable.
    """
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

    It does nothing when:

    * the signal comes from ``flush``, not ``migrate`` (``flush`` passes no plan);
    * ``using`` is not the database that holds the lease rows;
    * this app's migrations are not all applied on it yet (``migrate otherapp`` on a new
      database): there is no table, or not the current one, to write to;
    * it runs in Django's test environment (the test runner migrating the test
      database): rows created then would carry the real clock into every test, where a
      test's first tick, under the test's clock, is what should create them.

    A database error is logged, never raised: the migrations have been applied, and the
    next observer or runner records the jobs.
    """
    if plan is None:
        return
    if using != db.lease_db() or not router.allow_migrate_model(using, JobLease):
        return
    if hasattr(mail, "outbox"):  # set by django.test.utils.setup_test_environment()
        return
    connection = connections[using]
    try:
        if not _migrated(connection, sender.label):
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


def _migrated(connection: Any, app_label: str) -> bool:
    """Are all of ``app_label``'s migrations applied on ``connection``'s database?"""
    loader = MigrationLoader(connection, ignore_no_migrations=True)
    leaves = loader.graph.leaf_nodes(app_label)
    return bool(leaves) and all(leaf in loader.applied_migrations for leaf in leaves)
