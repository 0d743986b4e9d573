"""Who a run is: the handler of a backfill slot or a one-off sees the job it runs for, as a
scheduled run of that job does (its name, and an instance's key and parent), while the run
takes, renews, checks and ends the lease of the slot's own row."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db.models import F

from django_fencedjobs import backfills, fenced_atomic, job
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.loop import tick
from django_fencedjobs.models import (
    BackfillSelection,
    JobLease,
    JobRun,
    Outcome,
    RunKind,
    Watermark,
)
from tests.testapp.models import Write

pytestmark = pytest.mark.django_db(transaction=True)


def _h(hour: int) -> datetime:
    return datetime(2026, 11, 29, hour, 0, tzinfo=UTC)


def _until_idle() -> list[JobRun]:
    """The runs of the ticks up to the first that runs nothing (five at most)."""
    runs: list[JobRun] = []
    for _ in range(5):
        ran = tick(workers=2).runs
        if not ran:
            break
        runs += ran
    return runs


def test_a_backfill_of_an_instance_runs_as_the_instance_under_its_slots_own_lease(jobs):
    seen: list[tuple[str, str | None, str | None, str, str]] = []

    @job(instances=True, name="t.shop")
    def shop(run, *, tenant):
        seen.append((run.job.name, run.job.key, run.job.parent, run.kind, tenant))
        run.heartbeat()  # renews the lease the run holds
        with fenced_atomic():
            run.advance_watermark(run.scheduled_for)
            # As the demo's handler does: one row per job and slot, whichever run writes it.
            Write.objects.update_or_create(
                job=run.job.name, seq=run.scheduled_for.hour, defaults={"fence": run.fence}
            )

    shop.instances.upsert("paris", cron="0 * * * *", kwargs={"tenant": "Paris"})
    fake_clock.set(_h(10) + timedelta(seconds=1))
    (scheduled,) = _until_idle()
    assert scheduled.outcome == Outcome.SUCCEEDED
    instance_fence = JobLease.objects.get(name="t.shop[paris]").fence
    seen.clear()

    request, plan = backfills.backfill(
        "t.shop[paris]", _h(9), fake_clock(), selection=BackfillSelection.ALL, concurrency=2
    )
    assert [s.slot for s in plan.slots] == [_h(9), _h(10)]
    runs = _until_idle()

    assert sorted(seen) == [("t.shop[paris]", "paris", "t.shop", RunKind.BACKFILL, "Paris")] * 2
    assert sorted((r.job, r.scheduled_for, r.kind, r.outcome) for r in runs) == [
        ("t.shop[paris]", _h(9), RunKind.BACKFILL, Outcome.SUCCEEDED),
        ("t.shop[paris]", _h(10), RunKind.BACKFILL, Outcome.SUCCEEDED),
    ]
    # The demo's upsert by job and slot: one row per slot, not one per name.
    assert sorted(Write.objects.values_list("job", "seq")) == [
        ("t.shop[paris]", 9),
        ("t.shop[paris]", 10),
    ]
    # Each slot's run took, renewed and ended its own row's lease; the instance's row and
    # its live watermark are untouched.
    rows = {row.run_slot: row for row in JobLease.objects.filter(backfill=request)}
    for run in runs:
        row = rows[run.scheduled_for]
        assert (row.paused, row.fence) == (True, run.fence + 1)
        assert Watermark.objects.get(job=row.name).position == run.scheduled_for
    assert JobLease.objects.get(name="t.shop[paris]").fence == instance_fence
    assert Watermark.objects.get(job="t.shop[paris]").position == _h(10)


def test_a_one_off_runs_as_its_job_and_a_stale_write_of_it_is_refused(jobs):
    seen: list[tuple[str, str | None, str | None, str, str]] = []
    rows: dict[str, str] = {}

    @job("0 8 * * *", name="t.report")
    def report(run, fmt="pdf"):
        seen.append((run.job.name, run.job.key, run.job.parent, run.kind, fmt))
        run.heartbeat()
        with fenced_atomic():
            Write.objects.create(job=run.job.name, fence=run.fence, seq=1)
        if fmt == "stale":
            # Another run took the one-off's own lease over: this one may write no more.
            JobLease.objects.filter(name=rows[fmt]).update(fence=F("fence") + 1)
            with fenced_atomic():
                Write.objects.create(job=run.job.name, fence=run.fence, seq=2)

    tick()  # the job's own row
    own_fence = JobLease.objects.get(name="t.report").fence
    for fmt, minute in (("csv", 5), ("stale", 10)):
        rows[fmt] = backfills.run_once(
            "t.report", _h(9) + timedelta(minutes=minute), kwargs={"fmt": fmt}
        )
    fake_clock.set(_h(9) + timedelta(minutes=11))
    runs = {run.scheduled_for.minute: run for run in _until_idle()}

    assert sorted(seen) == [
        ("t.report", None, None, RunKind.ONCE, "csv"),
        ("t.report", None, None, RunKind.ONCE, "stale"),
    ]
    assert (runs[5].job, runs[5].outcome) == ("t.report", Outcome.SUCCEEDED)
    assert (runs[10].job, runs[10].outcome) == ("t.report", Outcome.FENCE_LOST)
    assert sorted(Write.objects.values_list("fence", "seq")) == [
        (runs[5].fence, 1),
        (runs[10].fence, 1),
    ]
    done = JobLease.objects.get(name=rows["csv"])
    assert (done.paused, done.fence) == (True, runs[5].fence + 1)
    assert JobLease.objects.get(name="t.report").fence == own_fence


def test_a_one_offs_supervisor_renews_the_one_offs_own_lease(jobs):
    renewed: list[datetime] = []

    @job("0 8 * * *", name="t.slow", lease_ttl=timedelta(seconds=0.3))
    def slow(run):
        # Past the lease as taken: only the supervisor's renewal keeps it.
        expected = fake_clock.advance(timedelta(seconds=1)) + run.job.lease_ttl
        given_up = time.monotonic() + 30
        while JobLease.objects.get(name=row).lease_until != expected:
            assert time.monotonic() < given_up, "the one-off's lease was never renewed"
            time.sleep(0.02)
        renewed.append(expected)

    tick()  # the job's own row
    own = JobLease.objects.get(name="t.slow")
    row = backfills.run_once("t.slow", _h(9) + timedelta(minutes=5))
    fake_clock.set(_h(9) + timedelta(minutes=6))
    runs = _until_idle()

    assert [(run.job, run.outcome) for run in runs] == [("t.slow", Outcome.SUCCEEDED)]
    assert len(renewed) == 1
    mine = JobLease.objects.get(name="t.slow")
    assert (mine.fence, mine.lease_until) == (own.fence, own.lease_until)
