"""`manage.py runjobs` from the command line: listing, bad input and an unreachable
database give one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.django_db(transaction=True)


def runjobs(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", "runjobs", *args],
        cwd=REPO,
        env={
            **env,
            "DJANGO_SETTINGS_MODULE": "tests.check_settings",
            "FENCEDJOBS_CHECK_APP": "healthy",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


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
def test_an_unreachable_database_is_one_line_and_exit_1(child_env, mode):
    env = {
        **child_env,
        "FENCEDJOBS_TEST_DB": "postgres",
        "DATABASE_URL": f"postgres://nobody@127.0.0.1:{closed_port()}/nowhere",
    }
    result = runjobs(env, *mode)
    assert result.returncode == 1, result.stdout + result.stderr
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
