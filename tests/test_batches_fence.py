"""``run.batches()`` checks the fence in the statement that claims each batch (on
PostgreSQL) or in the fenced transaction around it (elsewhere): a stale fence claims
nothing, and while a batch is open its lease row is locked against a takeover."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import OperationalError, connection, connections

from django_fencedjobs import job
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.loop import tick
from django_fencedjobs.models import JobLease, Outcome
from tests.testapp.models import Item

pytestmark = pytest.mark.django_db(transaction=True)


def run_due(name: str):
    tick()
    fake_clock.advance(timedelta(minutes=5))
    (record,) = tick().runs
    return record


def queue():
    return Item.objects.filter(processed_at=None).order_by("id")


def test_a_stale_fence_claims_nothing(jobs):
    Item.objects.bulk_create([Item(name=f"i{n}") for n in range(5)])
    seen = []

    @job("*/5 * * * *", name="t.stale_batches")
    def stale(run):
        JobLease.objects.filter(name="t.stale_batches").update(fence=run.fence + 1)
        for batch in run.batches(queue(), size=2):
            seen.append(batch)

    record = run_due("t.stale_batches")
    assert record.outcome == Outcome.FENCE_LOST
    assert seen == []
    assert queue().count() == 5


def test_an_empty_queue_ends_the_batches(jobs):
    @job("*/5 * * * *", name="t.empty_batches")
    def empty(run):
        for _ in run.batches(queue(), size=2):
            raise AssertionError("nothing to claim")

    record = run_due("t.empty_batches")
    assert (record.outcome, record.batches, record.items) == (Outcome.SUCCEEDED, 0, 0)


@pytest.mark.postgres_only
def test_an_open_batch_holds_the_lease_row_against_a_takeover(jobs):
    Item.objects.bulk_create([Item(name=f"i{n}") for n in range(3)])
    takeover: list[str] = []

    def take_over() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = '300ms'")
                cursor.execute(
                    "UPDATE fencedjobs_joblease SET fence = fence + 1 WHERE name = %s",
                    ["t.locked_batches"],
                )
            takeover.append("took it")
        except OperationalError:
            takeover.append("waited")
        finally:
            connections.close_all()

    @job("*/5 * * * *", name="t.locked_batches")
    def locked(run):
        for batch in run.batches(queue(), size=10):
            thread = threading.Thread(target=take_over)
            thread.start()
            thread.join()
            for item in batch:
                item.processed_at = run.now
            Item.objects.bulk_update(batch, ["processed_at"])
            run.add_items(len(batch))

    record = run_due("t.locked_batches")
    assert takeover == ["waited"]
    assert (record.outcome, record.items) == (Outcome.SUCCEEDED, 3)
    assert JobLease.objects.get(name="t.locked_batches").fence == record.fence + 1  # ended
