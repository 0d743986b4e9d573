"""A run's record says what committed, whoever records its end.

The items, the completed batches and the watermark on a ``JobRun`` row are those of the
run's fenced transactions that committed: a transaction that rolled back counts for
nothing, and a window or batch that committed counts even when the run is ended before
it asks for the next one. Here the supervisor records the end (at the timeout, from its
own thread), in the middle of a window or a batch, or between two windows; and the
handler's own end after a block it caught rolled back.

The processes killed or paused with a real signal are in tests/test_faults_sigkill.py and
tests/test_faults_paused_past_timeout.py.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import transaction

from django_fencedjobs import Run, fenced_atomic, job
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.loop import tick
from django_fencedjobs.models import JobRun, Outcome, Watermark
from django_fencedjobs.run import watermark_text
from tests.conftest import JOBS_T0 as T0
from tests.testapp.models import Item, Write

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT = timedelta(seconds=2)  # room for the committed part on a loaded machine
STEP = timedelta(hours=1)
#: Six whole windows before the run's "now" (T0 + 6 min): more than any run here finishes.
START = T0 - 6 * STEP
#: Upper bound of a handler's wait for the interrupt: a test that went wrong ends.
HANDLER_WAIT = 60.0


def wait_for_the_interrupt() -> None:
    """Sleep in short steps, as a handler waiting on something slow would, until the
    timeout's ``JobTimeout`` is raised in one of them."""
    deadline = time.monotonic() + HANDLER_WAIT
    while time.monotonic() < deadline:
        time.sleep(0.01)
    raise AssertionError("the timeout's interrupt never came")


def run_once(name: str) -> JobRun:
    """Run the job's first slot (the fixture's clock: T0 + 5 min, run at T0 + 6 min); the
    run's record as the runner returned it, checked against the row."""
    tick()  # creates the lease row
    fake_clock.set(T0 + timedelta(minutes=6))
    (returned,) = tick().runs
    stored = JobRun.objects.get(job=name)
    fields = ("outcome", "items", "batches", "watermark_after")
    assert [getattr(returned, f) for f in fields] == [getattr(stored, f) for f in fields]
    return stored


def committed_watermark(name: str) -> str:
    return watermark_text(Watermark.objects.get(job=name).position)


def test_a_run_timed_out_inside_a_window_records_the_windows_that_committed(jobs):
    """The fourth window's transaction counts an item, advances the watermark, and is still
    open at the timeout: it rolls back, and the record says three windows."""

    @job("5 * * * *", name="t.records.in_window", timeout=TIMEOUT)
    def in_window(run: Run) -> None:
        for n, window in enumerate(run.windows(STEP, start=START)):
            with fenced_atomic():
                Write.objects.create(job="t.records.in_window", fence=run.fence, seq=n)
                run.advance_watermark(window.end)
                run.add_items(1)
                if n == 3:
                    wait_for_the_interrupt()

    record = run_once("t.records.in_window")
    assert record.outcome == Outcome.TIMED_OUT, record.error
    assert sorted(Write.objects.values_list("seq", flat=True)) == [0, 1, 2]
    assert committed_watermark("t.records.in_window") == watermark_text(START + 3 * STEP)
    assert (record.items, record.batches) == (3, 3)
    assert record.watermark_before == ""
    assert record.watermark_after == watermark_text(START + 3 * STEP)


def test_a_run_timed_out_between_windows_records_the_last_window_that_committed(jobs):
    """The third window committed and the handler is busy outside any transaction before
    asking for the fourth: that third window is a completed batch."""

    @job("5 * * * *", name="t.records.between", timeout=TIMEOUT)
    def between(run: Run) -> None:
        for n, window in enumerate(run.windows(STEP, start=START)):
            with fenced_atomic():
                Write.objects.create(job="t.records.between", fence=run.fence, seq=n)
                run.advance_watermark(window.end)
                run.add_items(1)
            if n == 2:
                wait_for_the_interrupt()

    record = run_once("t.records.between")
    assert record.outcome == Outcome.TIMED_OUT, record.error
    assert sorted(Write.objects.values_list("seq", flat=True)) == [0, 1, 2]
    assert committed_watermark("t.records.between") == watermark_text(START + 3 * STEP)
    assert (record.items, record.batches) == (3, 3)
    assert record.watermark_after == watermark_text(START + 3 * STEP)


