"""The contract of the end store (``lease.end_runs``): what recording a run's end does to
its lease row and its run's row. The runner decides the end (``runner._run_end``); the
store applies it, in one statement on PostgreSQL and through the ORM elsewhere. Every test
here runs against both databases (the PostgreSQL pass and the SQLite pass), so the two
spellings are held to one contract."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from django_fencedjobs import lease, outcomes
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.models import LEASE_FREE, JobLease, JobRun, Outcome, RunKind

pytestmark = pytest.mark.django_db(transaction=True)

SLOT = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
NEXT = SLOT + timedelta(hours=1)
END = SLOT + timedelta(seconds=30)


@pytest.fixture(autouse=True)
def clock(jobs):
    fake_clock.set(END)


def held(
    name: str, *, kind: str = RunKind.SCHEDULED, owner: str = "A:1"
) -> tuple[JobLease, JobRun]:
    """A lease row held by a run of slot :data:`SLOT`, and that run's row, running."""
    lease.create(
        [JobLease(name=name, next_run_at=NEXT, kind=kind, created_at=SLOT)], ignore_conflicts=False
    )
    row = JobLease.objects.get(name=name)
    row.fence += 1
    row.owner = owner
    row.lease_until = END + timedelta(minutes=1)
    row.save()
    run = JobRun.objects.create(
        job=name,
        scheduled_for=SLOT,
        started_at=SLOT,
        outcome=Outcome.RUNNING,
        fence=row.fence,
        owner=owner,
        items=5,
        batches=2,
        watermark_after="w7",
    )
    return row, run


def ending(row: JobLease, run: JobRun, outcome: str = Outcome.SUCCEEDED, **more) -> lease.RunEnd:
    fields = {
        "error": "",
        "capped": False,
        "loose_items": 0,
        "succeeded_at": SLOT if outcome == Outcome.SUCCEEDED else None,
        "late_after": None,
        "finished_at": END,
        **more,
    }
    return lease.RunEnd(row.name, run.fence, run.pk, outcome=outcome, **fields)


def test_a_success_frees_the_lease_moves_the_fence_on_and_records_the_run():
    row, run = held("s.ok")
    ended = lease.end_runs([ending(row, run, loose_items=3)], lock_wait=1)[run.pk]
    assert (ended.released, ended.outcome, ended.retry_at) == (True, Outcome.SUCCEEDED, None)
    # What the run's row now says, as committed: its items plus those counted outside.
    assert (ended.items, ended.batches, ended.watermark_after) == (8, 2, "w7")
    assert ended.finished_at == END
    after = JobLease.objects.get(name="s.ok")
    assert (after.fence, after.owner, after.lease_until) == (row.fence + 1, "", LEASE_FREE)
    assert (after.last_success_at, after.consecutive_failures) == (SLOT, 0)
    recorded = JobRun.objects.get(pk=run.pk)
    assert (recorded.outcome, recorded.items, recorded.finished_at) == (
        Outcome.SUCCEEDED,
        8,
        END,
    )


def test_a_failure_without_a_retry_counts_and_with_one_before_the_next_slot_schedules_it():
    row, run = held("s.failing")
    ended = lease.end_runs([ending(row, run, Outcome.FAILED, error="boom")], lock_wait=1)
    assert ended[run.pk].retry_at is None
    assert JobLease.objects.get(name="s.failing").consecutive_failures == 1

    row, run = held("s.retrying")
    retry = lease.Retry(backoff=timedelta(minutes=5), slot=SLOT, attempt=2)
    ended = lease.end_runs([ending(row, run, Outcome.FAILED, retry=retry)], lock_wait=1)
    assert ended[run.pk].retry_at == END + timedelta(minutes=5)
    after = JobLease.objects.get(name="s.retrying")
    assert (after.next_run_at, after.run_slot, after.attempt) == (
        END + timedelta(minutes=5),
        SLOT,
        2,
    )
    assert after.consecutive_failures == 0  # the slot is judged by its last attempt


