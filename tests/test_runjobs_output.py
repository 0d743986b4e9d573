"""What `runjobs` says on stderr out of the box, in a project that configures no LOGGING:
what it starts and how each run ends, which jobs are registered and when each first runs,
Django's -v/--verbosity to quieten or widen it; a project's own LOGGING used instead,
never both. And `runjobs --now NAME`: one run now, through the lease, recorded like any
other, or one line and exit 1 when it cannot start."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest

from tests import test_runjobs_command as command

REPO = Path(__file__).resolve().parent.parent
JOBS = {"console.fine", "console.flaky", "console.slow", "console.berlin"}
#: A slot as the terminal lines show it.
SLOT = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
#: A wait as the terminal lines show it: a timedelta to the second.
WAIT = r"(\d+ days?, )?\d+:\d\d:\d\d"

pytestmark = pytest.mark.django_db(transaction=True)


def runjobs(
    env: dict[str, str],
    *args: str,
    logging: str = "none",
    app: str = "console",
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``runjobs`` in a subprocess; ``logging="none"``: no LOGGING setting, as in a project
    just made with ``django-admin startproject``."""
    return command.runjobs(env, *args, app=app, timeout=timeout, FENCEDJOBS_CHECK_LOGGING=logging)


def make_due(*names: str) -> None:
    """Move each job's next slot one slot back (a year: the console jobs fire yearly), so
    that the next pass runs exactly that slot."""
    from django_fencedjobs.models import JobLease

    for row in JobLease.objects.filter(name__in=names):
        JobLease.objects.filter(pk=row.pk).update(
            next_run_at=row.next_run_at.replace(year=row.next_run_at.year - 1)
        )


def by_job(lines: list[str]) -> dict[str, list[str]]:
    """Each line must name its job first: ``<job>: ...``."""
    found: dict[str, list[str]] = {}
    for line in lines:
        match = re.match(r"(console\.\w+): ", line)
        assert match, f"a line that does not name its job: {line!r}"
        found.setdefault(match.group(1), []).append(line)
    return found


def registered_line(name: str) -> str:
    from django_fencedjobs.models import JobLease

    first = JobLease.objects.get(name=name).next_run_at
    when = f"{first:%Y-%m-%d %H:%M:%S} UTC"
    return rf"{re.escape(name)}: registered, first run at {when} \(in {WAIT}\)"


# -- the first pass --------------------------------------------------------------------------


def test_the_first_pass_says_which_jobs_are_registered_and_when_each_first_runs(child_env):
    from django_fencedjobs.models import JobLease

    result = runjobs(child_env, "--once")
    assert result.returncode == 0, result.stderr
    lines = by_job(result.stderr.splitlines())
    assert set(lines) == JOBS, result.stderr
    for name in JOBS - {"console.berlin"}:
        (line,) = lines[name]
        assert re.fullmatch(registered_line(name), line), line
    # In the job's own zone, and in UTC.
    first = JobLease.objects.get(name="console.berlin").next_run_at
    (line,) = lines["console.berlin"]
    assert re.fullmatch(
        rf"console\.berlin: registered, first run at 20\d\d-01-01 03:07:00 CET \(Europe/Berlin\)"
        rf" = {first:%Y-%m-%d %H:%M:%S} UTC \(in {WAIT}\)",
        line,
    ), line


# -- how each run ends -----------------------------------------------------------------------


def test_once_says_what_it_starts_and_how_each_run_ends_one_line_each_naming_its_job(child_env):
    runjobs(child_env, "--once")
    make_due("console.fine", "console.flaky")
    result = runjobs(child_env, "--once", "--workers", "2")
    assert result.returncode == 0, result.stderr
    lines = by_job(result.stderr.splitlines())
    assert re.fullmatch(rf"console\.fine: started \(slot {SLOT}\)", lines["console.fine"][0])
    assert re.fullmatch(
        rf"console\.fine: succeeded in \d+\.\d\d\ds \(slot {SLOT}; 2 items, 0 batches\)",
        lines["console.fine"][1],
    ), lines["console.fine"]
    assert re.fullmatch(rf"console\.flaky: started \(slot {SLOT}\)", lines["console.flaky"][0])
    # A failure says why: the exception's last line.
    assert re.fullmatch(
        rf"console\.flaky: failed in \d+\.\d\d\ds \(slot {SLOT}; 0 items, 0 batches\): "
        r"RuntimeError: upstream said no",
        lines["console.flaky"][1],
    ), lines["console.flaky"]
    assert len(lines["console.fine"]) == len(lines["console.flaky"]) == 2
    # The jobs that did not run yet still say when they first run.
    assert [len(lines[name]) for name in ("console.slow", "console.berlin")] == [1, 1]


