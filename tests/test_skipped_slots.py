"""Every slot accounted for: a slot an operator skips (``jobctl skip``, twice, while a run is
in progress or while the job is paused; a pending retry; ``resume --from-now``) is
recorded as skipped, naming who skipped it, and the timeline draws it as skipped. In one
process on the fake clock, on every database."""

from __future__ import annotations

import getpass
import re
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from django_fencedjobs import job, loop, manual
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.fencing import fenced_atomic
from django_fencedjobs.health import State, job_health
from django_fencedjobs.models import JobLease, JobRun, Outcome
from django_fencedjobs.registry import registry

pytestmark = pytest.mark.django_db(transaction=True)

NAME = "t.skipped"
#: How many times the handler of the run in progress skips the job's next slot.
SKIPS_WHILE_RUNNING: list[int] = []


def _h(hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 11, 29, hour, minute, tzinfo=UTC)


def _hourly(**options: object) -> None:
    SKIPS_WHILE_RUNNING.clear()

    @job("0 * * * *", name=NAME, **options)
    def skipped(run):
        for _ in range(SKIPS_WHILE_RUNNING.pop() if SKIPS_WHILE_RUNNING else 0):
            manual.skip_next_slot(registry.get(NAME))
        if options.get("retries"):
            raise RuntimeError("fails, to be retried")
        with fenced_atomic():
            pass


def _runs() -> list[tuple[datetime, int, str, int, str]]:
    """Each run of the job: slot, attempt, outcome, slots it counts, and who skipped it (a
    skipped run's owner; "" for a run that ran)."""
    return [
        (slot, attempt, outcome, missed, owner if outcome == Outcome.SKIPPED else "")
        for slot, attempt, outcome, missed, owner in JobRun.objects.filter(job=NAME)
        .order_by("scheduled_for", "attempt")
        .values_list("scheduled_for", "attempt", "outcome", "missed_slots", "owner")
    ]


def _unaccounted(since: datetime) -> list[str]:
    """Slots of the schedule from ``since`` to the last recorded one that no record
    accounts for: each slot's first attempt counts itself and the ``missed_slots`` before
    it, and every fire time is counted exactly once."""
    schedule = registry.get(NAME).valid_schedule
    first_attempts = {slot: missed for slot, attempt, _, missed, _ in _runs() if attempt == 1}
    wrong, previous = [], since
    for slot, missed in sorted(first_attempts.items()):
        fired = schedule.fire_times(previous, slot)
        if len(fired) != missed + 1:
            wrong.append(f"({previous}, {slot}]: {len(fired)} fire times, {missed + 1} counted")
        previous = slot
    return wrong


def test_a_slot_skipped_twice_while_a_run_is_in_progress_is_recorded_skipped_each_time(jobs):
    _hourly()
    loop.tick()  # its row, next slot 10:00
    fake_clock.set(_h(10, 0) + timedelta(seconds=30))
    SKIPS_WHILE_RUNNING.append(2)  # the run of 10:00 skips 11:00, then 12:00
    assert len(loop.tick().runs) == 1
    assert JobLease.objects.get(name=NAME).next_run_at == _h(13)
    fake_clock.set(_h(13) + timedelta(seconds=30))
    loop.tick()
    assert _runs() == [
        (_h(10), 1, Outcome.SUCCEEDED, 0, ""),
        (_h(11), 1, Outcome.SKIPPED, 0, "jobctl"),
        (_h(12), 1, Outcome.SKIPPED, 0, "jobctl"),
        (_h(13), 1, Outcome.SUCCEEDED, 0, ""),
    ]
    assert _unaccounted(_h(9)) == []


def test_slots_due_while_paused_that_jobctl_skips_are_recorded_skipped_then_resume(jobs):
    _hourly()
    loop.tick()  # its row, next slot 10:00
    call_command("jobctl", "pause", NAME, stdout=StringIO())
    fake_clock.set(_h(12, 30))  # 10:00, 11:00 and 12:00 fall due while paused
    call_command("jobctl", "skip", NAME, stdout=StringIO())
    call_command("jobctl", "resume", NAME, stdout=StringIO())
    assert loop.tick().runs == []
    fake_clock.set(_h(13) + timedelta(seconds=30))
    loop.tick()
    operator = f"jobctl ({getpass.getuser()})"
    assert _runs() == [
        (_h(12), 1, Outcome.SKIPPED, 2, operator),  # and the two slots before it
        (_h(13), 1, Outcome.SUCCEEDED, 0, ""),
    ]
    skipped = JobRun.objects.get(job=NAME, outcome=Outcome.SKIPPED)
    assert skipped.error == f"skipped by {operator}: its next run was skipped (3 slot(s))"
    assert _unaccounted(_h(9)) == []


