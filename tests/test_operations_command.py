"""Operating a job from the command line: `manage.py jobctl pause|resume|skip NAME`, one line
each, with the admin's bounded wait for the job's lease row; a busy row is its own line and
exit status. And what `runjobs --now` says and returns around it: the paused job names the
command that resumes it, and a run a signal stopped exits 5 (it did not succeed)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.db import connections

from django_fencedjobs import clock, db, operations
from django_fencedjobs.lease import FENCE_EPOCH
from django_fencedjobs.schedule import Schedule
from tests.test_runjobs_command import REPO, check_env, closed_port, runjobs, start

pytestmark = pytest.mark.django_db(transaction=True)

#: jobctl's exit status for a busy lease row (docs/running.md): EX_TEMPFAIL, "try again".
BUSY = 75
NIGHTLY = "ops.nightly"
BERLIN_NIGHTLY = Schedule("0 3 * * *", timezone="Europe/Berlin")
#: An instant as jobctl writes one of a job in Europe/Berlin.
BERLIN = r"\d{4}-\d\d-\d\d 03:00:00 CES?T \(Europe/Berlin\) = \d{4}-\d\d-\d\d 0[12]:00:00 UTC"
WAIT = r"(\d+ days?, )?\d+:\d\d:\d\d"


def jobctl(
    env: dict[str, str], *args: str, app: str = "operations", **more: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", "jobctl", *args],
        cwd=REPO,
        env=check_env(env, app, **more),
        capture_output=True,
        text=True,
        timeout=120,
    )


def row(name: str = NIGHTLY):
    from django_fencedjobs.models import JobLease

    return JobLease.objects.get(name=name)


class RowLock:
    """Another session holding a job's lease row as a run inside a fenced transaction does:
    the row locked FOR UPDATE on PostgreSQL, SQLite's write lock on SQLite."""

    def __init__(self, name: str) -> None:
        self.connection = connections.create_connection("default")
        self.connection.set_autocommit(False)
        with self.connection.cursor() as cursor:
            if self.connection.vendor == "postgresql":
                cursor.execute(
                    "SELECT 1 FROM fencedjobs_joblease WHERE name = %s FOR UPDATE", [name]
                )
            else:
                cursor.execute(
                    "UPDATE fencedjobs_joblease SET fence = fence WHERE name = %s", [name]
                )

    def __enter__(self) -> RowLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.connection.rollback()
        self.connection.close()


# -- pause, resume, skip ---------------------------------------------------------------------


def test_pause_then_resume_from_the_command_line_one_line_each(child_env):
    paused = jobctl(child_env, "pause", NIGHTLY)
    assert (paused.returncode, paused.stderr) == (0, ""), paused.stderr
    assert paused.stdout == f"paused {NIGHTLY}: no run starts until it is resumed\n"
    assert row().paused

    again = jobctl(child_env, "pause", NIGHTLY)
    assert (again.returncode, again.stderr) == (0, ""), again.stderr
    assert again.stdout == f"{NIGHTLY} is already paused: nothing changed\n"

    resumed = jobctl(child_env, "resume", NIGHTLY)
    assert (resumed.returncode, resumed.stderr) == (0, ""), resumed.stderr
    (line,) = resumed.stdout.splitlines()
    assert re.fullmatch(rf"resumed ops\.nightly: next run {BERLIN} \(in {WAIT}\)", line), line
    assert not row().paused

    again = jobctl(child_env, "resume", NIGHTLY)
    assert (again.returncode, again.stdout) == (0, f"{NIGHTLY} is not paused: nothing changed\n")


def test_skip_moves_the_next_slot_to_the_one_after_it(child_env):
    jobctl(child_env, "pause", NIGHTLY)  # creates the job's row; its slot is tomorrow's
    before = row().next_run_at
    result = jobctl(child_env, "skip", NIGHTLY)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    (line,) = result.stdout.splitlines()
    assert re.fullmatch(
        rf"skipped the slot {BERLIN} of ops\.nightly: next run {BERLIN} \(in {WAIT}\); it is "
        r"paused: it runs then only if resumed",
        line,
    ), line
    assert row().next_run_at == BERLIN_NIGHTLY.next_after(before)
    assert row().fence == row().id * FENCE_EPOCH, "nothing ran"


def test_skip_of_a_due_job_moves_its_next_slot_past_now(child_env):
    from django_fencedjobs.models import JobRun

    jobctl(child_env, "pause", "ops.frequent")
    due_since = clock.now() - timedelta(hours=3)
    row("ops.frequent").__class__.objects.filter(name="ops.frequent").update(
        next_run_at=due_since, paused=False
    )
    result = jobctl(child_env, "skip", "ops.frequent")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("skipped the run due since ")
    assert clock.now() < row("ops.frequent").next_run_at <= clock.now() + timedelta(minutes=5)
    once = runjobs(child_env, "--once", "--job", "ops.frequent", app="operations")
    assert once.returncode == 0, once.stderr
    (skipped,) = JobRun.objects.all()  # the skipped run does not run: it is recorded skipped
    assert (skipped.outcome, skipped.owner[:6]) == ("skipped", "jobctl")
    assert skipped.scheduled_for <= clock.now() < skipped.scheduled_for + timedelta(minutes=5)


