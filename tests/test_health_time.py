"""Health with retries, backfills and one-offs, in one process on the fake clock: a slot is
judged by its last attempt, a backfill never speaks for the job's latest state, and a
one-off that has not run by its deadline is late in ``checkjobs``."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_fencedjobs import backfills, job, runners
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.health import Severity, State, job_health
from django_fencedjobs.loop import tick
from django_fencedjobs.models import JobLease, JobRun, Outcome, RunKind
from django_fencedjobs.registry import registry

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)  # where the `jobs` fixture sets the fake clock
EVERY = timedelta(minutes=15)


def checkjobs(*args: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("checkjobs", *args, stdout=out, stderr=StringIO())
    except CommandError as exc:
        return exc.returncode, out.getvalue()
    return 0, out.getvalue()


def run_slots(name: str, first: int, last: int, *, retry_after: timedelta | None = None) -> None:
    """Run ``name`` at its slots ``first`` to ``last`` (09:00 plus that many quarters), and
    its retry ``retry_after`` after each slot when given."""
    for n in range(first, last + 1):
        fake_clock.set(T0 + n * EVERY + timedelta(seconds=1))
        tick([name])
        if retry_after is not None:
            fake_clock.set(T0 + n * EVERY + retry_after)
            tick([name])


def first_attempts_fail(name: str) -> None:
    """Declare ``name`` (every 15 minutes, retried once after a minute): every slot's first
    attempt fails, its retry succeeds."""

    @job("*/15 * * * *", name=name, retries=1, retry_backoff=timedelta(minutes=1))
    def handler(run):
        if run.attempt == 1:
            raise RuntimeError("upstream hiccup")

    tick()  # first seen at T0: its first slot is 09:15


# -- a slot is judged by its last attempt --------------------------------------------------------


def test_slots_whose_retry_succeeded_read_ok_and_say_they_needed_retries(jobs):
    first_attempts_fail("r.hiccups")
    run_slots("r.hiccups", 1, 4, retry_after=timedelta(minutes=2))
    assert JobRun.objects.filter(job="r.hiccups", outcome=Outcome.FAILED).count() == 4
    health = job_health("r.hiccups")
    # 8 runs, 4 of them failed: counted by run, a critical failure rate (50%).
    assert (health.recent_runs, health.recent_failures, health.recent_retried) == (4, 0, 4)
    assert (health.state, health.severity) == (State.OK, Severity.HEALTHY)
    assert health.reason.endswith("; 4 of the last 4 slots needed retries")
    assert health.last_finished_run is not None and health.last_finished_run.outcome == "succeeded"
    code, out = checkjobs()
    assert code == 0 and "4 of the last 4 slots needed retries" in out


def test_a_failed_attempt_whose_retry_is_scheduled_is_not_judged_yet(jobs):
    first_attempts_fail("r.pending")
    run_slots("r.pending", 1, 3, retry_after=timedelta(minutes=2))
    fake_clock.set(T0 + 4 * EVERY + timedelta(seconds=1))
    tick(["r.pending"])  # the 10:00 slot's first attempt fails; its retry is due 10:01
    health = job_health("r.pending")
    assert (health.recent_runs, health.recent_failures) == (3, 0)
    assert health.state == State.OK
    # 10:15: a later slot came first, so 10:00's retry is dropped and 10:00 is judged by
    # its failed attempt (10:15's own failed attempt now waits for its retry).
    run_slots("r.pending", 5, 5)
    health = job_health("r.pending")
    assert (health.recent_runs, health.recent_failures) == (4, 1)


def test_a_failed_slot_repaired_by_a_backfill_no_longer_counts_as_failed(jobs):
    bad = {T0 + EVERY, T0 + 2 * EVERY}

    @job("*/15 * * * *", name="r.repaired")
    def handler(run):
        if run.kind == RunKind.SCHEDULED and run.scheduled_for in bad:
            raise RuntimeError("bad data")

    tick()
    run_slots("r.repaired", 1, 4)  # 09:15 and 09:30 fail, 09:45 and 10:00 succeed
    before = job_health("r.repaired")
    assert (before.recent_runs, before.recent_failures) == (4, 2)
    assert before.state == State.FAILING
    backfills.backfill("r.repaired", T0, T0 + 4 * EVERY, selection="failed")
    while tick().runs:
        pass
    after = job_health("r.repaired")
    assert (after.recent_runs, after.recent_failures, after.recent_retried) == (4, 0, 0)
    assert after.state == State.OK
    assert "needed retries" not in after.reason  # a backfill is not a retry


def test_a_failed_backfill_speaks_neither_for_the_jobs_latest_run_nor_adds_to_its_window(jobs):
    @job("0 8 * * *", name="r.daily")
    def handler(run):
        if run.kind == RunKind.BACKFILL:
            raise RuntimeError("the old data is gone")

    tick()  # first seen at T0 (09:00): its first slot is tomorrow 08:00
    backfills.backfill("r.daily", T0 - timedelta(days=2), T0, selection="all")
    while tick().runs:
        pass
    backfilled = JobRun.objects.filter(job="r.daily", kind=RunKind.BACKFILL)
    assert [run.outcome for run in backfilled] == [Outcome.FAILED, Outcome.FAILED]
    health = job_health("r.daily")
    assert (health.last_run, health.last_finished_run) == (None, None)
    assert (health.recent_runs, health.recent_failures) == (0, 0)
    assert (health.state, health.severity) == (State.NEVER_RUN, Severity.HEALTHY)


def test_a_backfill_that_fails_a_slot_the_job_ran_counts_it_as_failed(jobs):
    @job("*/15 * * * *", name="r.rerun")
    def handler(run):
        if run.kind == RunKind.BACKFILL:
            raise RuntimeError("the old data is gone")

    tick()
    run_slots("r.rerun", 1, 3)  # 09:15, 09:30, 09:45 succeed
    backfills.backfill("r.rerun", T0, T0 + 2 * EVERY, selection="all")  # 09:00 and 09:15
    while tick().runs:
        pass
    health = job_health("r.rerun")
    # 09:15 is judged by its last attempt, the backfill's; 09:00 was never the job's own.
    assert (health.recent_runs, health.recent_failures) == (3, 1)
    assert health.last_finished_run is not None
    assert health.last_finished_run.scheduled_for == T0 + 3 * EVERY
    assert health.last_finished_run.outcome == Outcome.SUCCEEDED


# -- one-offs ------------------------------------------------------------------------------------


def report_job() -> None:
    @job("0 8 * * *", name="o.report")
    def report(run):
        pass

    tick()  # first seen at T0: its first slot is tomorrow 08:00


def test_a_one_off_that_has_not_run_by_its_deadline_is_late_in_checkjobs(jobs):
    report_job()
    at = T0 + timedelta(hours=2)
    name = backfills.run_once("o.report", at)
    deadline = registry.get("o.report").late_after(at)
    fake_clock.set(deadline)
    assert checkjobs() == (0, checkjobs()[1])  # at its deadline: not late yet
    assert name not in checkjobs()[1]
    fake_clock.set(deadline + timedelta(minutes=5))
    code, out = checkjobs()
    assert code == 2
    (line,) = [line for line in out.splitlines() if line.startswith(name)]
    assert "LATE" in line
    assert "the one-off of o.report at 2026-11-29 11:00" in line
    assert "has not run" in line and "5 min late" in line
    code, out = checkjobs("--json")
    (entry,) = [e for e in json.loads(out)["jobs"] if e["name"] == name]
    assert (entry["state"], entry["severity"]) == ("late", "critical")


def test_a_one_off_that_ran_is_not_late(jobs):
    report_job()
    at = T0 + timedelta(hours=2)
    name = backfills.run_once("o.report", at)
    fake_clock.set(at + timedelta(seconds=1))
    tick()
    assert JobRun.objects.filter(job="o.report", kind=RunKind.ONCE).count() == 1
    fake_clock.set(registry.get("o.report").late_after(at) + timedelta(hours=1))
    code, out = checkjobs()
    assert code == 0
    assert name not in out
    assert job_health(name).state == State.OK  # named: judged, done


def test_a_one_off_held_by_a_run_past_its_deadline_is_not_late(jobs):
    report_job()
    at = T0 + timedelta(hours=2)
    name = backfills.run_once("o.report", at)
    deadline = registry.get("o.report").late_after(at)
    # Taken by a runner, and still running at its deadline.
    JobLease.objects.filter(name=name).update(owner="host-a:1", lease_until=deadline + EVERY)
    fake_clock.set(deadline + timedelta(minutes=1))
    code, out = checkjobs()
    assert code == 0 and name not in out
    assert job_health(name).state == State.RUNNING


def test_a_late_one_off_with_no_live_runner_says_so(jobs):
    with override_settings(
        FENCEDJOBS={
            "CLOCK": "django_fencedjobs.clock.fake_clock",
            "RUNNER_BEAT": timedelta(microseconds=1),
            "RUNNER_TIMEOUT": timedelta(seconds=30),
        }
    ):
        report_job()
        runners.Presence([registry.get("o.report")], workers=1, owner="host-a:1").beat()
        at = T0 + timedelta(hours=2)
        name = backfills.run_once("o.report", at)
        fake_clock.set(registry.get("o.report").late_after(at) + timedelta(minutes=1))
        code, out = checkjobs("--json")
    assert code == 2
    (entry,) = [e for e in json.loads(out)["jobs"] if e["name"] == name]
    assert (entry["state"], entry["severity"]) == ("no_runner", "critical")
    assert entry["reason"].startswith("the one-off of o.report at ")
    assert "no live runner: host-a:1, the last to run it, last seen at" in entry["reason"]