def test_verbosity_0_shows_errors_only(child_env):
    runjobs(child_env, "--once")
    make_due("console.fine", "console.flaky")
    result = runjobs(child_env, "--once", "-v", "0")
    assert result.returncode == 0, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("console.flaky: failed in ")
    assert line.endswith("RuntimeError: upstream said no")


def test_verbosity_2_also_reports_each_pass_and_each_job_passed_over(child_env):
    from django_fencedjobs import clock
    from django_fencedjobs.models import JobLease

    runjobs(child_env, "--once")
    make_due("console.fine")
    JobLease.objects.filter(name="console.flaky").update(paused=True)
    # console.slow is due, but another runner holds its lease.
    make_due("console.slow")
    JobLease.objects.filter(name="console.slow").update(
        owner="elsewhere:1", lease_until=clock.system_now() + timedelta(minutes=5)
    )
    result = runjobs(child_env, "--once", "-v", "2")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    passes = [line for line in lines if line.startswith("pass done")]
    assert len(passes) == 1, result.stderr
    assert re.fullmatch(rf"pass done; next run: console\.\w+ at {SLOT} \(in {WAIT}\)", passes[0]), (
        passes[0]
    )
    rest = by_job([line for line in lines if line not in passes])
    assert "console.fine: started" in rest["console.fine"][0]
    assert any("paused" in line for line in rest["console.flaky"]), rest
    assert any(
        re.fullmatch(
            rf"console\.slow: due, but its lease is held by elsewhere:1 until {SLOT}; passed over",
            line,
        )
        for line in rest["console.slow"]
    ), rest["console.slow"]


def test_a_timeout_names_its_job(child_env):
    result = runjobs(child_env, "--now", "console.slow")
    assert result.returncode == 5, result.stderr
    lines = result.stderr.splitlines()
    assert any(re.search(r"console\.slow.* timed out after 0:00:01", line) for line in lines)
    assert any(
        re.match(rf"console\.slow: timed_out in \d+\.\d\d\ds \(slot {SLOT}; ", line)
        for line in lines
    ), lines
    assert "Traceback" not in result.stderr


# -- a project's own LOGGING -----------------------------------------------------------------


@pytest.mark.parametrize("logging", ["handler", "root"])
def test_a_projects_own_logging_is_used_instead_never_both(child_env, logging):
    runjobs(child_env, "--once", logging=logging)
    make_due("console.fine")
    result = runjobs(child_env, "--once", logging=logging)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert not [line for line in lines if line.startswith("console.")], result.stderr
    ours = [line for line in lines if "console.fine" in line]
    assert [line.split(":")[0] for line in ours if "run " in line] == [
        "MINE INFO run started",
        "MINE INFO run finished",
    ], result.stderr


# -- the loop --------------------------------------------------------------------------------


def test_the_loop_says_it_started_and_announces_each_job_once(child_env):
    from django_fencedjobs.models import JobLease, JobRun

    loop = command.start(
        child_env,
        "runjobs",
        "--workers",
        "2",
        app="console",
        FENCEDJOBS_CHECK_LOGGING="none",
        FENCEDJOBS_CHECK_SETTINGS='{"LOOP_MAX_SLEEP": timedelta(seconds=0.2)}',
    )
    try:
        deadline = time.monotonic() + 60
        made_due = False
        while loop.poll() is None and time.monotonic() < deadline:
            if JobRun.objects.filter(job="console.fine", outcome="succeeded").exists():
                break
            if not made_due and JobLease.objects.filter(name="console.fine").exists():
                make_due("console.fine")
                made_due = True
            time.sleep(0.2)
        time.sleep(0.5)  # a few more passes: nothing is announced twice
    finally:
        loop.send_signal(signal.SIGTERM)
        _, stderr = loop.communicate(timeout=30)
    assert loop.returncode == 0, stderr
    lines = stderr.splitlines()
    assert re.fullmatch(
        r"running 4 jobs on up to 2 workers; stop with Ctrl-C or SIGTERM", lines[0]
    ), stderr
    lines = [line for line in lines[1:] if not line.startswith("received SIGTERM")]
    jobs = by_job(lines)
    for name in ("console.flaky", "console.slow", "console.berlin"):
        assert len(jobs[name]) == 1, stderr
        assert jobs[name][0].startswith(f"{name}: registered, first run at ")
    assert [line.split(" (")[0].split(" in ")[0] for line in jobs["console.fine"]][-2:] == [
        "console.fine: started",
        "console.fine: succeeded",
    ], stderr


