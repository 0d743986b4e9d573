"""Fault: the scheduler was down for days (a broken deploy, a stopped cron host), and an hourly
job missed every slot in between.

Why it matters: a job that processes "the last hour" on each run silently loses every hour
of the outage; one that replays every missed slot at once floods the system when it comes
back. Here the missed slots coalesce into one recorded run (``missed_slots``), the backlog
is worked off from the persisted watermark in runs capped at ``max_batches`` (recorded
``capped``) until caught up, and the watermark covers every hour exactly once: no gap, no
duplicate.

In process, with the fake clock: the outage is days long, the test takes a second.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from itertools import pairwise

import pytest

from django_fencedjobs import fenced_atomic, job
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.loop import tick
from django_fencedjobs.models import JobRun, Outcome, Watermark
from tests.conftest import JOBS_T0 as T0
from tests.testapp.models import Write

pytestmark = pytest.mark.django_db(transaction=True)

HOUR = timedelta(hours=1)
NAME = "faults.hourly_rollup"


@pytest.mark.parametrize(("days_down", "max_batches"), [(2, 24), (3, 10), (7, 50)])
def test_downtime_is_caught_up_by_capped_runs_covering_every_hour_once(
    jobs, days_down, max_batches
):
    fake_clock.set(T0 + timedelta(minutes=1))

    @job("0 * * * *", name=NAME, max_batches=max_batches, timeout=timedelta(minutes=30))
    def rollup(run):
        for window in run.windows(HOUR, start=T0):
            with fenced_atomic():
                Write.objects.create(job=NAME, fence=run.fence, seq=(window.start - T0) // HOUR)
                run.advance_watermark(window.end)
                run.add_items(1)

    tick()  # first sight of the job: its first slot is T0 + 1h
    fake_clock.set(T0 + HOUR + timedelta(minutes=1))
    (before,) = tick().runs
    assert (before.outcome, before.items) == (Outcome.SUCCEEDED, 1)

    # Down from just after T0 + 1h until just after T0 + `down` hours.
    down = 1 + 24 * days_down
    fake_clock.set(T0 + down * HOUR + timedelta(minutes=1))
    catch_up: list[JobRun] = []
    for _ in range(down):  # bound: never more runs than hours
        catch_up += tick().runs
        if catch_up and not catch_up[-1].capped:
            break
        fake_clock.advance(HOUR)  # the next slot
    assert catch_up and not catch_up[-1].capped, [str(r) for r in catch_up]
    assert tick().runs == []  # caught up: nothing more until the next slot

    first, *rest = catch_up
    # The missed slots coalesced into the first run after the outage; each later run is
    # its own slot, one hour on.
    assert first.scheduled_for == T0 + down * HOUR
    assert first.missed_slots == down - 2
    assert [r.missed_slots for r in rest] == [0] * len(rest)
    assert [r.scheduled_for for r in rest] == [
        first.scheduled_for + n * HOUR for n in range(1, len(rest) + 1)
    ]
    # Every run but the last stopped at max_batches, with work left, and said so.
    assert all(r.outcome == Outcome.SUCCEEDED for r in catch_up), [r.error for r in catch_up]
    assert [r.capped for r in catch_up] == [True] * (len(catch_up) - 1) + [False]
    assert all(r.batches == max_batches for r in catch_up[:-1])
    assert 0 < catch_up[-1].batches <= max_batches
    # Each run started where the one before it stopped.
    runs = [before, *catch_up]
    for earlier, later in pairwise(runs):
        assert later.watermark_before == earlier.watermark_after

    # The watermark reached the last whole hour, and every hour up to it was processed
    # exactly once: no gap, no duplicate.
    last_hour = catch_up[-1].scheduled_for
    assert Watermark.objects.get(job=NAME).position == last_hour
    hours = (last_hour - T0) // HOUR
    assert Counter(Write.objects.filter(job=NAME).values_list("seq", flat=True)) == Counter(
        range(hours)
    )
    assert sum(r.items for r in runs) == hours
