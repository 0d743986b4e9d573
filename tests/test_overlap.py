"""Overlap: what a slot does to a run of its job still going. ``buffer_one`` (the default)
runs it as soon as that run ends; ``replace`` runs it at once: the new slot's run takes the
lease over with a higher fence, so the old run's writes are fenced off wherever it is, and
the old run is stopped and recorded ``replaced``. At most one run writes at a time."""

from __future__ import annotations

import signal
import time
from datetime import UTC, datetime, timedelta

import pytest

from django_fencedjobs import fenced_atomic, job, loop
from django_fencedjobs.checkids import CheckId
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.models import JobLease, JobRun, Outcome
from django_fencedjobs.registry import registry
from tests.faults.harness import lease_row, prepare
from tests.faults.jobs import REPLACE
from tests.testapp.models import Write

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_run_still_going_at_the_next_slot_is_replaced_and_writes_nothing_more():
    """In one process, on the real clock: the run of a job every 2 s writes in a loop past
    its next slot; there its supervisor fences it off and stops it, recorded replaced, and
    the next tick runs the new slot under a higher fence."""
    with registry.isolated():
        options = {"timeout": timedelta(seconds=30), "lease_ttl": timedelta(seconds=5)}

        @job(every=timedelta(seconds=2), name="t.replaced", overlap="replace", **options)
        def long_one(run):
            for seq in range(400):
                with fenced_atomic():
                    Write.objects.create(job="t.replaced", fence=run.fence, seq=seq)
                time.sleep(0.02)

        loop.tick(["t.replaced"])  # its row
        row = JobLease.objects.get(name="t.replaced")
        time.sleep(max((row.next_run_at - datetime.now(UTC)).total_seconds(), 0) + 0.05)
        (first,) = loop.tick(["t.replaced"]).runs  # ends at the slot after its own
        first.refresh_from_db()
        assert first.outcome == Outcome.REPLACED, first.error
        assert "next slot came while this run was still going" in first.error
        # Its lease was revoked at the slot: nothing of its fence can commit any more.
        row = JobLease.objects.get(name="t.replaced")
        assert row.fence > first.fence and row.next_run_at <= datetime.now(UTC)
        writes = Write.objects.filter(job="t.replaced", fence=first.fence).count()
        assert 0 < writes < 400
        (second,) = loop.tick(["t.replaced"]).runs
        assert second.fence > row.fence - 1 and second.scheduled_for > first.scheduled_for
        assert JobRun.objects.get(pk=first.pk).outcome == Outcome.REPLACED
        assert Write.objects.filter(job="t.replaced", fence=first.fence).count() == writes


def test_replace_allows_a_timeout_past_the_interval_and_refuses_an_advisory_lock(jobs):
    @job(every=timedelta(minutes=1), name="t.long", timeout=timedelta(minutes=5), overlap="replace")
    def long_one(run):
        pass

    @job(every=timedelta(minutes=1), name="t.buffered", timeout=timedelta(minutes=5))
    def buffered(run):
        pass

    @job(every=timedelta(minutes=1), name="t.advisory", exclusion="advisory", overlap="replace")
    def advisory(run):
        pass

    @job(every=timedelta(minutes=1), name="t.unknown", overlap="forbid")
    def unknown(run):
        pass

    assert registry.get("t.long").valid
    assert registry.get("t.buffered").check_id == CheckId.TIMEOUT
    assert registry.get("t.advisory").check_id == CheckId.ARGUMENT
    assert "overlap='replace' needs exclusion='lease'" in str(
        registry.get("t.advisory").schedule_error
    )
    assert registry.get("t.unknown").check_id == CheckId.ARGUMENT
    assert "overlap must be 'buffer_one', 'skip' or 'replace', got 'forbid'" in str(
        registry.get("t.unknown").schedule_error
    )


