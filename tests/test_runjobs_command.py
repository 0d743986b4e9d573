"""`manage.py runjobs` from the command line: listing, bad input and an unreachable
database give one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.django_db(transaction=True)


def check_env(env: dict[str, str], app: str, **more: str) -> dict[str, str]:
    """``env`` with tests.check_settings and the check app ``app`` (tests/checkapps)."""
    return {
        **env,
        "DJANGO_SETTINGS_MODULE": "tests.check_settings",
        "FENCEDJOBS_CHECK_APP": app,
        **more,
    }


def start(env: dict[str, str], *argv: str, app: str, **more: str) -> subprocess.Popen[str]:
    """``manage.py <argv>`` started in the background with :func:`check_env`."""
    return subprocess.Popen(
        [sys.executable, "-m", "django", *argv],
        cwd=REPO,
        env=check_env(env, app, **more),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def runjobs(
    env: dict[str, str], *args: str, app: str = "healthy", timeout: float = 120, **more: str
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-m", "django", "runjobs", *args],
            cwd=REPO,
            env=check_env(env, app, **more),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"runjobs {' '.join(args)} was still running after {timeout}s: {exc.stderr}")


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_list_shows_each_job_its_zone_and_next_fire_times_in_local_time_and_utc(child_env):
    result = runjobs(child_env, "--list", "--job", "checks.healthy")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "checks.healthy"
    assert "(Europe/Berlin)" in lines[1]
    fire_times = [line for line in lines if line.strip().startswith("next:")]
    assert len(fire_times) == 3
    assert all("Europe/Berlin" in line and line.endswith("UTC") for line in fire_times)
    assert all(":07:00 " in line for line in fire_times)


def test_list_needs_no_database(child_env):
    env = {**child_env, "DATABASE_URL": f"postgres://nobody@127.0.0.1:{closed_port()}/nowhere"}
    result = runjobs(env, "--list")
    assert result.returncode == 0, result.stderr
    assert "checks.healthy" in result.stdout


def test_an_unknown_job_name_is_one_line_and_exit_1(child_env):
    result = runjobs(child_env, "--once", "--job", "checks.nope")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "CommandError: no job named 'checks.nope' is registered (known: checks.healthy)"
    ]


def test_once_and_list_together_are_a_usage_error(child_env):
    result = runjobs(child_env, "--once", "--list")
    assert result.returncode == 2
    assert "not allowed with argument" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("mode", [["--once"], []], ids=["once", "loop"])
def test_an_unreachable_database_is_one_line_and_exit_3(child_env, mode):
    env = {
        **child_env,
        "FENCEDJOBS_TEST_DB": "postgres",
        "DATABASE_URL": f"postgres://nobody@127.0.0.1:{closed_port()}/nowhere",
    }
    result = runjobs(env, *mode)
    assert result.returncode == 3, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("CommandError: database unavailable: ")
    assert "Traceback" not in result.stderr


def test_once_runs_a_due_job_and_exits_0(child_env):
    from django_fencedjobs.models import JobLease, JobRun

    first = runjobs(child_env, "--once")
    assert first.returncode == 0, first.stderr
    JobLease.objects.filter(name="checks.healthy").update(next_run_at="2000-01-01T00:00Z")
    second = runjobs(child_env, "--once")
    assert second.returncode == 0, second.stderr
    (run,) = JobRun.objects.filter(job="checks.healthy")
    assert run.outcome == "succeeded"


# -- one bad job never stops the good ones (issue 9, item 13) --------------------------------

INVALID = ("mixed.bad_cron", "mixed.bad_timeout", "mixed.async_handler")


def assert_each_invalid_job_is_one_line(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == len(INVALID), stderr
    for name in INVALID:
        (line,) = [line for line in lines if f"job {name!r}" in line]
        assert "is invalid and does not run" in line


def test_once_runs_the_valid_job_and_reports_each_invalid_one_in_one_line(child_env):
    from django_fencedjobs.models import JobLease, JobRun

    first = runjobs(child_env, "--once", app="mixed")
    assert first.returncode == 0, first.stderr
    assert_each_invalid_job_is_one_line(first.stderr)
    assert set(JobLease.objects.values_list("name", flat=True)) == {"mixed.good"}
    JobLease.objects.filter(name="mixed.good").update(next_run_at="2000-01-01T00:00Z")
    second = runjobs(child_env, "--once", app="mixed")
    assert second.returncode == 0, second.stderr
    (run,) = JobRun.objects.all()
    assert (run.job, run.outcome) == ("mixed.good", "succeeded")


def test_the_loop_runs_the_valid_job_and_reports_each_invalid_one_in_one_line(child_env):
    from django_fencedjobs.models import JobLease, JobRun

    loop = start(
        child_env,
        "runjobs",
        app="mixed",
        FENCEDJOBS_CHECK_SETTINGS='{"LOOP_MAX_SLEEP": timedelta(seconds=0.2)}',
    )
    try:
        deadline = time.monotonic() + 60
        while loop.poll() is None and time.monotonic() < deadline:
            if JobRun.objects.filter(job="mixed.good", outcome="succeeded").exists():
                break
            # Once the loop has created the job's lease row, make its slot due now.
            JobLease.objects.filter(name="mixed.good", next_run_at__gt="2001-01-01T00:00Z").update(
                next_run_at="2000-01-01T00:00Z"
            )
            time.sleep(0.2)
    finally:
        loop.send_signal(signal.SIGTERM)
        _, stderr = loop.communicate(timeout=30)
    assert loop.returncode == 0, stderr
    assert JobRun.objects.filter(job="mixed.good", outcome="succeeded").exists(), stderr
    stderr = "\n".join(line for line in stderr.splitlines() if not line.startswith("received "))
    assert_each_invalid_job_is_one_line(stderr)


def test_list_shows_the_valid_job_and_reports_each_invalid_one_in_one_line(child_env):
    result = runjobs(child_env, "--list", app="mixed")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "mixed.good"
    assert "mixed.bad" not in result.stdout
    assert_each_invalid_job_is_one_line(result.stderr)


def test_naming_an_invalid_job_is_one_line_and_exit_1(child_env):
    result = runjobs(child_env, "--once", "--job", "mixed.bad_cron", app="mixed")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("CommandError: job 'mixed.bad_cron' is invalid and does not run")
    assert "61 * * * *" in lines[0]


# -- bad FENCEDJOBS values (issue 9, item 12) -----------------------------------------------


@pytest.mark.parametrize(
    ("mode", "fencedjobs"),
    [
        (["--once"], '{"RUN_RETENTION": 7}'),
        (["--once"], '{"ERROR_MAX_CHARS": 1}'),
        (["--once"], '{"CLOCK": "django_fencedjobs.clock.FakeClock"}'),
        ([], '{"LOOP_MAX_SLEEP": 30}'),
        (["--list"], '{"NO_SUCH_KEY": 1}'),
    ],
    ids=["once-retention", "once-error-max-chars", "once-clock-class", "loop", "list"],
)
def test_a_bad_fencedjobs_setting_is_one_line_and_exit_1(child_env, mode, fencedjobs):
    result = runjobs(child_env, *mode, timeout=60, FENCEDJOBS_CHECK_SETTINGS=fencedjobs)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("CommandError: FENCEDJOBS is invalid: ")
    assert "Traceback" not in result.stderr


# -- before migrate (issue 9, item 14) ------------------------------------------------------


@pytest.mark.parametrize("mode", [["--once"], []], ids=["once", "loop"])
def test_before_migrate_runjobs_says_to_run_migrate_and_exits_3(unmigrated_env, mode):
    result = runjobs(unmigrated_env, *mode, timeout=60)
    assert result.returncode == 3, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("CommandError: ")
    assert "run `manage.py migrate`" in lines[0]