@pytest.mark.parametrize("operation", ["pause", "resume", "skip"])
def test_a_busy_row_is_one_line_and_exit_75_and_changes_nothing(child_env, operation):
    jobctl(child_env, "pause", NIGHTLY)
    if operation == "pause":
        jobctl(child_env, "resume", NIGHTLY)
    before = row()
    with RowLock(NIGHTLY):
        result = jobctl(child_env, operation, NIGHTLY)
    assert result.returncode == BUSY, result.stdout + result.stderr
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"CommandError: job {NIGHTLY!r} is busy: a run is inside a fenced transaction on its "
        f"lease row, which stayed locked for {db.LOCK_WAIT:g}s; nothing changed, try again"
    ]
    after = row()
    assert (after.paused, after.next_run_at) == (before.paused, before.next_run_at)


def test_an_unknown_job_is_one_line_and_exit_1(child_env):
    result = jobctl(child_env, "pause", "ops.nope")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "CommandError: no job named 'ops.nope' is registered (known: ops.frequent, "
        "ops.nightly, ops.windowed)"
    ]


def test_an_invalid_job_is_one_line_and_exit_1(child_env):
    result = jobctl(child_env, "skip", "mixed.bad_cron", app="mixed")
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith("CommandError: job 'mixed.bad_cron' is invalid and does not run")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["stop", NIGHTLY], "invalid choice: 'stop'"),
        (["pause"], "the following arguments are required: NAME"),
        (["pause", NIGHTLY, "extra"], "unrecognized arguments: extra"),
    ],
)
def test_bad_arguments_are_a_usage_error_exit_2(child_env, args, words):
    result = jobctl(child_env, *args)
    assert result.returncode == 2
    assert words in result.stderr.splitlines()[-1], result.stderr
    assert "Traceback" not in result.stderr


def test_an_unreachable_database_is_one_line_and_exit_3(child_env):
    env = {
        **child_env,
        "FENCEDJOBS_TEST_DB": "postgres",
        "DATABASE_URL": f"postgres://nobody@127.0.0.1:{closed_port()}/nowhere",
    }
    result = jobctl(env, "pause", NIGHTLY)
    assert result.returncode == 3
    (line,) = result.stderr.splitlines()
    assert line.startswith("CommandError: database unavailable: ")


# -- the lease functions under the command and the admin -------------------------------------


def test_the_lease_changes_tell_done_unchanged_and_busy_apart(child_env):
    jobctl(child_env, "pause", NIGHTLY)
    now = clock.now()
    assert operations.set_paused(NIGHTLY, True) is operations.Change.UNCHANGED
    with RowLock(NIGHTLY):
        assert operations.make_due(NIGHTLY, now) is operations.Change.BUSY
        assert operations.set_paused(NIGHTLY, False) is operations.Change.BUSY
    assert operations.make_due(NIGHTLY, now) is operations.Change.DONE
    assert operations.make_due(NIGHTLY, now) is operations.Change.UNCHANGED  # already due
    assert operations.set_paused(NIGHTLY, False) is operations.Change.DONE
    assert [bool(change) for change in operations.Change] == [True, False, False]


# -- runjobs --now around it ----------------------------------------------------------------


def test_now_on_a_paused_job_names_the_command_that_resumes_it(child_env):
    jobctl(child_env, "pause", NIGHTLY)
    refused = runjobs(child_env, "--now", NIGHTLY, app="operations")
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [
        f"CommandError: job {NIGHTLY!r} is paused: resume it (`manage.py jobctl resume "
        f"{NIGHTLY}`, or in the admin) to run it"
    ]
    jobctl(child_env, "resume", NIGHTLY)
    ran = runjobs(child_env, "--now", NIGHTLY, app="operations")
    assert ran.returncode == 0, ran.stderr


def test_now_exits_5_when_a_signal_stops_the_run(child_env, tmp_path):
    """docs/running.md and the quickstart: `--now` exits 0 only when the run succeeded. A
    SIGTERM stops the run after its current window; it is recorded interrupted, and that is
    not a success: exit 5, one line."""
    from django_fencedjobs.models import JobRun

    marker = tmp_path / "first-window-committed"
    now = start(
        child_env,
        "runjobs",
        "--now",
        "ops.windowed",
        app="operations",
        FENCEDJOBS_CHECK_LOGGING="none",
        FENCEDJOBS_TEST_MARKER=str(marker),
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert now.poll() is None, now.communicate()
            assert time.monotonic() < deadline, "the run did not start"
            time.sleep(0.05)
        now.send_signal(signal.SIGTERM)
        _, stderr = now.communicate(timeout=60)
    finally:
        if now.poll() is None:
            now.kill()
            now.communicate()
    run = JobRun.objects.get(job="ops.windowed")
    assert run.outcome == "interrupted"
    assert 1 <= run.items < 600
    assert now.returncode == 5, stderr
    assert stderr.splitlines()[-1] == (
        "CommandError: the run of ops.windowed was interrupted by a signal: it stopped after "
        "its current batch, recorded; the next run goes on from there"
    )
