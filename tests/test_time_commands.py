"""``manage.py backfill`` and ``manage.py runonce``: what they print, the errors they refuse
bad input with (one line, a non-zero exit), and that nothing is queued unless they succeed.
In process on the fake clock (call_command), and from a shell for the exit statuses.
The work itself is tested in tests/test_time_operations.py."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_fencedjobs import backfills, job
from django_fencedjobs.instants import parse_instant
from django_fencedjobs.models import Backfill, JobInstance, JobLease, JobRun, Outcome, RunKind
from tests.test_runjobs_command import REPO, check_env

pytestmark = pytest.mark.django_db(transaction=True)

#: The ``jobs`` fixture's fake clock: 2026-11-29 09:00 UTC (10:00 in Berlin).
NOW = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)


def _h(hour: int) -> datetime:
    return datetime(2026, 11, 29, hour, 0, tzinfo=UTC)


def _at(hour: int) -> str:
    return _h(hour).isoformat()


def _berlin(hour: int) -> str:
    """Slot ``hour`` UTC as the commands write a Europe/Berlin job's instant."""
    return f"2026-11-29 {hour + 1:02d}:00:00 CET (Europe/Berlin) = 2026-11-29 {hour:02d}:00:00 UTC"


@pytest.fixture
def hourly(jobs):
    """t.hourly, hourly in Berlin: its 06:00 UTC slot succeeded, its 07:00 one failed; 05:00
    and 08:00 have no run."""

    @job("0 * * * *", name="t.hourly", timezone="Europe/Berlin")
    def hourly(run, fmt: str = "pdf"):
        pass

    for hour, outcome in ((6, Outcome.SUCCEEDED), (7, Outcome.FAILED)):
        JobRun.objects.create(job="t.hourly", scheduled_for=_h(hour), outcome=outcome)
    return hourly


def run(command: str, *args: str) -> list[str]:
    out = StringIO()
    call_command(command, *args, stdout=out)
    return out.getvalue().splitlines()


def queued_nothing() -> bool:
    return (
        not Backfill.objects.exists()
        and not JobLease.objects.exclude(kind=RunKind.SCHEDULED).exists()
    )


# -- backfill -----------------------------------------------------------------------------------


def test_a_dry_run_prints_each_slot_it_would_queue_or_leave_then_a_summary_and_queues_nothing(
    hourly,
):
    lines = run("backfill", "t.hourly", "--from", _at(5), "--to", _at(9), "--dry-run")
    assert lines == [
        f"queue {_berlin(5)}  attempt 1, no run yet",
        f"leave {_berlin(6)}  has a run (succeeded)",
        f"leave {_berlin(7)}  has a run (failed)",
        f"queue {_berlin(8)}  attempt 1, no run yet",
        "Dry run: would queue 2 slots of t.hourly from 2026-11-29 06:00:00 Europe/Berlin to "
        "10:00:00 (missing slots, 1 at once, oldest first), leave 2; nothing queued.",
    ]
    assert queued_nothing()


def test_a_dry_run_of_failed_slots_newest_first_lists_them_in_that_order_with_their_attempt(
    hourly,
):
    lines = run(
        "backfill", "t.hourly", "--from", _at(5), "--to", _at(9), "--slots", "failed",
        "--newest-first", "--at-once", "2", "--dry-run",
    )  # fmt: skip
    assert lines == [
        f"leave {_berlin(8)}  has no run",
        f"queue {_berlin(7)}  attempt 2, last failed",
        f"leave {_berlin(6)}  succeeded",
        f"leave {_berlin(5)}  has no run",
        "Dry run: would queue 1 slot of t.hourly from 2026-11-29 06:00:00 Europe/Berlin to "
        "10:00:00 (failed slots, 2 at once, newest first), leave 3; nothing queued.",
    ]
    assert queued_nothing()


