"""Fault: the worker is SIGKILLed in the middle of a batch (OOM killer, a node lost, kill -9),
inside the transaction that claims and processes it.

Why it matters: a job that resumes from "the last interval" or from an in-memory cursor
either loses the batch that was in flight or does it twice. Here the work and its progress
(the per-item claim, or the watermark) commit in one fenced transaction: the killed batch
rolls back whole, the next run starts from the committed state, no item or window is lost
or processed twice, and the dead run is marked abandoned when the next fence is taken. Its
record says what it committed (items, batches, watermark): each of its transactions wrote
that on its row as it committed, since nothing of the dead process records its end.
"""

from __future__ import annotations

import signal
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from django_fencedjobs.models import Outcome, Watermark
from django_fencedjobs.run import watermark_text
from tests.faults.harness import make_due, now, prepare, runs, wait_lease_expired
from tests.faults.jobs import ITEMS, WINDOWS
from tests.testapp.models import Item, Write

pytestmark = pytest.mark.django_db(transaction=True)

ITEM_COUNT = 30
SIZE = 5
STEP = timedelta(minutes=1)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def kill_when_stalled(worker) -> dict:
    """SIGKILL the worker while it waits inside its batch transaction; its stall event."""
    (stalled,) = worker.wait_for("stalled")
    worker.signal(signal.SIGKILL)
    assert worker.wait_exit() == -signal.SIGKILL
    return stalled


def take_over(spawn, worker, job: str) -> None:
    """Once the dead worker's lease has run out, make the job due and let ``worker`` run it."""
    wait_lease_expired(job, diagnostics=spawn.logs)
    make_due(job)
    worker.wait_for("ready")
    worker.send("go")
    assert worker.wait_exit() == 0, worker.log()
    assert worker.events("finished"), worker.log()


@pytest.mark.parametrize("stall_batch", [0, 2, 5])
def test_killed_batch_rolls_back_and_the_next_run_resumes(spawn, stall_batch):
    Item.objects.bulk_create([Item(name=f"item-{n}") for n in range(ITEM_COUNT)])
    prepare(ITEMS)
    a = spawn("once", ITEMS, "A", size=SIZE, stall_batch=stall_batch)
    b = spawn("once", ITEMS, "B", wait_go=True, size=SIZE)
    stalled = kill_when_stalled(a)
    fence_a = stalled["fence"]
    batches = {event["index"]: event["ids"] for event in a.events("batch")}
    committed = {pk for index, ids in batches.items() if index < stall_batch for pk in ids}
    in_flight = set(batches[stall_batch])

    # The batch in flight rolled back whole; the ones before it are committed.
    assert (
        set(Item.objects.filter(processed_by_fence=fence_a).values_list("id", flat=True))
        == committed
    )
    assert not Item.objects.filter(id__in=in_flight).exclude(processed_at=None).exists()
    assert set(Write.objects.filter(fence=fence_a).values_list("seq", flat=True)) == committed
    (dead,) = runs(ITEMS)
    assert dead.outcome == Outcome.RUNNING  # nobody has taken the fence yet

    take_over(spawn, b, ITEMS)
    fence_b = b.events("finished")[0]["fence"]
    items = dict(Item.objects.values_list("id", "processed_by_fence"))
    assert len(items) == ITEM_COUNT
    # Every item processed, by exactly one run, exactly once.
    assert set(items.values()) <= {fence_a, fence_b}
    assert {pk for pk, fence in items.items() if fence == fence_a} == committed
    processing = Counter(Write.objects.filter(job=ITEMS).values_list("seq", "fence"))
    assert processing == Counter({(pk, fence): 1 for pk, fence in items.items()})
    dead, resumed = runs(ITEMS)
    assert (dead.fence, dead.outcome) == (fence_a, Outcome.ABANDONED)
    assert dead.finished_at is not None
    assert (resumed.fence, resumed.outcome) == (fence_b, Outcome.SUCCEEDED), resumed.error
    assert resumed.items == ITEM_COUNT - len(committed)
    # The dead run's record says what it committed, though it never recorded its end.
    assert (dead.items, dead.batches) == (len(committed), stall_batch)


@pytest.mark.parametrize("stall_window", [0, 3, 7])
def test_killed_window_rolls_back_and_the_next_run_resumes_from_the_watermark(spawn, stall_window):
    at = now()
    start = at - (at - EPOCH) % STEP - 12 * STEP  # on a whole step, twelve steps back
    config = {"start": start.isoformat(), "step": int(STEP.total_seconds())}
    prepare(WINDOWS)
    a = spawn("once", WINDOWS, "A", stall_window=stall_window, **config)
    b = spawn("once", WINDOWS, "B", wait_go=True, **config)
    stalled = kill_when_stalled(a)
    fence_a = stalled["fence"]

    # The window in flight rolled back with its watermark; the ones before it are committed.
    watermark = Watermark.objects.filter(job=WINDOWS).values_list("position", flat=True).first()
    assert watermark == (start + stall_window * STEP if stall_window else None)
    assert sorted(Write.objects.filter(fence=fence_a).values_list("seq", flat=True)) == list(
        range(stall_window)
    )

    take_over(spawn, b, WINDOWS)
    fence_b = b.events("finished")[0]["fence"]
    dead, resumed = runs(WINDOWS)
    assert (dead.fence, dead.outcome) == (fence_a, Outcome.ABANDONED)
    assert (resumed.fence, resumed.outcome) == (fence_b, Outcome.SUCCEEDED), resumed.error
    # The next run started from the committed watermark and caught up to its "now".
    final = Watermark.objects.get(job=WINDOWS).position
    assert final <= resumed.started_at < final + STEP
    windows = (final - start) // STEP
    # Every window from the start to the final watermark, exactly once, no gap.
    written = Counter(Write.objects.filter(job=WINDOWS).values_list("seq", "fence"))
    expected = {(n, fence_a if n < stall_window else fence_b): 1 for n in range(windows)}
    assert written == Counter(expected)
    assert resumed.items == windows - stall_window
    # The dead run's record says what it committed, though it never recorded its end; the
    # next run started where that record says it had got to.
    reached = watermark_text(start + stall_window * STEP) if stall_window else ""
    assert (dead.items, dead.batches, dead.watermark_after) == (
        stall_window,
        stall_window,
        reached,
    )
    assert resumed.watermark_before == dead.watermark_after