def test_a_retry_that_would_start_after_the_next_slot_is_not_scheduled_and_the_failure_counts():
    row, run = held("s.late_retry")
    retry = lease.Retry(backoff=timedelta(hours=2), slot=SLOT, attempt=2)
    ended = lease.end_runs([ending(row, run, Outcome.FAILED, retry=retry)], lock_wait=1)
    assert ended[run.pk].retry_at is None
    after = JobLease.objects.get(name="s.late_retry")
    assert (after.next_run_at, after.run_slot, after.consecutive_failures) == (NEXT, None, 1)


def test_a_one_shot_row_is_done_with_its_final_outcome_and_always_takes_its_retry():
    row, run = held("s.oneshot@once", kind=RunKind.ONCE)
    lease.end_runs([ending(row, run)], lock_wait=1)
    assert JobLease.objects.get(name="s.oneshot@once").paused  # done

    row, run = held("s.again@once", kind=RunKind.ONCE)
    retry = lease.Retry(backoff=timedelta(hours=2), slot=SLOT, attempt=2)
    ended = lease.end_runs([ending(row, run, Outcome.FAILED, retry=retry)], lock_wait=1)
    assert ended[run.pk].retry_at == END + timedelta(hours=2)
    assert not JobLease.objects.get(name="s.again@once").paused


def test_an_end_after_a_takeover_changes_no_lease_and_records_the_superseded_outcome():
    row, run = held("s.taken")
    JobLease.objects.filter(name="s.taken").update(fence=row.fence + 1, owner="B:1")
    lost_outcome, lost_error = outcomes.if_superseded(Outcome.TIMED_OUT, run.fence)
    end = ending(
        row,
        run,
        Outcome.TIMED_OUT,
        error="timed out",
        lost_outcome=lost_outcome,
        lost_error=lost_error,
    )
    ended = lease.end_runs([end], lock_wait=1)[run.pk]
    assert (ended.released, ended.outcome) == (False, Outcome.FENCE_LOST)
    assert ended.error == outcomes.fence_lost(run.fence)
    after = JobLease.objects.get(name="s.taken")
    assert (after.fence, after.owner, after.consecutive_failures) == (row.fence + 1, "B:1", 0)

    # Any other outcome is recorded as it was decided.
    row, run = held("s.taken_ok")
    JobLease.objects.filter(name="s.taken_ok").update(fence=row.fence + 1, owner="B:1")
    ended = lease.end_runs([ending(row, run)], lock_wait=1)[run.pk]
    assert (ended.released, ended.outcome) == (False, Outcome.SUCCEEDED)
    assert JobLease.objects.get(name="s.taken_ok").last_success_at is None


def test_a_run_recorded_already_is_left_as_it_is_and_an_abandoned_one_is_recorded():
    row, run = held("s.recorded")
    JobRun.objects.filter(pk=run.pk).update(outcome=Outcome.TIMED_OUT, error="by its supervisor")
    assert lease.end_runs([ending(row, run)], lock_wait=1) == {}
    assert JobRun.objects.get(pk=run.pk).outcome == Outcome.TIMED_OUT

    row, run = held("s.abandoned")
    JobRun.objects.filter(pk=run.pk).update(outcome=Outcome.ABANDONED)
    assert lease.end_runs([ending(row, run)], lock_wait=1)[run.pk].outcome == Outcome.SUCCEEDED


def test_many_ends_are_recorded_together_each_by_its_own_rule():
    ends, runs = [], []
    for index, outcome in enumerate([Outcome.SUCCEEDED, Outcome.FAILED, Outcome.INTERRUPTED]):
        row, run = held(f"s.many{index}")
        ends.append(ending(row, run, outcome))
        runs.append(run)
    ended = lease.end_runs(ends, lock_wait=1)
    assert [ended[run.pk].outcome for run in runs] == [
        Outcome.SUCCEEDED,
        Outcome.FAILED,
        Outcome.INTERRUPTED,
    ]
    rows = {r.name: r for r in JobLease.objects.filter(name__startswith="s.many")}
    assert [rows[f"s.many{i}"].consecutive_failures for i in range(3)] == [0, 1, 0]
    assert all(r.owner == "" for r in rows.values())


def test_the_end_clock_is_the_stores_when_the_runner_gives_none():
    row, run = held("s.clock")
    ended = lease.end_runs([ending(row, run, finished_at=None)], lock_wait=1)[run.pk]
    assert ended.finished_at is not None
    assert JobRun.objects.get(pk=run.pk).finished_at == ended.finished_at