def test_a_backfill_queues_its_slots_and_prints_its_id_and_count(hourly):
    (line,) = run("backfill", "t.hourly", "--from", _at(5), "--to", _at(9), "--at-once", "3")
    made = Backfill.objects.get()
    assert line == (
        f"Backfill {made.pk}: queued 2 slots of t.hourly from 2026-11-29 06:00:00 "
        "Europe/Berlin to 10:00:00 (missing slots, 3 at once, oldest first), left 2."
    )
    assert (made.job, made.slots, made.concurrency, made.selection) == ("t.hourly", 2, 3, "missing")
    assert "manage.py backfill" in made.requested_by
    rows = JobLease.objects.filter(backfill=made).order_by("run_slot")
    assert [(r.run_slot, r.kind, r.attempt) for r in rows] == [
        (_h(5), RunKind.BACKFILL, 1),
        (_h(8), RunKind.BACKFILL, 1),
    ]


def test_a_backfill_with_nothing_selected_says_so_and_makes_no_backfill(hourly):
    (line,) = run("backfill", "t.hourly", "--from", _at(6), "--to", _at(8))
    assert line == (
        "Nothing to queue: none of the 2 slots of t.hourly from 2026-11-29 07:00:00 "
        "Europe/Berlin to 09:00:00 is selected (missing); --dry-run says why."
    )
    assert queued_nothing()


def test_an_instance_is_backfilled_by_its_name_and_its_job_alone_is_refused(jobs):
    @job(instances=True, name="t.shop")
    def shop(run):
        pass

    JobInstance.objects.create(job="t.shop", key="berlin", cron="0 * * * *")
    lines = run("backfill", "t.shop[berlin]", "--from", _at(7), "--to", _at(9), "--dry-run")
    assert lines[:2] == [
        "queue 2026-11-29 07:00:00 UTC  attempt 1, no run yet",
        "queue 2026-11-29 08:00:00 UTC  attempt 1, no run yet",
    ]
    with pytest.raises(CommandError, match=r"runs as its instances: name one, t\.shop\[key\]"):
        run("backfill", "t.shop", "--from", _at(7), "--to", _at(9))
    assert queued_nothing()


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("t.nope", "--from", _at(5), "--to", _at(9)), "no job named .t.nope. is registered"),
        (("t.hourly", "--from", _at(9), "--to", _at(5)), r"to \(.*\) must be after from"),
        (("t.hourly", "--from", _at(5), "--to", _at(5)), r"to \(.*\) must be after from"),
        (("t.hourly", "--from", _at(5), "--to", _at(10)), "is in the future"),
        (("t.hourly", "--from", "2026-11-29T05:00", "--to", _at(9)), "has no offset"),
        (("t.hourly", "--from", _at(5), "--to", "yesterday"), "is not an ISO 8601 instant"),
        (("t.hourly", "--from", _at(5), "--to", _at(9), "--at-once", "0"), "at least 1"),
        (("t.hourly", "--from", _at(5), "--to", _at(9), "--slots", "some"), "invalid choice"),
    ],
)
def test_bad_input_is_one_line_of_error_and_queues_nothing(hourly, args, error):
    with pytest.raises(CommandError, match=error) as raised:
        run("backfill", *args)
    assert "\n" not in str(raised.value)
    assert queued_nothing()


def test_a_range_of_more_slots_than_a_backfill_takes_is_refused(hourly, monkeypatch):
    monkeypatch.setattr(backfills, "MAX_BACKFILL_SLOTS", 3)
    with pytest.raises(CommandError, match=r"holds more than 3 slots of 't\.hourly'"):
        run("backfill", "t.hourly", "--from", _at(5), "--to", _at(9))
    assert queued_nothing()


# -- runonce ------------------------------------------------------------------------------------


def test_runonce_queues_a_one_off_with_its_arguments_and_says_when_it_runs(hourly):
    (line,) = run("runonce", "t.hourly", "--at", _at(14), "--kwargs", '{"fmt": "csv"}')
    name = f"t.hourly@once:{_at(14)}"
    assert line == f"One-off {name}: runs at {_berlin(14)} (in 5:00:00)."
    row = JobLease.objects.get(name=name)
    assert (row.kind, row.run_slot, row.kwargs, row.parent) == (
        RunKind.ONCE,
        _h(14),
        {"fmt": "csv"},
        "t.hourly",
    )