# -- runjobs --now NAME ----------------------------------------------------------------------


def test_now_runs_the_job_through_its_lease_and_records_it(child_env):
    from django_fencedjobs.lease import FENCE_EPOCH
    from django_fencedjobs.models import JobLease, JobRun

    result = runjobs(child_env, "--now", "console.fine")
    assert result.returncode == 0, result.stderr
    (run,) = JobRun.objects.filter(job="console.fine")
    first = JobLease.objects.get(name="console.fine").id * FENCE_EPOCH + 1
    assert (run.outcome, run.items, run.fence) == ("succeeded", 2, first)
    lines = by_job(result.stderr.splitlines())["console.fine"]
    assert re.fullmatch(rf"console\.fine: started \(slot {SLOT}\)", lines[0])
    assert lines[1].startswith("console.fine: succeeded in ")
    assert len(lines) == 2, lines
    lease = JobLease.objects.get(name="console.fine")
    assert lease.next_run_at > run.scheduled_for, "the job's schedule goes on as before"
    assert result.stdout == ""


def test_now_exits_5_when_the_run_does_not_succeed(child_env):
    from django_fencedjobs.models import JobRun

    result = runjobs(child_env, "--now", "console.flaky")
    assert result.returncode == 5, result.stderr
    assert JobRun.objects.get(job="console.flaky").outcome == "failed"
    assert result.stderr.splitlines()[-1] == (
        "CommandError: the run of console.flaky failed: RuntimeError: upstream said no"
    )


def test_now_with_an_unknown_job_is_one_line_and_exit_1(child_env):
    result = runjobs(child_env, "--now", "console.nope")
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith("CommandError: no job named 'console.nope' is registered (known: ")


def test_now_with_an_invalid_job_is_one_line_and_exit_1(child_env):
    result = runjobs(child_env, "--now", "mixed.bad_cron", app="mixed")
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith("CommandError: job 'mixed.bad_cron' is invalid and does not run")


def test_now_with_a_held_lease_is_one_line_and_exit_1_and_changes_nothing(child_env):
    from django_fencedjobs import clock
    from django_fencedjobs.models import JobLease, JobRun

    runjobs(child_env, "--once")
    JobLease.objects.filter(name="console.fine").update(
        owner="elsewhere:1", lease_until=clock.system_now() + timedelta(minutes=5)
    )
    before = JobLease.objects.get(name="console.fine")
    result = runjobs(child_env, "--now", "console.fine")
    assert result.returncode == 1, result.stderr
    (line,) = result.stderr.splitlines()
    assert re.fullmatch(
        rf"CommandError: job 'console\.fine' is running elsewhere: its lease is held by "
        rf"elsewhere:1 until {SLOT}",
        line,
    ), line
    after = JobLease.objects.get(name="console.fine")
    assert (after.fence, after.next_run_at) == (before.fence, before.next_run_at)
    assert not JobRun.objects.filter(job="console.fine").exists()


def test_now_with_a_paused_job_is_one_line_and_exit_1(child_env):
    from django_fencedjobs.models import JobLease, JobRun

    runjobs(child_env, "--once")
    JobLease.objects.filter(name="console.fine").update(paused=True)
    result = runjobs(child_env, "--now", "console.fine")
    assert result.returncode == 1, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("CommandError: job 'console.fine' is paused")
    assert not JobRun.objects.filter(job="console.fine").exists()


def test_now_and_once_together_are_a_usage_error(child_env):
    result = runjobs(child_env, "--now", "console.fine", "--once")
    assert result.returncode == 2
    assert "not allowed with argument" in result.stderr
