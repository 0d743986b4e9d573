"""Each health state arises from real runs (fake clock + loop.tick), decided in one place."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_fencedjobs import health as health_module
from django_fencedjobs import job, operations
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.exceptions import UnknownJob
from django_fencedjobs.health import JobHealth, Severity, State, all_health, job_health
from django_fencedjobs.loop import tick
from django_fencedjobs.models import JobLease, JobRun, Outcome
from django_fencedjobs.registry import registry
from tests.testapp.models import Item

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)  # where the `jobs` fixture sets the fake clock
# "*/15 * * * *" with no declared timeout: half the interval, 7.5 minutes; grace 5 minutes.
DEADLINE_AFTER_SLOT = timedelta(minutes=7, seconds=30) + timedelta(minutes=5)
SECOND = timedelta(seconds=1)


def quarterly(name: str, **kwargs):
    def declare(func):
        return job("*/15 * * * *", name=name, **kwargs)(func)

    return declare


def test_a_job_that_runs_on_schedule_is_ok(jobs):
    @quarterly("h.fine")
    def fine(run):
        pass

    tick()
    fake_clock.set(T0 + timedelta(minutes=15))
    tick()
    health = job_health("h.fine")
    assert (health.state, health.severity) == (State.OK, Severity.HEALTHY)
    assert health.last_success_at == T0 + timedelta(minutes=15)
    assert health.reason == "last success 2026-11-29 09:15:00 UTC; next run 09:30:00"
    assert health.healthy


def test_a_new_job_is_never_run_until_its_first_slot_deadline_passes_then_late(jobs):
    @quarterly("h.new")
    def new(run):
        pass

    tick()  # the runner sees the job: its lease row is created at T0
    first_slot = T0 + timedelta(minutes=15)
    health = job_health("h.new", now=first_slot + DEADLINE_AFTER_SLOT)
    assert health.state == State.NEVER_RUN and health.healthy
    assert health.expected_by == first_slot + DEADLINE_AFTER_SLOT
    assert "first slot 2026-11-29 09:15:00 UTC, expected by 09:27:30" in health.reason

    late = job_health("h.new", now=first_slot + DEADLINE_AFTER_SLOT + SECOND)
    assert (late.state, late.severity) == (State.LATE, Severity.CRITICAL)
    assert late.reason == (
        "never succeeded; its first slot 2026-11-29 09:15:00 UTC was expected to succeed by "
        "09:27:30"
    )


def test_a_job_is_late_once_its_slot_passes_with_no_run(jobs):
    @quarterly("h.stalled")
    def stalled(run):
        pass

    tick()
    fake_clock.set(T0 + timedelta(minutes=15))
    tick()  # succeeds at 09:15; then the runner stops ticking
    deadline = T0 + timedelta(minutes=30) + DEADLINE_AFTER_SLOT

    fake_clock.set(deadline)
    assert job_health("h.stalled").state == State.OK

    fake_clock.set(deadline + SECOND)
    late = job_health("h.stalled")
    assert late.state == State.LATE
    assert late.reason == "no successful run since 2026-11-29 09:15:00 UTC; expected by 09:42:30"
    assert late.next_run_at == T0 + timedelta(minutes=30)  # due, but nobody ran it

    fake_clock.set(deadline + timedelta(minutes=1))
    tick()  # the runner comes back: the coalesced run succeeds
    assert job_health("h.stalled").state == State.OK


def test_the_reason_is_written_in_the_jobs_zone(jobs):
    @job("0 9 * * *", name="h.berlin", timezone="Europe/Berlin", timeout=timedelta(minutes=7))
    def berlin(run):
        pass

    fake_clock.set(datetime(2026, 11, 29, 7, 0, tzinfo=UTC))
    tick()
    fake_clock.set(datetime(2026, 11, 29, 8, 0, tzinfo=UTC))  # 09:00 CET
    tick()
    late = job_health("h.berlin", now=datetime(2026, 11, 30, 8, 13, tzinfo=UTC))
    assert late.reason == (
        "no successful run since 2026-11-29 09:00:00 Europe/Berlin; "
        "expected by 2026-11-30 09:12:00 Europe/Berlin"
    )


def test_consecutive_failures_at_the_threshold_make_a_job_failing(jobs):
    @quarterly("h.broken")
    def broken(run):
        raise RuntimeError("upstream said no")

    tick()
    for n in range(1, 4):
        fake_clock.set(T0 + n * timedelta(minutes=15))
        tick()
        if n == 2:
            assert job_health("h.broken").state == State.LATE  # no success yet, past 09:27:30
    failing = job_health("h.broken")
    assert (failing.state, failing.severity) == (State.FAILING, Severity.CRITICAL)
    assert failing.consecutive_failures == 3
    assert failing.reason.startswith("3 consecutive failures (threshold 3); last failed at ")
    assert failing.reason.endswith("RuntimeError: upstream said no")


def test_a_job_that_failed_and_never_succeeded_is_not_healthy(jobs):
    @quarterly("h.unconfigured")
    def unconfigured(run):
        raise RuntimeError("API key missing")

    tick()
    fake_clock.set(T0 + timedelta(minutes=15))
    tick()  # the first run fails; the deadline (09:27:30) has not passed yet
    health = job_health("h.unconfigured")
    assert (health.state, health.severity) == (State.FAILING, Severity.WARNING)
    assert not health.healthy
    assert health.reason == (
        "1 failure and no success yet (critical at 3 consecutive failures); last failed at "
        "2026-11-29 09:15:00 UTC: RuntimeError: API key missing; a success is expected by 09:27:30"
    )


def test_the_failure_threshold_is_per_job_and_a_success_resets_it(jobs):
    outcomes = iter([RuntimeError("once"), None])

    @quarterly("h.flaky", failure_threshold=1)
    def flaky(run):
        error = next(outcomes)
        if error:
            raise error

    tick()
    fake_clock.set(T0 + timedelta(minutes=15))
    tick()
    assert job_health("h.flaky").state == State.FAILING
    fake_clock.set(T0 + timedelta(minutes=30))
    tick()
    assert job_health("h.flaky").state == State.OK


def test_a_run_in_progress_is_running(jobs):
    seen = []

    @quarterly("h.busy")
    def busy(run):
        seen.append(job_health("h.busy"))

    tick()
    fake_clock.set(T0 + timedelta(minutes=15))
    tick()
    (during,) = seen
    fence = JobRun.objects.get(job="h.busy").fence
    assert (during.state, during.running, during.fence) == (State.RUNNING, True, fence)
    assert during.owner and during.lease_until == T0 + timedelta(minutes=17)
    assert during.reason.startswith("running since 2026-11-29 09:15:00 UTC on ")
    assert during.last_run is not None and during.last_run.outcome == "running"
    assert job_health("h.busy").state == State.OK


def test_a_paused_job_is_paused_even_when_it_would_be_late(jobs):
    @quarterly("h.resting")
    def resting(run):
        pass

    tick()
    fake_clock.set(T0 + timedelta(minutes=15))
    tick()
    operations.set_paused("h.resting", True)
    fake_clock.set(T0 + timedelta(hours=5))
    assert tick().runs == []
    paused = job_health("h.resting")
    assert (paused.state, paused.severity) == (State.PAUSED, Severity.WARNING)
    assert paused.reason == "paused: no runs until resumed; last success 2026-11-29 09:15:00 UTC"
    operations.set_paused("h.resting", False)
    assert job_health("h.resting").state == State.LATE


def test_a_run_that_hits_max_batches_makes_the_job_capped(jobs):
    Item.objects.bulk_create([Item(name=f"i{n}") for n in range(5)])

    @quarterly("h.backlog", max_batches=2)
    def backlog(run):
        for batch in run.batches(Item.objects.filter(processed_at=None).order_by("id"), size=1):
            Item.objects.filter(pk__in=[i.pk for i in batch]).update(processed_at=run.now)

    tick()
    fake_clock.set(T0 + timedelta(minutes=15))
    tick()
    capped = job_health("h.backlog")
    assert (capped.state, capped.severity) == (State.CAPPED, Severity.WARNING)
    assert "max_batches (2)" in capped.reason
    fake_clock.set(T0 + timedelta(minutes=30))
    tick()
    fake_clock.set(T0 + timedelta(minutes=45))
    tick()  # the backlog is drained
    assert job_health("h.backlog").state == State.OK


def test_a_job_removed_from_code_is_shown_as_removed_with_its_history(jobs):
    @quarterly("h.gone")
    def gone(run):
        pass

    tick()
    fake_clock.set(T0 + timedelta(minutes=15))
    tick()
    with registry.isolated():
        removed = job_health("h.gone")
        assert (removed.state, removed.severity) == (State.REMOVED, Severity.HEALTHY)
        assert removed.job is None and removed.last_run is not None
        assert [h.name for h in all_health()] == ["h.gone"]
    assert JobRun.objects.filter(job="h.gone").count() == 1


def test_a_declared_job_no_runner_has_seen_is_a_warning(jobs):
    @quarterly("h.unseen")
    def unseen(run):
        pass

    health = job_health("h.unseen")
    assert (health.state, health.severity) == (State.NEVER_RUN, Severity.WARNING)
    assert "no lease row" in health.reason
    assert health.next_run_at == T0 + timedelta(minutes=15)
    assert not JobLease.objects.exists()


def test_a_job_with_an_invalid_schedule_is_invalid(jobs):
    @job("61 * * * *", name="h.typo")
    def typo(run):
        pass

    health = job_health("h.typo")
    assert (health.state, health.severity) == (State.INVALID, Severity.CRITICAL)
    assert "minute" in health.reason


def test_all_health_lists_the_worst_first_with_a_constant_number_of_queries(jobs):
    def declare(n: int) -> None:
        @quarterly(f"h.many{n}")
        def many(run):
            pass

    @quarterly("h.bad", failure_threshold=1)
    def bad(run):
        raise ValueError("no")

    for n in range(2):
        declare(n)
    tick()
    fake_clock.set(T0 + timedelta(minutes=15))
    tick()
    with CaptureQueriesContext(connection) as few:
        all_health()
    for n in range(2, 12):
        declare(n)
    tick()
    fake_clock.set(T0 + timedelta(minutes=30))
    tick()
    with CaptureQueriesContext(connection) as many:
        healths = all_health()
    # Three reads; on PostgreSQL, also the transaction the first is read in (its JIT off).
    assert len(many) == len(few) <= (5 if connection.vendor == "postgresql" else 3)
    assert [h.name for h in healths][:1] == ["h.bad"]
    assert healths[0].state == State.FAILING
    assert {h.state for h in healths[1:]} == {State.OK}


def test_asking_for_an_unknown_job_raises_unknown_job(jobs):
    with pytest.raises(UnknownJob, match=r"'h\.nope'"):
        job_health("h.nope")


def test_health_decides_and_leaves_presenting_it_to_its_callers():
    """The exit status is checkjobs', JSON is checkjobs', formatting a time for a reader is
    the admin's or checkjobs': health decides the state and says why."""
    assert not hasattr(health_module, "exit_code")
    assert not hasattr(health_module, "_format")
    assert not hasattr(JobHealth, "as_dict")
    assert not hasattr(JobHealth, "local")


def test_a_jobs_times_are_in_its_schedules_zone_and_an_invalid_jobs_in_utc(jobs):
    @job("0 9 * * *", name="h.berlin", timezone="Europe/Berlin")
    def berlin(run):
        pass

    @job("0 9 * * *", name="h.nowhere", timezone="Mars/Olympus_Mons")
    def nowhere(run):
        pass

    tick()
    good, bad = job_health("h.berlin"), job_health("h.nowhere")
    assert good.tz is registry.get("h.berlin").schedule.tz
    assert good.tz == ZoneInfo("Europe/Berlin")
    assert bad.state == State.INVALID and "Mars/Olympus_Mons" in bad.reason
    assert bad.tz is UTC  # never a silent guess at a zone that does not resolve


def test_a_runs_duration_is_the_models_and_an_abandoned_run_has_none(jobs):
    @quarterly("h.timed")
    def timed(run):
        fake_clock.advance(timedelta(seconds=42))

    tick()
    fake_clock.set(T0 + timedelta(minutes=15))
    tick()
    (run,) = JobRun.objects.filter(job="h.timed")
    assert run.duration == 42.0
    assert job_health("h.timed").last_finished_run.duration == 42.0

    # A run whose process died: it "finished" when a later run noticed, so the time from
    # its start to then is not how long it ran.
    abandoned = JobRun.objects.create(
        job="h.timed",
        scheduled_for=T0 + timedelta(minutes=30),
        started_at=T0 + timedelta(minutes=30),
        finished_at=T0 + timedelta(minutes=45),
        outcome=Outcome.ABANDONED,
    )
    assert abandoned.duration is None
    assert job_health("h.timed").last_finished_run.duration is None
    missed = JobRun(job="h.timed", scheduled_for=T0, finished_at=T0, outcome=Outcome.MISSED)
    assert missed.duration is None  # never started