def test_runonce_now_is_due_at_the_next_tick(hourly):
    (line,) = run("runonce", "t.hourly", "--at", "now")
    assert line == f"One-off t.hourly@once:{_at(9)}: runs at {_berlin(9)} (at the next tick)."
    assert JobLease.objects.get(kind=RunKind.ONCE).next_run_at == NOW


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("t.hourly", "--at", "now", "--kwargs", "{fmt: csv}"), "not JSON"),
        (("t.hourly", "--at", "now", "--kwargs", '["csv"]'), "expected a JSON object"),
        (("t.hourly", "--at", "now", "--kwargs", '{"size": 3}'), "cannot take these arguments"),
        (("t.hourly", "--at", "2026-11-29 14:00"), "has no offset"),
        (("t.nope", "--at", "now"), "no job named .t.nope. is registered"),
    ],
)
def test_runonce_refuses_bad_input_in_one_line_and_queues_nothing(hourly, args, error):
    with pytest.raises(CommandError, match=error) as raised:
        run("runonce", *args)
    assert "\n" not in str(raised.value)
    assert queued_nothing()


def test_a_second_one_off_at_the_same_instant_is_refused(hourly):
    run("runonce", "t.hourly", "--at", _at(14))
    with pytest.raises(CommandError, match="is queued already"):
        run("runonce", "t.hourly", "--at", _at(14))
    assert JobLease.objects.filter(kind=RunKind.ONCE).count() == 1


# -- from a shell: exit statuses ----------------------------------------------------------------


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=REPO,
        env=check_env(env, "operations"),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_from_a_shell_a_dry_run_exits_0_a_refused_backfill_1_and_bad_arguments_2(child_env):
    # ops.nightly: 03:00 in Berlin, every day.
    span = ("--from", "2025-01-01T00:00:00Z", "--to", "2025-01-04T00:00:00Z")
    dry = manage(child_env, "backfill", "ops.nightly", *span, "--dry-run")
    assert (dry.returncode, dry.stderr) == (0, ""), dry.stderr
    assert dry.stdout.splitlines()[0] == (
        "queue 2025-01-01 03:00:00 CET (Europe/Berlin) = 2025-01-01 02:00:00 UTC  attempt 1, "
        "no run yet"
    )
    assert dry.stdout.splitlines()[-1].startswith("Dry run: would queue 3 slots of ops.nightly")

    unknown = manage(child_env, "backfill", "ops.nope", *span)
    assert unknown.returncode == 1
    assert unknown.stderr.startswith("CommandError: no job named 'ops.nope' is registered")
    assert len(unknown.stderr.splitlines()) == 1

    naive = manage(child_env, "backfill", "ops.nightly", "--from", "2025-01-01", "--to", "now")
    assert naive.returncode == 2
    assert "has no offset" in naive.stderr.splitlines()[-1]

    args = manage(child_env, "runonce", "ops.nightly", "--at", "now", "--kwargs", '{"x": 1}')
    assert args.returncode == 1
    assert "cannot take these arguments" in args.stderr
    assert queued_nothing()

    done = manage(child_env, "backfill", "ops.nightly", *span)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    made = Backfill.objects.get()
    assert done.stdout.startswith(f"Backfill {made.pk}: queued 3 slots of ops.nightly")


# -- the instants the commands and the admin take -----------------------------------------------


def test_an_instant_is_iso_8601_with_its_offset_z_for_utc():
    assert parse_instant("2026-11-29T10:00:00+01:00") == _h(9)
    assert parse_instant(" 2026-11-29 09:00Z ") == _h(9)
    assert parse_instant("2026-11-29T09:00:00.5+00:00") == _h(9) + timedelta(milliseconds=500)
    for text, why in (
        ("2026-11-29T09:00", "has no offset"),
        ("2026-11-29", "has no offset"),
        ("9am", "is not an ISO 8601 instant"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_instant(text)
