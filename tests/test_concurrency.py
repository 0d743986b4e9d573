"""Many jobs at once: a slow job never delays another, a fleet of runners shares the due
jobs without waiting on each other, and a stop with every worker busy records every run.

Real runner processes (``runjobs`` loops), real signals; the fleet test on PostgreSQL.
"""

from __future__ import annotations

import itertools
import signal
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections

from django_fencedjobs import clock, declared
from django_fencedjobs.models import LEASE_FREE, JobLease, JobRun, Outcome
from django_fencedjobs.registry import registry
from tests.faults import jobs as faults
from tests.faults.harness import prepare, runs, wait_until
from tests.faults.jobs import FAST, FLEET_PREFIX, ITEMS, SLOW, WINDOWS
from tests.testapp.models import Item, Write

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_slow_job_never_delays_another_in_one_loop(spawn):
    """One ``runjobs`` loop with default options; a job that sleeps for four of the other
    job's intervals. Every slot of the fast job during the slow run has a run of its own
    (nothing coalesced), started within a second of its slot."""
    prepare(FAST, due=False)
    prepare(SLOW)
    loop = spawn("loop", f"{FAST},{SLOW}", "L", slow_seconds=8)
    loop.wait_for("slow_finished", timeout=60)
    slow_run = wait_until(
        lambda: JobRun.objects.filter(job=SLOW, outcome=Outcome.SUCCEEDED).first(),
        what="the slow run to be recorded",
        diagnostics=loop.log,
    )
    end = slow_run.finished_at - timedelta(seconds=2)
    wait_until(
        lambda: JobRun.objects.filter(job=FAST, scheduled_for__gte=end).exclude(
            outcome=Outcome.RUNNING
        ),
        what="the fast job to run past the slow run",
        diagnostics=loop.log,
    )
    loop.signal(signal.SIGTERM)
    assert loop.wait_exit() == 0, loop.log()
    during = list(
        JobRun.objects.filter(
            job=FAST, scheduled_for__gt=slow_run.started_at, scheduled_for__lte=end
        ).order_by("scheduled_for")
    )
    slots = [run.scheduled_for for run in during]
    assert len(during) >= 3, loop.log()
    # Every 2-s slot in that span, each with its own run.
    assert all(b - a == timedelta(seconds=2) for a, b in itertools.pairwise(slots))
    assert [run.missed_slots for run in during] == [0] * len(during)
    assert [run.outcome for run in during] == [Outcome.SUCCEEDED] * len(during)
    late = [run.started_at - run.scheduled_for for run in during]
    assert max(late) <= timedelta(seconds=1), late


@pytest.mark.postgres_only
def test_sigterm_with_every_worker_busy_records_every_run_and_exits_0(spawn):
    """Two workers, both stalled inside a batch or window: SIGTERM lets each finish what it
    is in, records both runs interrupted, releases both leases, and the loop exits 0.
    (PostgreSQL: on SQLite two write transactions cannot be open at once.)"""
    Item.objects.bulk_create([Item(name=f"i{n}") for n in range(30)])
    prepare(ITEMS)
    prepare(WINDOWS)
    loop = spawn(
        "loop",
        f"{ITEMS},{WINDOWS}",
        "L",
        workers=2,
        size=5,
        stall_batch=1,
        stall_window=1,
        start="2026-01-01T00:00:00+00:00",
        step=3600,
    )
    stalled = loop.wait_for("stalled", count=2)
    loop.signal(signal.SIGTERM)
    assert loop.wait_exit() == 0, loop.log()
    assert {e["fence"] for e in stalled} == {r.fence for r in runs(ITEMS) + runs(WINDOWS)}
    for name in (ITEMS, WINDOWS):
        (run,) = runs(name)
        assert run.outcome == Outcome.INTERRUPTED, run.error
        assert run.batches == 2  # the stalled one finished and committed, no third began
        row = JobLease.objects.get(name=name)
        assert (row.owner, row.lease_until, row.fence) == ("", LEASE_FREE, run.fence + 1)
    assert Item.objects.exclude(processed_at=None).count() == 10
    assert Write.objects.filter(job=WINDOWS).count() == 2


