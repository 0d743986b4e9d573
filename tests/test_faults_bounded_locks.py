"""Fault: a row the dispatcher locks is held by another session (a peer paused inside its
claim, an operator's open transaction), and the runner must go on.

Why it matters: the dispatcher is one thread. A lock it waits for without a bound stops
every job of the runner, and SIGTERM with it. The backfill's concurrency is decided under a
lock on its ``Backfill`` row: a backfill whose row is held is not claimed at that pass, and
everything else keeps its schedule.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connections

from django_fencedjobs import backfills
from django_fencedjobs.models import JobLease, JobRun, Outcome, RunKind
from django_fencedjobs.registry import registry
from tests.faults import jobs
from tests.faults.harness import now, prepare, wait_until
from tests.faults.jobs import FAST
from tests.faults.time_jobs import BACKFILLED

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

HOUR = timedelta(hours=1)
#: Runs of the bystander seen while the backfill's row is held.
BYSTANDER_RUNS = 3


@pytest.fixture(autouse=True)
def declared() -> Iterator[None]:
    with registry.isolated():
        jobs.register()
        yield


class BackfillHolder:
    """A second session holding a backfill's row locked, as a peer runner paused inside its
    claim would."""

    def __init__(self, pk: int) -> None:
        self.connection = connections.create_connection("default")
        self.connection.set_autocommit(False)
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM fencedjobs_backfill WHERE id = %s FOR UPDATE", [pk])

    def release(self) -> None:
        self.connection.rollback()
        self.connection.close()


def test_a_held_backfill_row_stops_no_other_job_and_no_sigterm(spawn):
    prepare(BACKFILLED, due=False)
    prepare(FAST, due=False)
    hour = now().replace(minute=0, second=0, microsecond=0)
    JobLease.objects.filter(name=BACKFILLED).update(next_run_at=hour + 2 * HOUR)
    request, plan = backfills.backfill(BACKFILLED, hour - 3 * HOUR, hour, concurrency=2)
    assert len(plan.slots) == 3
    holder = BackfillHolder(request.pk)
    try:
        worker = spawn("loop", f"{BACKFILLED},{FAST}", "A", workers=2)
        worker.wait_for("ready")
        started = now()

        def bystander_runs() -> int:
            return JobRun.objects.filter(
                job=FAST, outcome=Outcome.SUCCEEDED, started_at__gt=started
            ).count()

        # The bystander keeps its schedule while the backfill's row is held...
        wait_until(
            lambda: bystander_runs() >= BYSTANDER_RUNS,
            what=f"{BYSTANDER_RUNS} runs of the bystander",
            diagnostics=worker.log,
        )
        # ... and the backfill's slots wait: its concurrency cannot be decided meanwhile.
        assert not JobRun.objects.filter(job=BACKFILLED, kind=RunKind.BACKFILL).exists()
        # SIGTERM ends the runner while the row is still held (its loop is running: the
        # bystander ran under it).
        worker.signal(signal.SIGTERM)
        assert worker.wait_exit() == 0, worker.log()
    finally:
        holder.release()
    # Once the row is free, the backfill's slots are claimed and run, each once.
    worker = spawn("loop", BACKFILLED, "B", workers=2)
    wait_until(
        lambda: (
            JobRun.objects.filter(
                job=BACKFILLED, kind=RunKind.BACKFILL, outcome=Outcome.SUCCEEDED
            ).count()
            >= len(plan.slots)
        ),
        what="every backfill slot run",
        diagnostics=worker.log,
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait_exit() == 0, worker.log()
    backfilled = JobRun.objects.filter(job=BACKFILLED, kind=RunKind.BACKFILL)
    assert sorted(backfilled.values_list("scheduled_for", flat=True)) == [
        planned.slot for planned in plan.slots
    ]
