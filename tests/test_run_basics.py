"""A run's life in one process: acquire, execute, record, release."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from django_fencedjobs import FenceLost, JobTimeout, NotInRun, declared, fenced_atomic, job
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.lease import FENCE_EPOCH
from django_fencedjobs.loop import tick
from django_fencedjobs.models import JobLease, JobRun, Outcome, Watermark
from tests.conftest import JOBS_T0 as T0
from tests.testapp.models import Item, Write

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_job_is_not_run_before_its_first_slot(jobs):
    calls = []

    @job("*/15 * * * *", name="t.quarterly")
    def quarterly(run):
        calls.append(run.scheduled_for)

    tick()
    assert calls == []
    lease = JobLease.objects.get(name="t.quarterly")
    assert lease.next_run_at == T0 + timedelta(minutes=15)


def test_a_due_job_runs_once_and_is_recorded(jobs):
    @job("*/15 * * * *", name="t.quarterly")
    def quarterly(run):
        with fenced_atomic():
            Write.objects.create(job="t.quarterly", fence=run.fence, seq=1)
            run.add_items(1)

    tick()
    fake_clock.set(T0 + timedelta(minutes=15, seconds=2))
    result = tick()
    again = tick()
    assert [r.outcome for r in result.runs] == [Outcome.SUCCEEDED]
    assert again.runs == []
    run = JobRun.objects.get()
    assert run.scheduled_for == T0 + timedelta(minutes=15)
    lease = JobLease.objects.get()
    assert run.items == 1 and run.fence == lease.id * FENCE_EPOCH + 1
    assert lease.last_success_at == T0 + timedelta(minutes=15, seconds=2)
    assert lease.next_run_at == T0 + timedelta(minutes=30)
    assert Write.objects.filter(fence=run.fence).count() == 1


def test_a_lease_row_deleted_and_created_again_never_repeats_a_fence(jobs):
    # Deleted in the admin, by the ORM or by hand: the row created again for the same job
    # starts above every fence the old one reached, so a run still holding one of them can
    # never pass the new row's fence check.
    @job("*/15 * * * *", name="t.recreated")
    def recreated(run):
        pass

    tick()
    fake_clock.set(T0 + timedelta(minutes=15, seconds=2))
    tick()
    old = JobLease.objects.get()
    old_run = JobRun.objects.get()
    assert old.fence > old_run.fence > 0

    JobLease.objects.all().delete()
    tick()
    new = JobLease.objects.get()
    assert new.id > old.id
    assert new.fence > old.fence
    fake_clock.set(T0 + timedelta(minutes=30, seconds=2))
    assert [r.outcome for r in tick().runs] == [Outcome.SUCCEEDED]
    assert JobRun.objects.get(scheduled_for=T0 + timedelta(minutes=30)).fence > old.fence


def test_a_schedule_changed_in_code_moves_the_next_slot_once(jobs):

    @job("0 * * * *", name="t.rescheduled")
    def rescheduled(run):
        pass

    tick()
    assert JobLease.objects.get().next_run_at == T0 + timedelta(hours=1)

    @job("*/5 * * * *", name="t.rescheduled")  # the same function, deployed again
    def rescheduled(run):  # noqa: F811
        pass

    fake_clock.advance(timedelta(minutes=1))
    assert declared.sync([rescheduled.job], fake_clock()) is True
    lease = JobLease.objects.get()
    assert lease.next_run_at == T0 + timedelta(minutes=5)
    assert lease.schedule_fingerprint == rescheduled.job.valid_schedule.fingerprint()
    assert declared.sync([rescheduled.job], fake_clock()) is False


def test_missed_slots_coalesce_into_one_run(jobs):
    @job("0 * * * *", name="t.hourly", jitter=timedelta(0))
    def hourly(run):
        pass

    tick()
    fake_clock.set(T0 + timedelta(hours=5, minutes=1))
    (run,) = tick().runs
    assert run.scheduled_for == T0 + timedelta(hours=5)
    assert run.missed_slots == 4


def test_a_failing_handler_is_recorded_with_its_traceback(jobs):
    @job("*/15 * * * *", name="t.broken")
    def broken(run):
        with fenced_atomic():
            Write.objects.create(job="t.broken", fence=run.fence, seq=1)
            raise RuntimeError("boom")

    tick()
    fake_clock.advance(timedelta(minutes=15))
    (run,) = tick().runs
    assert run.outcome == Outcome.FAILED
    assert "RuntimeError: boom" in run.error
    assert Write.objects.count() == 0
    assert JobLease.objects.get().consecutive_failures == 1


def test_fenced_atomic_outside_a_run_raises_not_in_run(jobs):
    with pytest.raises(NotInRun):
        with fenced_atomic():
            pass


def test_a_stale_fence_rolls_back_the_block(jobs):
    @job("*/15 * * * *", name="t.stale")
    def stale(run):
        JobLease.objects.filter(name="t.stale").update(fence=run.fence + 1)
        with fenced_atomic():
            Write.objects.create(job="t.stale", fence=run.fence, seq=1)

    tick()
    fake_clock.advance(timedelta(minutes=15))
    (run,) = tick().runs
    assert run.outcome == Outcome.FENCE_LOST
    assert Write.objects.count() == 0


def test_windows_advance_the_watermark_with_the_work(jobs):
    @job("5 * * * *", name="t.rollup")
    def rollup(run):
        for window in run.windows(timedelta(hours=1), start=T0 - timedelta(hours=3)):
            with fenced_atomic():
                Write.objects.create(job="t.rollup", fence=run.fence, seq=window.start.hour)
                run.advance_watermark(window.end)

    tick()
    fake_clock.set(T0 + timedelta(minutes=6))
    (run,) = tick().runs
    assert run.outcome == Outcome.SUCCEEDED, run.error
    assert sorted(Write.objects.values_list("seq", flat=True)) == [6, 7, 8]
    assert Watermark.objects.get(job="t.rollup").position == T0
    fake_clock.set(T0 + timedelta(hours=1, minutes=6))
    (run,) = tick().runs
    assert sorted(Write.objects.values_list("seq", flat=True)) == [6, 7, 8, 9]


def test_batches_claim_each_item_once(jobs):
    Item.objects.bulk_create([Item(name=f"i{n}") for n in range(25)])

    @job("*/5 * * * *", name="t.items", max_batches=2)
    def items(run):
        for batch in run.batches(Item.objects.filter(processed_at=None).order_by("id"), size=10):
            for item in batch:
                item.processed_at = run.now
                item.processed_by_fence = run.fence
            Item.objects.bulk_update(batch, ["processed_at", "processed_by_fence"])
            run.add_items(len(batch))

    tick()
    fake_clock.advance(timedelta(minutes=5))
    (first,) = tick().runs
    assert (first.outcome, first.items, first.batches, first.capped) == (
        Outcome.SUCCEEDED,
        20,
        2,
        True,
    )
    fake_clock.advance(timedelta(minutes=5))
    (second,) = tick().runs
    assert (second.items, second.capped) == (5, False)
    assert Item.objects.filter(processed_at=None).count() == 0


def test_the_end_of_a_run_is_not_an_exception_a_handler_swallows():
    for ended in (FenceLost, JobTimeout):
        with pytest.raises(ended):
            try:
                raise ended()
            except Exception:  # the common "log the item, go on" shape
                pass


def test_run_job_now_runs_through_the_lease_and_records_the_run(jobs):
    from django_fencedjobs.testing import run_job_now

    @job("0 3 * * *", name="t.nightly", jitter=timedelta(minutes=1))
    def nightly(run):
        with fenced_atomic():
            Write.objects.create(job="t.nightly", fence=run.fence, seq=1)

    first = run_job_now(nightly)
    fake_clock.advance(timedelta(seconds=1))
    second = run_job_now("t.nightly")
    assert (first.outcome, second.outcome) == (Outcome.SUCCEEDED, Outcome.SUCCEEDED)
    # Each run's end moves the fence on too, so the second run's fence is past both.
    assert first.fence < second.fence
    assert JobLease.objects.get().next_run_at > fake_clock()


def test_a_run_object_kept_past_its_end_writes_nothing(jobs):
    """A thread that kept the run's context (here: a copy of it) after the run was recorded
    finds every fenced block of that run refused, even though no other run has started."""
    import contextvars

    kept: list[contextvars.Context] = []

    @job("*/5 * * * *", name="t.kept")
    def kept_run(run):
        kept.append(contextvars.copy_context())

    tick()  # the first tick creates the lease row
    fake_clock.advance(timedelta(minutes=5))
    (record,) = tick().runs
    assert record.outcome == Outcome.SUCCEEDED

    def write() -> None:
        with fenced_atomic():
            Write.objects.create(job="t.kept", fence=record.fence, seq=1)

    with pytest.raises(FenceLost):
        kept[0].run(write)
    assert not Write.objects.filter(job="t.kept").exists()


def test_a_handler_that_exits_the_process_is_a_failure_not_an_interruption(jobs):
    import sys

    @job("*/5 * * * *", name="t.exits")
    def exits(run):
        sys.exit(1)

    tick()  # the first tick creates the lease row
    fake_clock.advance(timedelta(minutes=5))
    (record,) = tick().runs
    assert record.outcome == Outcome.FAILED
    assert "SystemExit" in record.error
    assert JobLease.objects.get(name="t.exits").consecutive_failures == 1


def test_a_window_whose_transaction_rolled_back_is_never_skipped(jobs):
    """The handler catches the first window's error and asks for the next one. The
    watermark the run sees follows what committed, so the run stops there (failed) instead
    of succeeding past an hour it never processed."""
    start = datetime(2026, 11, 29, 5, 0, tzinfo=UTC)

    @job("0 * * * *", name="t.hole", jitter=timedelta(minutes=1))
    def hole(run):
        for window in run.windows(timedelta(hours=1), start=start):
            try:
                with fenced_atomic():
                    Write.objects.create(job="t.hole", fence=run.fence, seq=window.start.hour)
                    run.advance_watermark(window.end)
                    if window.start == start:
                        raise ValueError("upstream said no")
            except ValueError:
                pass

    tick()  # the first tick creates the lease row
    fake_clock.advance(timedelta(hours=1))
    (record,) = tick().runs
    assert record.outcome == Outcome.FAILED
    assert "was not committed" in record.error
    assert not Write.objects.filter(job="t.hole").exists()
    assert not Watermark.objects.filter(job="t.hole").exists()