class LockWaits:
    """Samples, from a connection of its own, the sessions of this database that wait for a
    lock, every 20 ms, until stopped.

    A session *blocked* on another is one seen waiting, in the same statement, in three
    samples running (40 ms or more): a holder keeps its lock as long as it holds the lease,
    so a blocked acquirer would show in every sample for that long. What it leaves out is
    the one wait the server cannot avoid, a few microseconds long: a runner whose
    compare-and-set lost the race (its read was stale) locks the row for the instant of its
    failing statement, and the winner's first fenced statement may queue behind that
    instant. Those are counted apart (``momentary``).
    """

    BLOCKED_AFTER = 3

    def __init__(self) -> None:
        self.samples = 0
        self.blocked: list[str] = []
        self.momentary = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        seen: dict[tuple[int, object], int] = {}
        try:
            with connection.cursor() as cursor:
                while not self._stop.wait(0.02):
                    cursor.execute(
                        "SELECT pid, query_start, query FROM pg_stat_activity"
                        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                    )
                    now = {(pid, start): query for pid, start, query in cursor.fetchall()}
                    seen = {key: seen.get(key, 0) + 1 for key in now}
                    self.momentary += sum(1 for n in seen.values() if n == 1)
                    self.blocked += [now[key] for key, n in seen.items() if n == self.BLOCKED_AFTER]
                    self.samples += 1
        finally:
            connections.close_all()

    def __enter__(self) -> LockWaits:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.postgres_only
def test_a_fleet_of_runners_shares_the_due_jobs_without_waiting_on_each_other(spawn):
    """Four runner processes over 200 jobs due every 3 s, for a minute: every slot runs
    exactly once, no session is ever blocked on a lock (sampled from the server every 20 ms),
    and no run is left running."""
    count, every = 200, 3
    names = [f"{FLEET_PREFIX}{n:03d}" for n in range(count)]
    # Each run holds its lease row locked for 0.1 s: a runner that waited on another's row
    # would be seen blocked.
    config = {"fleet": count, "fleet_every": every, "hold": 0.1}
    # The lease rows exist, as after a deploy: four processes creating the same rows at
    # once would wait on each other's inserts, once, which is not what is measured here.
    faults.CONFIG.update(config)
    try:
        with registry.isolated():
            faults.register()
            declared.sync(declared.runnable_jobs(names), clock.now())
    finally:
        faults.CONFIG.clear()
    loops = [spawn("loop", ",".join(names), f"R{n}", **config) for n in range(4)]
    for runner_ in loops:
        runner_.wait_for("ready", timeout=60)
    with LockWaits() as waits:
        time.sleep(60)
    for runner_ in loops:
        runner_.signal(signal.SIGTERM)
    for runner_ in loops:
        assert runner_.wait_exit() == 0, runner_.log()
    assert waits.samples > 100
    assert waits.blocked == [], f"{waits.momentary} momentary waits besides"
    fleet = JobRun.objects.filter(job__startswith=FLEET_PREFIX)
    assert not fleet.filter(outcome=Outcome.RUNNING).exists()
    assert set(fleet.values_list("outcome", flat=True)) <= {Outcome.SUCCEEDED, Outcome.INTERRUPTED}
    # Each handler ran once per run (one write per run, never two for a slot) ...
    assert Write.objects.filter(job__startswith=FLEET_PREFIX).count() == fleet.count()
    # ... and every slot of each job from its first run to its last has a run (or was
    # counted as coalesced into one).
    by_job: dict[str, list[JobRun]] = {}
    for run in fleet.order_by("scheduled_for"):
        by_job.setdefault(run.job, []).append(run)
    assert len(by_job) == count
    for job_runs in by_job.values():
        span = (job_runs[-1].scheduled_for - job_runs[0].scheduled_for) // timedelta(seconds=every)
        assert sum(1 + run.missed_slots for run in job_runs[1:]) == span
    hosts = {run.owner for run in fleet}
    assert len(hosts) == 4  # every runner took part
