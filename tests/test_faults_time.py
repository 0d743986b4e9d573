"""Operating a job in time with real runner processes on PostgreSQL: a backfill worked by
two runners, one of them SIGKILLed halfway; catch-up across an outage (a stopped runner,
and days without one across both of Europe/Berlin's DST changes); retries with backoff;
one-offs taken by one of two runners, or late with none.

The jobs are in :mod:`tests.faults.time_jobs`. Timings are asserted as lower bounds only
(a retry waits at least its backoff); everything else is counted from the run records, the
lease rows, the handlers' writes and the events the handlers reported. The DST case moves
every process's clock days ahead through the shifted clock of that module. (In one process
on the fake clock: tests/test_time_operations.py.)
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from io import StringIO
from itertools import pairwise
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_fencedjobs import backfills, health
from django_fencedjobs.models import JobLease, JobRun, Outcome, RunKind, Runner, Watermark
from django_fencedjobs.registry import registry
from tests.faults import jobs
from tests.faults.harness import Spawner, Worker, now, prepare, wait_until
from tests.faults.time_jobs import (
    BACKFILL_STEP,
    BACKFILLED,
    CATCHUP,
    CATCHUP_EVERY,
    CATCHUP_LIMIT,
    LATE_ONCE,
    NIGHTLY,
    ONCE,
    RETRIED,
    RETRY_BACKOFF,
    UNRETRIED,
    write_shift,
)
from tests.testapp.models import Write

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

HOUR = timedelta(hours=1)
SLOTS = 48
CONCURRENCY = 3
#: A backfill window's length, in the minutes its writes' ``seq`` counts.
STEP_MINUTES = BACKFILL_STEP // timedelta(minutes=1)


@pytest.fixture(autouse=True)
def declared() -> Iterator[None]:
    """The fault jobs, declared in this process too: backfills and one-offs are checked
    against the declared job, and the tests read schedules from it."""
    with registry.isolated():
        jobs.register()
        yield


def runs_of(name: str, **filters: object) -> list[JobRun]:
    return list(JobRun.objects.filter(job=name, **filters).order_by("scheduled_for", "attempt"))


def stop_all(*workers: Worker) -> None:
    """SIGTERM, and each exits cleanly: once its loop has started (its runner row is
    written inside the loop's signal handling), so that a worker still starting up on a
    loaded machine is not killed by the signal's default action instead."""
    for worker in workers:
        wait_until(
            lambda w=worker: Runner.objects.filter(pid=w.pid).exists() or w.proc.poll() is not None,
            what=f"worker {worker.label}'s loop to start",
        )
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait_exit() == 0, worker.log()


def instant(text: str) -> datetime:
    return datetime.fromisoformat(text)


# -- a backfill, and a runner killed in the middle of it ---------------------------------------


def peak_running(intervals: list[tuple[float, float]]) -> int:
    """The most intervals ``[start, end)`` open at one instant."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    peak = running = 0
    for _, step in events:  # an end sorts before a start at the same instant
        running += step
        peak = max(peak, running)
    return peak


def test_a_backfill_killed_halfway_writes_every_window_once_within_its_concurrency(spawn):
    prepare(BACKFILLED, due=False)
    hour = now().replace(minute=0, second=0, microsecond=0)
    # The job's live row and watermark, as its live runs left them; its next slot is put
    # off, so that no live run moves the watermark while the test runs.
    JobLease.objects.filter(name=BACKFILLED).update(next_run_at=hour + 2 * HOUR)
    live = Watermark.objects.create(job=BACKFILLED, position=hour, fence=7)
    start = hour - SLOTS * HOUR
    request, plan = backfills.backfill(BACKFILLED, start, hour, concurrency=CONCURRENCY)
    slots = [start + n * HOUR for n in range(SLOTS)]  # [start, hour)
    assert [planned.slot for planned in plan.slots] == slots

    def succeeded() -> int:
        return JobRun.objects.filter(
            job=BACKFILLED, kind=RunKind.BACKFILL, outcome=Outcome.SUCCEEDED
        ).count()

    # A runs the first half alone: a runner whose own worker just finished claims the
    # backfill's next slot at once, so beside another runner A might never get one.
    a = spawn("loop", BACKFILLED, "A", workers=CONCURRENCY, role="victim")
    wait_until(lambda: succeeded() >= SLOTS // 2, what="half the slots", diagnostics=spawn.logs)
    # A stops in the middle of its next window, inside its fenced block; B takes the
    # backfill's other slots beside it; A is killed there.
    a.touch("hold")
    a.wait_for("holding")
    b = spawn("loop", BACKFILLED, "B", workers=CONCURRENCY)
    b.wait_for("ready")
    a.signal(signal.SIGKILL)
    killed_at = time.time()
    assert a.wait_exit() == -signal.SIGKILL
    held = {(e["slot"], e["fence"]): e["index"] for e in a.events("holding")}
    c = spawn("loop", BACKFILLED, "C", workers=CONCURRENCY)  # A, restarted
    wait_until(
        lambda: succeeded() == SLOTS,
        timeout=90,
        what="every slot backfilled",
        diagnostics=spawn.logs,
    )
    stop_all(b, c)

    # Every window of every slot written exactly once: no gap, no overlap.
    # Slot s's interval is [s - 1h, s): together they tile [start - 1h, hour - 1h).
    windows = [start - HOUR + n * BACKFILL_STEP for n in range(SLOTS * HOUR // BACKFILL_STEP)]
    written = Counter(Write.objects.filter(job=BACKFILLED).values_list("seq", flat=True))
    assert written == Counter(int(w.timestamp()) // 60 for w in windows)

    # Each slot: one succeeded backfill run; the killed attempts abandoned, their committed
    # windows kept and the rest written by the next attempt, from the slot's own watermark.
    records = runs_of(BACKFILLED)
    assert {r.kind for r in records} == {RunKind.BACKFILL}
    by_slot: dict[datetime, list[JobRun]] = {}
    for record in records:
        by_slot.setdefault(record.scheduled_for, []).append(record)
    assert sorted(by_slot) == slots
    for slot, attempts in by_slot.items():
        outcomes = [r.outcome for r in attempts]
        assert outcomes.count(Outcome.SUCCEEDED) == 1, (slot, outcomes)
        assert set(outcomes) <= {Outcome.SUCCEEDED, Outcome.ABANDONED}, (slot, outcomes)
        assert attempts[-1].outcome == Outcome.SUCCEEDED
        assert [r.attempt for r in attempts] == list(range(1, len(attempts) + 1))
    abandoned = {
        (r.scheduled_for.isoformat(), r.fence) for r in records if r.outcome == Outcome.ABANDONED
    }
    assert held and set(held) <= abandoned
    for (slot_text, fence), index in held.items():
        slot = instant(slot_text)
        first = int((slot - HOUR).timestamp()) // 60
        mine = Write.objects.filter(job=BACKFILLED, seq__gte=first, seq__lt=first + 60)
        retaken = by_slot[slot][-1]
        assert sorted(mine.filter(fence=fence).values_list("seq", flat=True)) == [
            first + n * STEP_MINUTES for n in range(index)
        ]
        assert sorted(mine.filter(fence=retaken.fence).values_list("seq", flat=True)) == [
            first + n * STEP_MINUTES for n in range(index, HOUR // BACKFILL_STEP)
        ]
    rows = JobLease.objects.filter(backfill=request)
    assert rows.count() == SLOTS and all(row.paused for row in rows)  # all done
    assert {w.job: w.position for w in Watermark.objects.exclude(pk=live.pk)} == {
        row.name: row.run_slot for row in rows
    }

    # Never more than its concurrency at once, across the three runners: each handler from
    # its start to its end (a killed one's, to the kill). And it did run side by side.
    intervals, handled = [], set()
    for worker in (a, b, c):
        ended = {(e["slot"], e["fence"]): e["t"] for e in worker.events("ended")}
        for event in worker.events("started"):
            key = (event["slot"], event["fence"])
            intervals.append((event["t"], ended.get(key, killed_at)))
            handled.add(key)
    assert {(r.scheduled_for.isoformat(), r.fence) for r in records} - abandoned <= handled
    assert 2 <= peak_running(intervals) <= CONCURRENCY

    # The job's live watermark and next slot are the backfill's business in no way.
    live.refresh_from_db()
    assert (live.position, live.fence) == (hour, 7)
    assert JobLease.objects.get(name=BACKFILLED).next_run_at == hour + 2 * HOUR


# -- catch-up across an outage ----------------------------------------------------------------


def test_a_stopped_runner_catches_up_by_each_jobs_policy(spawn):
    """One runner, a job of each policy every 2 s; SIGSTOPped for about six slots, then
    resumed: what each job runs for the slots it missed."""
    names = list(CATCHUP.values())
    runner = spawn("loop", ",".join(names), "A", workers=3)
    wait_until(
        lambda: all(JobRun.objects.filter(job=name).count() >= 2 for name in names),
        what="two runs of each job",
        diagnostics=runner.log,
    )
    runner.stop()
    stopped_at = now()
    time.sleep(6 * CATCHUP_EVERY.total_seconds())  # the outage
    resumed_at = now()
    runner.cont()
    wanted = {"coalesce": 1, "each": CATCHUP_LIMIT, "latest": 1}
    wait_until(
        lambda: all(
            JobRun.objects.filter(job=CATCHUP[p], started_at__gt=resumed_at).count() >= n
            for p, n in wanted.items()
        ),
        what="the catch-up runs",
        diagnostics=runner.log,
    )
    stop_all(runner)
    every = CATCHUP_EVERY
    seen = {(e["job"], e["slot"]): e for e in runner.events("ran")}

    def after_outage(policy: str) -> tuple[datetime, list[JobRun]]:
        """The last slot taken before the stop, and the runs taken after it."""
        records = runs_of(CATCHUP[policy])
        before = [r for r in records if r.started_at < stopped_at]
        during = [r for r in records if stopped_at <= r.started_at <= resumed_at]
        assert not during, [str(r) for r in during]  # it really was stopped
        after = [r for r in records if r.started_at > resumed_at]
        assert all(r.outcome == Outcome.SUCCEEDED for r in after), [r.error for r in after]
        assert all((r.attempt, r.kind) == (1, RunKind.SCHEDULED) for r in after)
        return max(r.scheduled_for for r in before), after

    def interval(record: JobRun) -> list[str]:
        return seen[(record.job, record.scheduled_for.isoformat())]["interval"]

    # coalesce: one run, for the latest slot, its interval from the first missed slot's start.
    last, (first, *rest) = after_outage("coalesce")
    missed = (first.scheduled_for - last) // every
    assert missed >= 4  # several slots were missed
    assert first.scheduled_for <= first.started_at < first.scheduled_for + every  # the latest
    assert first.missed_slots == missed - 1
    assert first.interval_start == last
    assert interval(first) == [last.isoformat(), first.scheduled_for.isoformat()]
    assert [r.scheduled_for for r in rest] == [
        first.scheduled_for + n * every for n in range(1, len(rest) + 1)
    ]

    # each: a run per missed slot, oldest first, the latest CATCHUP_LIMIT of them; the
    # others counted as skipped on the first.
    last, after = after_outage("each")
    first = after[0]
    skipped = (first.scheduled_for - last) // every - 1
    assert skipped >= 1  # the outage was longer than the limit
    assert [r.missed_slots for r in after] == [skipped] + [0] * (len(after) - 1)
    latest = first.scheduled_for + (CATCHUP_LIMIT - 1) * every
    assert latest <= first.started_at < latest + every  # the latest due when it started
    assert [r.scheduled_for for r in after] == [
        first.scheduled_for + n * every for n in range(len(after))
    ]
    assert all(
        interval(r) == [(r.scheduled_for - every).isoformat(), r.scheduled_for.isoformat()]
        for r in after
    )

    # latest: one run, for the latest slot, with that slot's own interval.
    last, (first, *rest) = after_outage("latest")
    missed = (first.scheduled_for - last) // every
    assert missed >= 4
    assert first.scheduled_for <= first.started_at < first.scheduled_for + every
    assert first.missed_slots == missed - 1
    assert first.interval_start is None
    assert interval(first) == [
        (first.scheduled_for - every).isoformat(),
        first.scheduled_for.isoformat(),
    ]


@pytest.fixture
def shifted(child_env, tmp_path, monkeypatch) -> Iterator[tuple[Spawner, Path]]:
    """A spawner whose workers, and this process, read the shifted clock of
    :mod:`tests.faults.time_jobs`; and the file that shifts it (see ``write_shift``)."""
    shift = tmp_path / "clock-shift"
    write_shift(str(shift), 0.0)
    clock_path = "tests.faults.time_jobs.shifted_clock"
    monkeypatch.setenv("FENCEDJOBS_TEST_CLOCK_SHIFT", str(shift))
    env = {
        **child_env,
        "FENCEDJOBS_TEST_CLOCK": clock_path,
        "FENCEDJOBS_TEST_CLOCK_SHIFT": str(shift),
    }
    with override_settings(FENCEDJOBS={"CLOCK": clock_path}), Spawner(env, tmp_path) as spawner:
        yield spawner, shift


def move_clock(shift: Path, to: datetime) -> None:
    """Every process's clock reads ``to`` now (and flows on from there)."""
    write_shift(str(shift), (to - datetime.now(UTC)).total_seconds())


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(
    ("seen", "back", "slots"),
    [
        pytest.param(
            utc(2026, 3, 27, 1, 31),
            utc(2026, 3, 31, 12, 0),
            # 02:30 Berlin: CET, then the day 02:30 does not exist (03:00 CEST), then CEST.
            [
                utc(2026, 3, 28, 1, 30),
                utc(2026, 3, 29, 1, 0),
                utc(2026, 3, 30, 0, 30),
                utc(2026, 3, 31, 0, 30),
            ],
            id="spring-forward",
        ),
        pytest.param(
            utc(2026, 10, 23, 0, 31),
            utc(2026, 10, 27, 12, 0),
            # 02:30 Berlin: CEST, then the day it exists twice (once, at the first), then CET.
            [
                utc(2026, 10, 24, 0, 30),
                utc(2026, 10, 25, 0, 30),
                utc(2026, 10, 26, 1, 30),
                utc(2026, 10, 27, 1, 30),
            ],
            id="fall-back",
        ),
    ],
)
def test_days_without_a_runner_across_a_dst_change_catch_up_by_the_schedules_slots(
    shifted, seen, back, slots
):
    spawner, shift = shifted
    names = list(NIGHTLY.values())
    move_clock(shift, seen)
    first = spawner("loop", ",".join(names), "A")
    wait_until(
        lambda: JobLease.objects.filter(name__in=names).count() == 3,
        what="the first runner to see the jobs",
        diagnostics=first.log,
    )
    stop_all(first)
    move_clock(shift, back)  # days later, across the change
    second = spawner("loop", ",".join(names), "B")
    wait_until(
        lambda: (
            JobLease.objects.filter(name__in=names, next_run_at__gt=back).count() == 3
            and JobRun.objects.filter(job__in=names).count() >= 3
            and not JobRun.objects.filter(outcome=Outcome.RUNNING).exists()
        ),
        what="the jobs caught up",
        diagnostics=second.log,
    )
    stop_all(second)
    schedule = registry.get(NIGHTLY["each"]).valid_schedule
    assert schedule.fire_times(seen, back) == slots
    before = schedule.previous_before(slots[0])

    each = runs_of(NIGHTLY["each"])
    assert [r.scheduled_for for r in each] == slots
    assert [(r.missed_slots, r.attempt, r.outcome) for r in each] == [
        (0, 1, Outcome.SUCCEEDED)
    ] * len(slots)
    intervals = {e["slot"]: e["interval"] for e in second.events("ran") if "each" in e["job"]}
    assert [intervals[s.isoformat()] for s in slots] == [
        [a.isoformat(), b.isoformat()] for a, b in pairwise([before, *slots])
    ]

    (coalesced,) = runs_of(NIGHTLY["coalesce"])
    assert (coalesced.scheduled_for, coalesced.missed_slots) == (slots[-1], len(slots) - 1)
    assert coalesced.interval_start == before

    (latest,) = runs_of(NIGHTLY["latest"])
    assert (latest.scheduled_for, latest.missed_slots) == (slots[-1], len(slots) - 1)
    assert latest.interval_start is None


# -- retries ----------------------------------------------------------------------------------


def test_a_failed_slot_is_retried_after_its_backoff_doubling_until_it_succeeds(spawn):
    prepare(RETRIED)
    runner = spawn("loop", RETRIED, "A")
    wait_until(
        lambda: JobRun.objects.filter(job=RETRIED, outcome=Outcome.SUCCEEDED).exists(),
        what="the third attempt",
        diagnostics=runner.log,
    )
    stop_all(runner)
    records = runs_of(RETRIED)
    assert [(r.attempt, r.kind, r.outcome) for r in records] == [
        (1, RunKind.SCHEDULED, Outcome.FAILED),
        (2, RunKind.SCHEDULED, Outcome.FAILED),
        (3, RunKind.SCHEDULED, Outcome.SUCCEEDED),
    ]
    assert len({r.scheduled_for for r in records}) == 1  # the same slot, three times
    assert [e["attempt"] for e in runner.events("ran")] == [1, 2, 3]
    # Attempt n + 1 starts no sooner than the backoff times 2 ** (n - 1) after attempt n ended.
    for n, (ended, retried) in enumerate(pairwise(records)):
        assert retried.started_at - ended.finished_at >= RETRY_BACKOFF * 2**n
    row = JobLease.objects.get(name=RETRIED)
    assert (row.run_slot, row.consecutive_failures) == (None, 0)
    assert row.next_run_at == registry.get(RETRIED).valid_schedule.next_after(records[0].started_at)


def test_a_retry_that_would_reach_the_next_slot_is_not_made(spawn):
    prepare(UNRETRIED)
    runner = spawn("loop", UNRETRIED, "A")
    wait_until(
        lambda: JobRun.objects.filter(job=UNRETRIED).exclude(outcome=Outcome.RUNNING).exists(),
        what="the first attempt",
        diagnostics=runner.log,
    )
    stop_all(runner)
    (failed,) = runs_of(UNRETRIED)
    assert (failed.attempt, failed.outcome) == (1, Outcome.FAILED)
    row = JobLease.objects.get(name=UNRETRIED)
    next_slot = registry.get(UNRETRIED).valid_schedule.next_after(failed.started_at)
    assert (row.next_run_at, row.run_slot, row.consecutive_failures) == (next_slot, None, 1)


# -- one-offs ---------------------------------------------------------------------------------


def test_a_one_off_is_run_once_by_one_of_two_runners_at_its_instant(spawn):
    prepare(ONCE, due=False)
    runners = [spawn("loop", ONCE, label, workers=2) for label in "AB"]
    for runner in runners:
        runner.wait_for("ready")
    at = now() + timedelta(seconds=3)
    name = backfills.run_once(ONCE, at)
    wait_until(
        lambda: JobLease.objects.get(name=name).paused,
        what="the one-off done",
        diagnostics=spawn.logs,
    )
    stop_all(*runners)
    (record,) = runs_of(ONCE)
    assert (record.scheduled_for, record.kind, record.attempt, record.outcome) == (
        at,
        RunKind.ONCE,
        1,
        Outcome.SUCCEEDED,
    )
    assert record.started_at >= at
    ran = [e for runner in runners for e in runner.events("ran")]
    assert [(e["slot"], e["kind"]) for e in ran] == [(at.isoformat(), RunKind.ONCE)]
    assert list(Write.objects.filter(job=ONCE).values_list("fence", flat=True)) == [ran[0]["fence"]]
    # The job's own schedule is untouched: its next slot is still to come.
    assert JobLease.objects.get(name=ONCE).next_run_at > now()


def test_a_one_off_whose_work_committed_is_not_run_again_when_its_runner_dies(spawn):
    # The runner dies after the one-off's fenced write committed and before its end was
    # recorded: the next runner must not run the slot again (its work is done, and tracked
    # by no watermark that a second attempt could resume from). Its attempt is recorded
    # abandoned, the next one skipped, saying why, and the one-off is done.
    prepare(ONCE, due=False)
    victim = spawn("loop", ONCE, "A", workers=1, role="victim")
    victim.wait_for("ready")
    name = backfills.run_once(ONCE, now())
    (wrote,) = victim.wait_for("wrote")
    victim.signal(signal.SIGKILL)
    assert victim.wait_exit() == -signal.SIGKILL
    other = spawn("loop", ONCE, "B", workers=1)
    wait_until(
        lambda: JobLease.objects.get(name=name).paused,
        what="the one-off done",
        diagnostics=spawn.logs,
    )
    stop_all(other)
    assert other.events("ran") == []
    assert list(Write.objects.filter(job=ONCE).values_list("fence", flat=True)) == [wrote["fence"]]
    dead, skipped = runs_of(ONCE)
    assert (dead.kind, dead.attempt, dead.outcome) == (RunKind.ONCE, 1, Outcome.ABANDONED)
    assert (skipped.kind, skipped.attempt, skipped.outcome) == (RunKind.ONCE, 2, Outcome.SKIPPED)
    assert "committed its fenced work, then its runner died" in skipped.error


def test_a_one_off_no_runner_took_is_late_once_its_grace_has_passed(spawn):
    prepare(LATE_ONCE, due=False)
    late_job = registry.get(LATE_ONCE)
    at = now() - timedelta(seconds=5)
    assert late_job.late_after(at) < now()  # its instant + timeout + grace have passed
    name = backfills.run_once(LATE_ONCE, at)
    row = JobLease.objects.get(name=name)
    assert (row.paused, row.late_after) == (False, late_job.late_after(at))
    assert not JobRun.objects.filter(job=LATE_ONCE).exists()  # no runner: nobody took it

    # Judged on its own row, late and critical, as a job is when its slot has not run.
    (judged,) = health.all_health([name], now=now())
    assert (judged.state, judged.severity) == (health.State.LATE, health.Severity.CRITICAL)
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError) as failed:
        call_command("checkjobs", stdout=out, stderr=err)
    assert failed.value.returncode == 2
    (line,) = [line for line in out.getvalue().splitlines() if line.startswith(name)]
    assert "LATE" in line.split()
    assert str(failed.value).startswith("1 of ") and f"{name} (late)" in str(failed.value)