def test_a_run_timed_out_inside_a_batch_records_the_batches_that_committed(jobs):
    """Per-item claims: the fourth batch's transaction (claimed, marked, counted) is open
    at the timeout and rolls back; its items are not counted and stay to do."""
    Item.objects.bulk_create([Item(name=f"item-{n}") for n in range(20)])
    size = 2

    @job("5 * * * *", name="t.records.in_batch", timeout=TIMEOUT)
    def in_batch(run: Run) -> None:
        todo = Item.objects.filter(processed_at=None).order_by("id")
        for n, batch in enumerate(run.batches(todo, size=size)):
            for item in batch:
                item.processed_at = run.now
                item.processed_by_fence = run.fence
            Item.objects.bulk_update(batch, ["processed_at", "processed_by_fence"])
            run.add_items(len(batch))
            if n == 3:
                wait_for_the_interrupt()

    record = run_once("t.records.in_batch")
    assert record.outcome == Outcome.TIMED_OUT, record.error
    assert Item.objects.exclude(processed_at=None).count() == 3 * size
    assert (record.items, record.batches) == (3 * size, 3)


def test_items_counted_in_a_block_that_rolled_back_are_not_recorded(jobs):
    """The handler catches the error of one block and goes on: that block's items are not
    the run's. Items counted outside any fenced block are counted as they are."""

    @job("5 * * * *", name="t.records.caught")
    def caught(run: Run) -> None:
        run.add_items(10)  # outside any transaction
        for n in range(3):
            try:
                with fenced_atomic():
                    Write.objects.create(job="t.records.caught", fence=run.fence, seq=n)
                    run.add_items(1)
                    if n == 1:
                        raise ValueError("upstream said no")
            except ValueError:
                pass

    record = run_once("t.records.caught")
    assert record.outcome == Outcome.SUCCEEDED, record.error
    assert sorted(Write.objects.values_list("seq", flat=True)) == [0, 2]
    assert record.items == 10 + 2


def test_items_counted_in_another_thread_of_the_handler_are_recorded(jobs):
    """A handler that spreads its work over threads of its own counts items from them:
    outside any fenced block, as they are."""
    errors: list[BaseException] = []

    @job("5 * * * *", name="t.records.threads")
    def threads(run: Run) -> None:
        def work() -> None:
            try:
                run.add_items(2)
            except BaseException as exc:
                errors.append(exc)

        helpers = [threading.Thread(target=work) for _ in range(3)]
        for helper in helpers:
            helper.start()
        for helper in helpers:
            helper.join()

    record = run_once("t.records.threads")
    assert errors == []
    assert record.outcome == Outcome.SUCCEEDED, record.error
    assert record.items == 6


def test_a_savepoint_that_rolled_back_inside_a_committed_block_takes_its_progress_along(jobs):
    """Per-item savepoints in one fenced block, and a nested fenced block that advances the
    watermark and then fails: what they counted rolls back with their rows."""

    @job("5 * * * *", name="t.records.savepoints")
    def savepoints(run: Run) -> None:
        windows = run.windows(STEP, start=START)
        window = next(windows)
        with fenced_atomic():
            for n in range(4):
                try:
                    with transaction.atomic():
                        Write.objects.create(job="t.records.savepoints", fence=run.fence, seq=n)
                        run.add_items(1)
                        if n % 2:
                            raise ValueError(n)
                except ValueError:
                    pass
            try:
                with fenced_atomic():
                    run.advance_watermark(window.end)
                    run.add_items(10)
                    raise ValueError("after advancing")
            except ValueError:
                pass

    record = run_once("t.records.savepoints")
    assert record.outcome == Outcome.SUCCEEDED, record.error
    assert Write.objects.filter(job="t.records.savepoints").count() == 2
    assert not Watermark.objects.filter(job="t.records.savepoints").exists()
    assert (record.items, record.batches, record.watermark_after) == (2, 0, "")


def test_a_failure_whose_message_holds_a_nul_or_a_lone_surrogate_is_recorded_and_the_loop_goes_on(
    jobs,
):
    """PostgreSQL refuses a NUL character in text, and no encoding takes a lone surrogate:
    a run's error holding either could not be recorded, and kept the loop that records the
    ends of its runs together failing at every pass, every other run unrecorded too."""
    from django_fencedjobs.loop import Dispatcher

    @job(every=timedelta(minutes=1), name="t.nul")
    def nul(run):
        raise ValueError("a NUL \x00 and a lone surrogate \ud800 in the message")

    @job(every=timedelta(minutes=1), name="t.fine")
    def fine(run):
        with fenced_atomic():
            Write.objects.create(job="t.fine", fence=run.fence, seq=1)

    tick()  # creates the lease rows
    fake_clock.set(T0 + timedelta(minutes=6))
    Dispatcher([nul.job, fine.job], workers=2).loop(max_ticks=2)
    failed = JobRun.objects.get(job="t.nul")
    assert failed.outcome == Outcome.FAILED
    assert "a NUL \\x00 and a lone surrogate ? in the message" in failed.error
    assert JobRun.objects.get(job="t.fine").outcome == Outcome.SUCCEEDED
