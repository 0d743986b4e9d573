"""Fault: the scheduler loop gets SIGTERM (a deploy, systemd stop, a pod evicted) while a
batch job is in the middle of a run.

Why it matters: killing the run mid-transaction throws away the batch in progress, and a
process that exits holding its lease holds up the next slot until the lease expires. Here
the batch in progress finishes and commits, no further batch starts, the run is recorded
``interrupted``, the lease is released, and the process exits 0.
"""

from __future__ import annotations

import signal

import pytest

from django_fencedjobs.models import LEASE_FREE, JobLease, Outcome
from tests.faults.harness import prepare, runs
from tests.faults.jobs import ITEMS
from tests.testapp.models import Item, Write

pytestmark = pytest.mark.django_db(transaction=True)

ITEM_COUNT = 30
SIZE = 5


@pytest.mark.parametrize("stall_batch", [0, 1, 3])
def test_sigterm_mid_batch_commits_the_batch_and_exits_cleanly(spawn, stall_batch):
    Item.objects.bulk_create([Item(name=f"item-{n}") for n in range(ITEM_COUNT)])
    prepare(ITEMS)
    loop = spawn("loop", ITEMS, "L", size=SIZE, stall_batch=stall_batch)
    (stalled,) = loop.wait_for("stalled")
    loop.signal(signal.SIGTERM)
    assert loop.wait_exit() == 0, loop.log()

    fence = stalled["fence"]
    batches = {event["index"]: event["ids"] for event in loop.events("batch")}
    # The batch in progress was finished and committed; no batch started after it.
    assert sorted(batches) == list(range(stall_batch + 1))
    done = {pk for ids in batches.values() for pk in ids}
    assert set(Item.objects.exclude(processed_at=None).values_list("id", flat=True)) == done
    assert set(Item.objects.filter(processed_by_fence=fence).values_list("id", flat=True)) == done
    assert sorted(Write.objects.filter(job=ITEMS).values_list("seq", flat=True)) == sorted(done)
    (run,) = runs(ITEMS)
    assert (run.fence, run.outcome) == (fence, Outcome.INTERRUPTED), run.error
    assert (run.batches, run.items) == (stall_batch + 1, len(done))
    assert run.finished_at is not None
    # The lease was released, and the run's fence is dead: ending a run moves it on.
    row = JobLease.objects.get(name=ITEMS)
    assert (row.owner, row.lease_until, row.fence) == ("", LEASE_FREE, fence + 1)