def _run_past_the_next_slot() -> None:
    """The job's row at 09:00, its 09:10 run lasting to 09:22:05 (its handler moves the
    fake clock on), so that the 09:20 slot comes meanwhile; then the next look."""
    fake_clock.set(datetime(2026, 11, 29, 9, 0, 1, tzinfo=UTC))
    loop.tick()
    fake_clock.set(datetime(2026, 11, 29, 9, 10, 5, tzinfo=UTC))
    loop.tick()
    loop.tick()


def test_by_default_a_slot_that_came_during_a_run_runs_as_soon_as_it_ends(jobs):
    @job("*/10 * * * *", name="t.slow", timeout=timedelta(minutes=9))
    def slow(run):
        fake_clock.advance(timedelta(minutes=12))  # still going at the next slot

    _run_past_the_next_slot()
    runs = JobRun.objects.filter(job="t.slow").order_by("scheduled_for")
    assert [(r.scheduled_for.minute, r.started_at.minute, r.outcome) for r in runs] == [
        (10, 10, Outcome.SUCCEEDED),
        (20, 22, Outcome.SUCCEEDED),  # buffered: run at the first look after the run's end
    ]


def test_skip_records_a_slot_that_came_during_a_run_and_runs_the_one_after(jobs):
    @job("*/10 * * * *", name="t.slow", timeout=timedelta(minutes=15), overlap="skip")
    def slow(run):
        if run.scheduled_for.minute == 10:
            fake_clock.advance(timedelta(minutes=12))  # still going at the next slot

    _run_past_the_next_slot()
    fake_clock.set(datetime(2026, 11, 29, 9, 30, 5, tzinfo=UTC))
    loop.tick()
    runs = JobRun.objects.filter(job="t.slow").order_by("scheduled_for")
    assert [(r.scheduled_for.minute, r.outcome) for r in runs] == [
        (10, Outcome.SUCCEEDED),
        (20, Outcome.SKIPPED),
        (30, Outcome.SUCCEEDED),
    ]
    assert runs[1].error == (
        "Not run: the run of 2026-11-29T09:10:00+00:00 was still going (overlap='skip')."
    )
    assert runs[1].started_at is None
    assert JobLease.objects.get(name="t.slow").consecutive_failures == 0


@pytest.mark.postgres_only
def test_the_new_slots_run_takes_over_from_a_run_stopped_inside_its_fenced_block(spawn):
    """Runner A's run is SIGSTOPped inside its fenced block, the lease row locked, its
    insert not committed; its lease reaches no further than the next slot, though its
    lease_ttl is longer than the interval. At the next slot runner B's run cannot take the
    row while A's transaction holds it; the server ends that transaction once it has been
    idle for lease_ttl, and B takes over. A's write never commits, B's does, A's run reads
    replaced; resumed, A's block fails."""
    prepare(REPLACE)
    a = spawn("loop", REPLACE, "A", workers=1, role="A")
    (inside,) = a.wait_for("inside")
    a.signal(signal.SIGSTOP)
    # Its lease (6 s) reaches no further than the next slot (3 s at most away).
    row = lease_row(REPLACE)
    assert row.fence == inside["fence"] and row.lease_until <= row.next_run_at
    b = spawn("loop", REPLACE, "B", workers=1, role="B")
    (taken,) = b.wait_for("ack")
    assert taken["fence"] > inside["fence"]
    run_a = JobRun.objects.get(job=REPLACE, fence=inside["fence"])
    assert run_a.outcome == Outcome.REPLACED, run_a.error
    a.touch("released")
    a.signal(signal.SIGCONT)
    (refused,) = a.wait_for("refused")
    assert refused["fence"] == inside["fence"]
    b.signal(signal.SIGTERM)
    a.signal(signal.SIGTERM)
    assert b.wait_exit() == 0 and a.wait_exit() == 0, spawn.logs()
    assert not Write.objects.filter(job=REPLACE, fence=inside["fence"], seq=2).exists()
    assert Write.objects.filter(job=REPLACE, fence=inside["fence"], seq=1).exists()
    assert Write.objects.filter(job=REPLACE, fence=taken["fence"], seq=1).exists()
    assert JobRun.objects.get(pk=run_a.pk).outcome == Outcome.REPLACED