def held_again(name: str, slot: datetime) -> tuple[JobLease, JobRun]:
    """The lease row ``name`` (free) held again, by a run of ``slot``."""
    row = JobLease.objects.get(name=name)
    row.fence += 1
    row.owner = "A:1"
    row.lease_until = END + timedelta(minutes=1)
    row.save()
    run = JobRun.objects.create(
        job=name, scheduled_for=slot, started_at=slot, outcome=Outcome.RUNNING, fence=row.fence
    )
    return row, run


def ages(name: str) -> tuple[int | None, int | None]:
    row = JobLease.objects.get(name=name)
    return row.last_failure_age, row.previous_failure_age


def test_the_failure_ages_count_the_judged_slots_since_each_of_the_last_two_failures():
    """``last_failure_age`` and ``previous_failure_age``: how many judged slots ago the
    latest failure and the one before it were. A failure whose retry follows is not judged
    yet, nor is an outcome that rates nothing (interrupted)."""
    row, run = held("s.ages")
    assert ages("s.ages") == (None, None)
    retry = lease.Retry(backoff=timedelta(minutes=5), slot=SLOT, attempt=2)
    steps = [
        (Outcome.FAILED, {}, (1, None)),
        (Outcome.SUCCEEDED, {}, (2, None)),
        (Outcome.SUCCEEDED, {}, (3, None)),
        (Outcome.FAILED, {"retry": retry}, (3, None)),  # its retry follows: not judged yet
        (Outcome.TIMED_OUT, {}, (1, 4)),  # the retry failed: the slot is a failure
        (Outcome.SUCCEEDED, {}, (2, 5)),
        (Outcome.INTERRUPTED, {}, (2, 5)),
        (Outcome.FAILED, {}, (1, 3)),
    ]
    for step, (outcome, more, expected) in enumerate(steps, start=1):
        if step > 1:
            row, run = held_again("s.ages", SLOT + timedelta(minutes=step))
        assert lease.end_runs([ending(row, run, outcome, **more)], lock_wait=1)[run.pk]
        assert ages("s.ages") == expected, f"after step {step}, {outcome}"


def test_a_retry_dropped_for_a_later_slot_counts_its_failure_in_the_failure_ages():
    """A failed attempt whose retry a later slot superseded: judged a failure when that
    slot's run takes the lease (``acquire``, and the batch's ``take``), as
    ``consecutive_failures`` counts it."""
    row, run = held("s.dropped")
    lease.end_runs([ending(row, run, Outcome.SUCCEEDED)], lock_wait=1)
    row, run = held_again("s.dropped", NEXT)
    lease.end_runs([ending(row, run, Outcome.FAILED)], lock_wait=1)
    assert ages("s.dropped") == (1, None)
    later = END + timedelta(hours=3)
    seen = lease.read(["s.dropped"])["s.dropped"]
    fence = lease.acquire(
        seen,
        owner="B:2",
        now=later,
        ttl=timedelta(minutes=1),
        next_run_at=later + timedelta(hours=1),
        dropped_retry=True,
    )
    assert fence == seen.fence + 1
    after = JobLease.objects.get(name="s.dropped")
    assert (after.consecutive_failures, ages("s.dropped")) == (2, (1, 2))

    # Free again, its latest failure 4 judged slots ago and none before it.
    JobLease.objects.filter(name="s.dropped").update(
        owner="", lease_until=LEASE_FREE, last_failure_age=4, previous_failure_age=None
    )
    seen = lease.read(["s.dropped"])["s.dropped"]
    record = JobRun(job="s.dropped", scheduled_for=seen.next_run_at, fence=seen.fence + 1)
    taken, skipped = lease.take(
        [
            lease.Take(
                row=seen,
                next_run_at=seen.next_run_at + timedelta(hours=1),
                lease_until=later + timedelta(minutes=1),
                record=record,
                dropped_retry=True,
            )
        ],
        later,
    )
    assert (len(taken), skipped) == (1, [])
    after = JobLease.objects.get(name="s.dropped")
    assert (after.consecutive_failures, ages("s.dropped")) == (3, (1, 5))