def test_a_pending_retry_that_is_skipped_is_recorded_as_its_attempt_skipped(jobs):
    _hourly(retries=1, retry_backoff=timedelta(minutes=10))
    loop.tick()
    fake_clock.set(_h(10) + timedelta(seconds=30))
    loop.tick()  # attempt 1 of 10:00 fails; attempt 2 is due at 10:10
    assert JobLease.objects.get(name=NAME).run_slot == _h(10)
    manual.skip_next_slot(registry.get(NAME), by="ops")
    row = JobLease.objects.get(name=NAME)
    assert (row.next_run_at, row.run_slot, row.attempt) == (_h(11), None, 1)
    assert _runs()[1:] == [(_h(10), 2, Outcome.SKIPPED, 0, "ops")]
    fake_clock.set(_h(10, 15))
    assert loop.tick().runs == []  # the retry does not run
    assert _unaccounted(_h(9)) == []


def test_a_slot_skipped_during_a_run_whose_retry_a_later_slot_drops_is_counted_once(jobs):
    """The 10:00 run skips the 11:00 slot, then fails: its retry is due at 10:10, before the
    row's next slot (12:00, after the skip). The runners are down until 12:01, so the 12:00
    slot drops the retry; it must not count 11:00 again, which the skip recorded (found by
    the soak's A1, seed 443178 behind PgBouncer)."""
    _hourly(retries=1, retry_backoff=timedelta(minutes=10))
    loop.tick()
    SKIPS_WHILE_RUNNING.append(1)
    fake_clock.set(_h(10) + timedelta(seconds=30))
    loop.tick()
    assert JobLease.objects.get(name=NAME).run_slot == _h(10)  # the retry is pending
    fake_clock.set(_h(12, 1))
    loop.tick()
    assert [(slot, attempt, outcome, missed) for slot, attempt, outcome, missed, _ in _runs()] == [
        (_h(10), 1, Outcome.FAILED, 0),
        (_h(11), 1, Outcome.SKIPPED, 0),
        (_h(12), 1, Outcome.FAILED, 0),
    ]
    assert _unaccounted(_h(9)) == []


def test_resume_from_now_records_the_slots_due_while_paused_as_skipped(jobs):
    _hourly()
    loop.tick()
    manual.pause(registry.get(NAME))
    fake_clock.set(_h(12, 30))
    manual.resume(registry.get(NAME), from_now=True, by="ops")
    assert _runs() == [(_h(12), 1, Outcome.SKIPPED, 2, "ops")]
    assert JobLease.objects.get(name=NAME).next_run_at == _h(13)


def test_the_timeline_draws_skipped_slots_as_skipped_naming_who(jobs):
    _hourly()
    loop.tick()
    fake_clock.set(_h(10) + timedelta(seconds=30))
    loop.tick()  # 10:00 runs
    manual.pause(registry.get(NAME))
    fake_clock.set(_h(12, 30))  # 11:00 and 12:00 fall due while paused
    manual.skip_next_slot(registry.get(NAME), by="admin (ops)")
    manual.resume(registry.get(NAME))
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    page = reverse("admin:fencedjobs_joblease_change", args=[JobLease.objects.get(name=NAME).pk])
    html = client.get(page).content.decode()
    marks = re.findall(
        r'<rect class="fj-slot fj-slot-(\w+)[^"]*" data-at="[^"]*T(\d\d:\d\d)[^"]*"[^>]*>'
        r"<title>([^<]*)</title>",
        html,
    )
    drawn = {at: (kind, title.split(": ", 1)[1]) for kind, at, title in marks}
    assert drawn["10:00"][0] == "succeeded"
    assert drawn["11:00"] == ("skipped", "did not run; skipped by admin (ops)")
    assert drawn["12:00"] == ("skipped", "did not run; skipped by admin (ops) with 1 earlier slot")
    assert drawn["13:00"][0] == "upcoming"
    assert "2 skipped by an operator" in html  # the aria label


@pytest.mark.parametrize("of", ["job", "instance"])
def test_a_skipped_slot_is_not_awaited_health_waits_for_the_next_one(jobs, of):
    # Success at 10:00; an operator skips 11:00, the slot the dead man's switch awaited.
    # Past 11:00's deadline the job is not late: it waits for 12:00, and is late past
    # 12:00's deadline if that slot does not succeed either.
    def hourly(run):
        pass

    if of == "job":
        name = NAME
        job("0 * * * *", name=name)(hourly)
    else:
        name = f"{NAME}[a]"
        job(instances=True, name=NAME)(hourly).instances.upsert("a", cron="0 * * * *")
    loop.tick()  # its row, next slot 10:00
    fake_clock.set(_h(10) + timedelta(seconds=30))
    assert [r.outcome for r in loop.tick().runs] == [Outcome.SUCCEEDED]
    due_11 = job_health(name, now=_h(10, 30)).expected_by  # 11:00's deadline
    assert job_health(name, now=due_11 + timedelta(minutes=1)).state == State.LATE  # unskipped
    call_command("jobctl", "skip", name, stdout=StringIO())
    assert JobLease.objects.get(name=name).next_run_at == _h(12)
    health = job_health(name, now=due_11 + timedelta(minutes=1))
    assert health.state == State.OK, health.reason
    assert health.awaited_slot == _h(12)
    assert health.expected_by == due_11 + timedelta(hours=1)
    late = job_health(name, now=health.expected_by + timedelta(seconds=1))
    assert late.state == State.LATE, late.reason
