"""Operating a job in time, in one process on the fake clock: the catch-up policies,
retries with backoff, backfills and one-offs. (Real processes, outages and a runner
killed mid-backfill: tests/test_faults_time.py.)"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from django_fencedjobs import backfills, clock, job, loop
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.fencing import fenced_atomic
from django_fencedjobs.models import JobLease, JobRun, Outcome, RunKind, Watermark
from tests.testapp.models import Write

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
SEEN: list[tuple[str, datetime, datetime, int, str]] = []


def _hourly(**options):
    SEEN.clear()

    @job("0 * * * *", name="t.hourly", **options)
    def hourly(run):
        SEEN.append((run.job.name, run.scheduled_for, run.interval.start, run.attempt, run.kind))
        with fenced_atomic():
            pass

    return hourly


def _runs(name="t.hourly"):
    return list(
        JobRun.objects.filter(job=name)
        .order_by("scheduled_for", "attempt")
        .values_list("scheduled_for", "attempt", "kind", "outcome", "missed_slots")
    )


def _h(hour: int, day: int = 29) -> datetime:
    return datetime(2026, 11, day, hour, 0, tzinfo=UTC)


def _outage(hours: int) -> None:
    """The job's row is made at 09:00 (next slot 10:00); nothing runs until ``hours``
    later, a minute past the hour."""
    fake_clock.set(_h(9) + timedelta(seconds=1))
    loop.tick()
    fake_clock.set(_h(9 + hours) + timedelta(minutes=1))


def test_coalesce_runs_once_for_the_latest_slot_with_an_interval_covering_the_outage(jobs):
    _hourly()
    _outage(5)  # 10:00 to 14:00 missed
    loop.tick()
    assert _runs()[-1] == (_h(14), 1, RunKind.SCHEDULED, Outcome.SUCCEEDED, 4)
    assert SEEN[-1][1:3] == (_h(14), _h(9))  # [09:00, 14:00): the whole outage
    assert len(loop.tick().runs) == 0


def test_each_runs_every_missed_slot_in_order_then_stops(jobs):
    _hourly(catchup="each")
    _outage(5)
    while loop.tick().runs:
        pass
    assert [(slot, missed) for slot, _, _, _, missed in _runs()] == [
        (_h(10), 0),
        (_h(11), 0),
        (_h(12), 0),
        (_h(13), 0),
        (_h(14), 0),
    ]
    assert [seen[2] for seen in SEEN] == [_h(9), _h(10), _h(11), _h(12), _h(13)]
    assert JobLease.objects.get(name="t.hourly").next_run_at == _h(15)


def test_each_keeps_the_latest_slots_up_to_its_limit_and_counts_the_rest(jobs):
    _hourly(catchup="each", catchup_limit=2)
    _outage(5)
    while loop.tick().runs:
        pass
    assert [(slot, missed) for slot, _, _, _, missed in _runs()] == [
        (_h(13), 3),  # 10:00, 11:00 and 12:00 skipped, counted on the first run
        (_h(14), 0),
    ]


def test_latest_runs_the_latest_slot_with_its_own_interval(jobs):
    _hourly(catchup="latest")
    _outage(5)
    loop.tick()
    assert _runs()[-1][:2] == (_h(14), 1) and _runs()[-1][4] == 4
    assert SEEN[-1][1:3] == (_h(14), _h(13))


def test_each_across_a_dst_change_runs_the_schedules_slots_once_each(jobs):
    SEEN.clear()

    @job("30 2 * * *", name="t.night", timezone="Europe/Berlin", catchup="each")
    def night(run):
        SEEN.append((run.job.name, run.scheduled_for, run.interval.start, run.attempt, run.kind))

    # 2026-03-29: 02:30 does not exist in Berlin (clocks go 02:00 -> 03:00): the schedule
    # fires at 03:00 CEST = 01:00 UTC that day. An outage from the 27th to the 31st.
    fake_clock.set(datetime(2026, 3, 27, 1, 31, tzinfo=UTC))
    loop.tick()
    fake_clock.set(datetime(2026, 3, 31, 12, 0, tzinfo=UTC))
    while loop.tick().runs:
        pass
    expected = night.job.valid_schedule.fire_times(
        datetime(2026, 3, 27, 1, 31, tzinfo=UTC), datetime(2026, 3, 31, 12, 0, tzinfo=UTC)
    )
    assert [seen[1] for seen in SEEN] == expected
    assert datetime(2026, 3, 29, 1, 0, tzinfo=UTC) in expected  # after the gap


def test_a_failed_run_is_retried_with_backoff_before_the_next_slot(jobs):
    calls: list[datetime] = []

    @job("0 * * * *", name="t.flaky", retries=3, retry_backoff=timedelta(minutes=10))
    def flaky(run):
        calls.append(run.now)
        if run.attempt < 3:
            raise RuntimeError(f"attempt {run.attempt} fails")

    loop.tick()  # its row, next slot 10:00
    fake_clock.set(_h(10) + timedelta(seconds=1))
    loop.tick()
    lease_row = JobLease.objects.get(name="t.flaky")
    assert lease_row.run_slot == _h(10) and lease_row.attempt == 2
    assert lease_row.consecutive_failures == 0  # retried: judged by the last attempt
    assert lease_row.next_run_at - _h(10) == timedelta(minutes=10, seconds=1)
    fake_clock.advance(timedelta(minutes=10))
    loop.tick()
    # Attempt 3 waits twice as long: 20 minutes after attempt 2's end.
    assert JobLease.objects.get(name="t.flaky").next_run_at - clock.now() == timedelta(minutes=20)
    fake_clock.advance(timedelta(minutes=20))
    loop.tick()
    assert [(a, o) for _, a, _, o, _ in _runs("t.flaky")] == [
        (1, Outcome.FAILED),
        (2, Outcome.FAILED),
        (3, Outcome.SUCCEEDED),
    ]
    row = JobLease.objects.get(name="t.flaky")
    assert (row.run_slot, row.next_run_at, row.consecutive_failures) == (None, _h(11), 0)


def test_a_retrys_starting_deadline_counts_from_its_backoff_not_from_its_slot(jobs):
    """The retry is due 15 minutes after the slot, by its backoff; a 10-minute starting
    deadline counted from the slot would record it missed without running it."""

    @job(
        "0 * * * *",
        name="t.flaky",
        retries=2,
        retry_backoff=timedelta(minutes=15),
        starting_deadline=timedelta(minutes=10),
    )
    def flaky(run):
        if run.attempt == 1:
            raise RuntimeError("attempt 1 fails")

    loop.tick()  # its row, next slot 10:00
    fake_clock.set(_h(10) + timedelta(seconds=1))
    loop.tick()
    fake_clock.advance(timedelta(minutes=15, seconds=5))  # 5 s after the retry was due
    loop.tick()
    fake_clock.advance(timedelta(minutes=29))  # no second retry is made: it succeeded
    loop.tick()
    assert [(a, o) for _, a, _, o, _ in _runs("t.flaky")] == [
        (1, Outcome.FAILED),
        (2, Outcome.SUCCEEDED),
    ]


def test_a_retry_that_would_reach_the_next_slot_is_not_made(jobs, caplog):
    @job("0 * * * *", name="t.flaky", retries=5, retry_backoff=timedelta(minutes=40))
    def flaky(run):
        raise RuntimeError("always")

    caplog.set_level("INFO", logger="django_fencedjobs")
    loop.tick()  # its row, next slot 10:00
    fake_clock.set(_h(10) + timedelta(seconds=1))
    loop.tick()  # attempt 1 fails; attempt 2 at 10:40
    fake_clock.set(_h(10) + timedelta(minutes=40, seconds=2))
    loop.tick()  # attempt 2 fails; attempt 3 would be at 12:00: past 11:00, not made
    row = JobLease.objects.get(name="t.flaky")
    assert (row.run_slot, row.next_run_at, row.consecutive_failures) == (None, _h(11), 1)
    assert [a for _, a, _, _, _ in _runs("t.flaky")] == [1, 2]
    slot = "slot 2026-11-29 10:00:00 UTC"
    assert [r.getMessage() for r in caplog.records if "retry" in getattr(r, "event", "")] == [
        f"t.flaky: attempt 2 of the scheduled run of {slot} will be at 10:40:01",
        f"t.flaky: no retry of the scheduled run of {slot}: attempt 3 would not start before"
        " the next slot",
    ]


@pytest.mark.parametrize("of", ["job", "instance"])
def test_a_retry_redoes_the_whole_interval_of_the_coalescing_attempt_it_retries(jobs, of, caplog):
    """Down from 09:00 to 12:01: attempt 1 of 12:00 coalesces 10:00 and 11:00, covers
    [09:00, 12:00) and fails; its retry covers the same interval, not [11:00, 12:00). The
    log says when the retry is, and nothing says that none follows."""
    seen: list[tuple[int, datetime, datetime]] = []

    def fails_once(run):
        seen.append((run.attempt, run.interval.start, run.interval.end))
        if run.attempt == 1:
            raise RuntimeError("attempt 1 fails")

    options = {"retries": 2, "retry_backoff": timedelta(minutes=10)}
    if of == "job":
        name = "t.flaky"
        job("0 * * * *", name=name, **options)(fails_once)
    else:  # its lease is taken by the batch claim of instances
        name = "t.flaky[a]"
        job(instances=True, name="t.flaky", **options)(fails_once).instances.upsert(
            "a", cron="0 * * * *"
        )
    caplog.set_level("INFO", logger="django_fencedjobs")
    _outage(3)  # 10:00 and 11:00 missed; 12:00 coalesces them
    loop.tick()  # attempt 1 fails
    fake_clock.advance(timedelta(minutes=10, seconds=1))
    loop.tick()  # attempt 2 succeeds
    assert seen == [(1, _h(9), _h(12)), (2, _h(9), _h(12))]
    assert [(a, o, m) for _, a, _, o, m in _runs(name)] == [
        (1, Outcome.FAILED, 2),
        (2, Outcome.SUCCEEDED, 0),  # the slots it covers again are counted once, by attempt 1
    ]
    starts = JobRun.objects.filter(job=name).order_by("attempt").values_list("interval_start")
    assert list(starts) == [(_h(9),), (_h(9),)]
    retried = [r.getMessage() for r in caplog.records if "retry" in getattr(r, "event", "")]
    assert retried == [
        f"{name}: attempt 2 of the scheduled run of slot 2026-11-29 12:00:00 UTC"
        " will be at 12:11:00"
    ]


@pytest.mark.parametrize("of", ["job", "instance"])
def test_a_failure_whose_retry_a_later_slot_superseded_counts_as_a_failure(jobs, of):
    options = {"retries": 3, "retry_backoff": timedelta(minutes=10)}
    if of == "job":
        name = "t.flaky"
        job("0 * * * *", name=name, **options)(_always_fails)
    else:  # its lease is taken by the batch claim of instances
        name = "t.flaky[a]"
        job(instances=True, name="t.flaky", **options)(_always_fails).instances.upsert(
            "a", cron="0 * * * *"
        )
    loop.tick()  # its row, next slot 10:00
    fake_clock.set(_h(10) + timedelta(seconds=1))
    loop.tick()  # attempt 1 fails; attempt 2 due at 10:10, not counted yet
    assert JobLease.objects.get(name=name).consecutive_failures == 0
    # No runner until past 11:00: slot 11:00 runs instead of the retry. 10:00's last
    # attempt was the failure: it counts (11:00's will when its retries are out).
    fake_clock.set(_h(11) + timedelta(seconds=1))
    loop.tick()
    row = JobLease.objects.get(name=name)
    assert (row.run_slot, row.attempt, row.consecutive_failures) == (_h(11), 2, 1)
    assert [(slot, a) for slot, a, _, _, _ in _runs(name)] == [(_h(10), 1), (_h(11), 1)]


def _always_fails(run):
    raise RuntimeError("always")


def test_a_backfill_runs_each_selected_slot_once_under_its_own_watermark(jobs):
    @job("0 * * * *", name="t.windows")
    def windows(run):
        for window in run.windows(timedelta(minutes=30)):
            with fenced_atomic():
                run.advance_watermark(window.end)
                run.add_items(1)

    fake_clock.set(_h(11) + timedelta(seconds=1))
    loop.tick()  # its row, next slot 12:00
    fake_clock.set(_h(12) + timedelta(seconds=1))
    loop.tick()  # the live run: its watermark
    live = Watermark.objects.get(job="t.windows").position
    dry = backfills.plan_backfill("t.windows", _h(6), _h(9))
    assert [s.slot for s in dry.slots] == [_h(6), _h(7), _h(8)]
    assert not JobLease.objects.filter(kind=RunKind.BACKFILL).exists()  # a dry run
    request, _ = backfills.backfill("t.windows", _h(6), _h(9), concurrency=2)
    while loop.tick().runs:
        pass
    backfilled = JobRun.objects.filter(job="t.windows", kind=RunKind.BACKFILL).order_by(
        "scheduled_for"
    )
    assert [(r.scheduled_for, r.outcome, r.items) for r in backfilled] == [
        (_h(6), Outcome.SUCCEEDED, 2),  # [05:00, 06:00) in two 30-minute windows
        (_h(7), Outcome.SUCCEEDED, 2),
        (_h(8), Outcome.SUCCEEDED, 2),
    ]
    assert Watermark.objects.get(job="t.windows").position == live  # never moved
    assert JobLease.objects.filter(backfill=request, paused=True).count() == 3
    # Missing only: nothing left to backfill in the range.
    assert backfills.plan_backfill("t.windows", _h(6), _h(9)).slots == []


def test_a_one_off_runs_once_at_its_instant_with_its_arguments(jobs):
    got: list[tuple[str, str]] = []

    @job("0 8 * * *", name="t.report")
    def report(run, fmt: str = "pdf"):
        got.append((run.kind, fmt))

    at = _h(14)
    name = backfills.run_once("t.report", at, kwargs={"fmt": "csv"})
    fake_clock.set(at - timedelta(seconds=1))
    assert loop.tick().runs == []
    fake_clock.set(at + timedelta(seconds=1))
    loop.tick()
    loop.tick()
    assert got == [(RunKind.ONCE, "csv")]
    assert JobLease.objects.get(name=name).paused  # done
    with pytest.raises(backfills.BackfillError, match="cannot take these arguments"):
        backfills.run_once("t.report", at, kwargs={"nope": 1})


def test_a_resumed_job_catches_up_by_its_policy_or_from_now_skips_recorded(jobs):
    from django_fencedjobs import manual

    hourly = _hourly(catchup="each")
    loop.tick()  # its row, next slot 10:00
    manual.pause(hourly.job)
    fake_clock.set(_h(13) + timedelta(minutes=1))
    assert loop.tick().runs == []  # paused: 10:00 to 13:00 fall due, nothing runs
    manual.resume(hourly.job)
    while loop.tick().runs:
        pass
    assert [slot for slot, *_ in _runs()] == [_h(10), _h(11), _h(12), _h(13)]

    manual.pause(hourly.job)
    fake_clock.set(_h(16) + timedelta(minutes=1))
    done = manual.resume(hourly.job, from_now=True)
    assert "3 slot(s) due while it was paused skipped" in done.line
    assert loop.tick().runs == []
    assert _runs()[-1] == (_h(16), 1, RunKind.SCHEDULED, Outcome.SKIPPED, 2)
    assert JobLease.objects.get(name="t.hourly").next_run_at == _h(17)


def test_jobctl_resumes_from_now_and_refuses_from_now_with_another_operation(jobs):
    from io import StringIO

    from django.core.management import CommandError, call_command

    _hourly()
    loop.tick()
    call_command("jobctl", "pause", "t.hourly", stdout=StringIO())
    fake_clock.set(_h(12) + timedelta(minutes=1))
    out = StringIO()
    call_command("jobctl", "resume", "t.hourly", "--from-now", stdout=out)
    assert "resumed t.hourly from now: 3 slot(s)" in out.getvalue()
    with pytest.raises(CommandError, match="--from-now goes with resume only"):
        call_command("jobctl", "pause", "t.hourly", "--from-now", stdout=StringIO())
    assert not JobLease.objects.get(name="t.hourly").paused


@pytest.mark.parametrize("kind", [RunKind.SCHEDULED, RunKind.ONCE])
@pytest.mark.parametrize(
    ("ending", "retried"),
    [("raises", True), ("times_out", False), ("times_out_with_a_watermark", True)],
)
def test_a_retry_never_redoes_work_its_attempt_committed_before_timing_out(
    jobs, kind, ending, retried, caplog
):
    """Attempt 1 commits its fenced write, then fails. If it raised, its handler asked for
    the retry, which runs. If it overran its timeout instead, the handler never said that
    its work was incomplete: a retry would write the slot twice, so it is recorded skipped,
    naming why, and the timeout counts as the slot's failure. A watermark says where the
    committed work stopped, and a retry resumes from it: that one runs."""
    attempts: list[int] = []

    @job(
        "0 * * * *" if kind == RunKind.SCHEDULED else "0 8 * * *",  # a one-off: no slot at 10
        name="t.wobbly",
        retries=2,
        retry_backoff=timedelta(minutes=1),
        timeout=timedelta(seconds=2),
    )
    def wobbly(run):
        attempts.append(run.attempt)
        with fenced_atomic():
            Write.objects.create(job="t.wobbly", fence=run.fence, seq=run.attempt)
            if ending == "times_out_with_a_watermark":
                run.advance_watermark(run.attempt)
        if run.attempt > 1:
            return
        if ending == "raises":
            raise RuntimeError("attempt 1 fails")
        for _ in range(200):  # past its timeout: interrupted in here
            time.sleep(0.05)

    caplog.set_level("WARNING", logger="django_fencedjobs")
    fake_clock.set(_h(9) + timedelta(seconds=1))
    loop.tick()  # its row, next slot 10:00
    if kind == RunKind.ONCE:
        name = backfills.run_once("t.wobbly", _h(9, day=28))
    fake_clock.set(_h(10) + timedelta(seconds=1))
    loop.tick()
    fake_clock.advance(timedelta(minutes=2))
    loop.tick()
    loop.tick()
    first = Outcome.FAILED if ending == "raises" else Outcome.TIMED_OUT
    runs = [(a, k, o) for _, a, k, o, _ in _runs("t.wobbly")]
    writes = sorted(Write.objects.filter(job="t.wobbly").values_list("seq", flat=True))
    if retried:
        assert (attempts, writes) == ([1, 2], [1, 2])
        assert runs == [(1, kind, first), (2, kind, Outcome.SUCCEEDED)]
        return
    assert (attempts, writes) == ([1], [1])
    assert runs == [(1, kind, first), (2, kind, Outcome.SKIPPED)]
    skipped = JobRun.objects.get(job="t.wobbly", kind=kind, attempt=2)
    assert "committed its fenced work, then it ended timed_out" in skipped.error
    assert skipped.started_at is None
    (logged,) = [r for r in caplog.records if getattr(r, "event", "") == "slot_not_rerun"]
    assert "attempt 2 of slot" in logged.getMessage()
    if kind == RunKind.ONCE:
        assert JobLease.objects.get(name=name).paused  # done
        return
    row = JobLease.objects.get(name="t.wobbly")  # on to the next slot, the timeout counted
    assert (row.run_slot, row.next_run_at, row.consecutive_failures) == (None, _h(11), 1)


@pytest.mark.parametrize("of", ["job", "instance"])
@pytest.mark.parametrize("first", [RunKind.SCHEDULED, RunKind.BACKFILL])
def test_a_backfill_and_a_retry_of_the_same_slot_both_run_as_its_next_attempts(jobs, first, of):
    # The backfill is queued while the slot's attempt 1 has failed and its retry waits:
    # both were given attempt 2. Whichever is taken second finds that number taken, and
    # runs as the attempt after it: neither is dropped. (An instance's retry is taken by
    # the batch claim of instances, a job's alone.)
    def shaky(run):
        if run.attempt == 1:
            raise RuntimeError("attempt 1 fails")

    options = {"retries": 1, "retry_backoff": timedelta(minutes=5)}
    if of == "job":
        name = "t.shaky"
        job("0 * * * *", name=name, **options)(shaky)
    else:
        name = "t.shaky[a]"
        job(instances=True, name="t.shaky", **options)(shaky).instances.upsert(
            "a", cron="0 * * * *"
        )
    loop.tick()  # its row, next slot 10:00
    fake_clock.set(_h(10) + timedelta(seconds=1))
    loop.tick()  # attempt 1 fails; its retry is due at 10:05:01
    backfills.backfill(name, _h(10), _h(10) + timedelta(seconds=1), selection="failed")
    later = JobLease.objects.filter(
        kind=RunKind.SCHEDULED if first == RunKind.BACKFILL else RunKind.BACKFILL
    )
    later.update(next_run_at=_h(10) + timedelta(minutes=30))
    fake_clock.set(_h(10) + timedelta(minutes=6))
    loop.tick()
    fake_clock.set(_h(10) + timedelta(minutes=31))
    while loop.tick().runs:
        pass
    second = RunKind.SCHEDULED if first == RunKind.BACKFILL else RunKind.BACKFILL
    assert [(a, k, o) for slot, a, k, o, _ in _runs(name) if slot == _h(10)] == [
        (1, RunKind.SCHEDULED, Outcome.FAILED),
        (2, first, Outcome.SUCCEEDED),
        (3, second, Outcome.SUCCEEDED),
    ]


@pytest.mark.parametrize("kind", [RunKind.ONCE, RunKind.BACKFILL])
def test_a_one_shot_whose_instance_was_deleted_before_it_ran_is_recorded_skipped(jobs, kind):
    # Queued for an instance that is then deleted: it cannot run, and it must not vanish
    # with a line in the log: its slot is recorded as skipped, saying why.
    ran = []

    def digest(run):
        ran.append(run.job.name)

    base = job(instances=True, name="t.digest")(digest)
    base.instances.upsert("a", cron="0 * * * *")
    loop.tick()
    slot = _h(8)
    if kind == RunKind.ONCE:
        name = backfills.run_once("t.digest[a]", slot)
    else:
        backfills.backfill("t.digest[a]", slot, slot + timedelta(seconds=1))
        (name,) = JobLease.objects.filter(kind=RunKind.BACKFILL).values_list("name", flat=True)
    base.instances.delete("a")
    fake_clock.set(_h(10) + timedelta(seconds=1))
    loop.tick()
    assert ran == []
    (run,) = JobRun.objects.filter(job="t.digest[a]", scheduled_for=slot)
    assert (run.kind, run.outcome) == (kind, Outcome.SKIPPED)
    assert "t.digest[a] was deleted before it ran" in run.error
    assert JobLease.objects.get(name=name).paused  # done


def test_a_one_off_whose_holder_died_and_whose_instance_was_then_deleted_leaves_no_run_running(
    jobs,
):
    # Its last attempt's runner died (or stopped) mid-run, then the instance was deleted:
    # the next claim finds the target gone. The dead attempt is fenced off and recorded
    # abandoned, never left running for good on a row no acquisition will take again.
    base = job(instances=True, name="t.digest")(lambda run: None)
    base.instances.upsert("a", cron="0 * * * *")
    loop.tick()
    slot = _h(8)
    name = backfills.run_once("t.digest[a]", slot)
    row = JobLease.objects.get(name=name)
    dead = row.fence + 1
    JobLease.objects.filter(pk=row.pk).update(
        fence=dead, owner="dead:1", lease_until=_h(9) + timedelta(minutes=5), attempt=1
    )
    JobRun.objects.create(
        job="t.digest[a]",
        scheduled_for=slot,
        started_at=_h(9),
        outcome=Outcome.RUNNING,
        kind=RunKind.ONCE,
        attempt=1,
        fence=dead,
        owner="dead:1",
    )
    base.instances.delete("a")
    fake_clock.set(_h(10) + timedelta(seconds=1))  # its lease long expired
    loop.tick()
    attempts = JobRun.objects.filter(job="t.digest[a]", scheduled_for=slot).order_by("attempt")
    assert [(r.attempt, r.outcome) for r in attempts] == [
        (1, Outcome.ABANDONED),
        (2, Outcome.SKIPPED),
    ]
    row = JobLease.objects.get(name=name)
    assert row.paused and row.fence == dead + 1 and row.owner == ""


def test_a_backfill_or_one_off_of_a_name_nobody_declared_is_a_backfill_error(jobs):
    # docs/api.md: each function of backfills raises BackfillError for what it cannot do.
    with pytest.raises(backfills.BackfillError, match=r"t\.nobody"):
        backfills.run_once("t.nobody", _h(8))
    with pytest.raises(backfills.BackfillError, match=r"t\.nobody"):
        backfills.backfill("t.nobody", _h(8), _h(9))
