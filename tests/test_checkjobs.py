"""``manage.py checkjobs``: a table or JSON of every job's health, and an exit status."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_fencedjobs import operations
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.loop import tick
from django_fencedjobs.registry import registry
from tests.conftest import REPO_ROOT
from tests.monitoring_jobs import BROKEN, FINE, STALLED, declare

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
NOW = T0 + timedelta(minutes=45)


@pytest.fixture
def history():
    """At 09:45: m.fine succeeded every 15 minutes; m.broken failed three times in a row;
    m.stalled succeeded at 09:15 and the runner has not run it since (late after 09:42:30)."""
    with (
        registry.isolated(),
        override_settings(FENCEDJOBS={"CLOCK": "django_fencedjobs.clock.fake_clock"}),
    ):
        declare()
        fake_clock.set(T0)
        tick()
        fake_clock.set(T0 + timedelta(minutes=15))
        tick()
        for minutes in (30, 45):
            fake_clock.set(T0 + timedelta(minutes=minutes))
            tick([FINE, BROKEN])
        yield


def checkjobs(*args: str) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    try:
        call_command("checkjobs", *args, stdout=out, stderr=err)
    except CommandError as exc:
        return exc.returncode, out.getvalue(), str(exc)
    return 0, out.getvalue(), ""


def test_checkjobs_prints_a_table_and_exits_2_when_a_job_is_late_or_failing(history):
    status, out, error = checkjobs()
    assert status == 2
    header, *rows = out.splitlines()
    assert header.split()[:4] == ["JOB", "STATE", "LAST", "SUCCESS"]
    assert [row.split()[:2] for row in rows] == [
        [BROKEN, "FAILING"],
        [STALLED, "LATE"],
        [FINE, "ok"],
    ]
    assert "no successful run since 2026-11-29 09:15:00 UTC; expected by 09:42:30" in out
    assert error == f"2 of 3 job(s) need attention: {BROKEN} (failing), {STALLED} (late)"


def test_checkjobs_exits_0_when_the_selected_jobs_are_healthy(history):
    status, out, _ = checkjobs("--job", FINE)
    assert status == 0
    assert len(out.splitlines()) == 2
    assert "2026-11-29 09:45:00 UTC" in out  # last success
    assert "2026-11-29 10:00:00 UTC" in out  # next run


def test_job_is_repeatable(history):
    status, out, _ = checkjobs("--job", FINE, "--job", STALLED)
    assert status == 2
    assert {line.split()[0] for line in out.splitlines()[1:]} == {FINE, STALLED}


def test_strict_makes_a_paused_job_exit_1(history):
    operations.set_paused(FINE, True)
    assert checkjobs("--job", FINE)[0] == 0
    status, _, error = checkjobs("--job", FINE, "--strict")
    assert status == 1
    assert error == f"1 of 1 job(s) need attention: {FINE} (paused)"


def test_json_lists_every_job_with_its_state_and_reason(history):
    status, out, _ = checkjobs("--json")
    data = json.loads(out)
    assert status == data["exit_code"] == 2
    assert data["healthy"] is False
    assert data["checked_at"] == NOW.isoformat()
    by_name = {entry["name"]: entry for entry in data["jobs"]}
    assert by_name[BROKEN]["state"] == "failing"
    assert by_name[BROKEN]["consecutive_failures"] == 3
    assert by_name[BROKEN]["last_finished_run"]["error"] == "RuntimeError: upstream said no"
    assert by_name[STALLED]["state"] == "late"
    assert by_name[STALLED]["expected_by"] == "2026-11-29T09:42:30+00:00"
    assert by_name[FINE]["state"] == "ok"


def test_an_unknown_job_is_a_one_line_command_error(history):
    with pytest.raises(CommandError) as caught:
        call_command("checkjobs", "--job", "m.nope", stdout=StringIO())
    message = str(caught.value)
    assert "'m.nope'" in message and "\n" not in message
    assert caught.value.returncode == 1


# -- as a subprocess, the way cron, Kubernetes and systemd run it ----------------------------


def run_checkjobs(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.monitoring_jobs", "checkjobs", *args],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def clock_env(child_env: dict[str, str]) -> dict[str, str]:
    return {
        **child_env,
        "FENCEDJOBS_TEST_CLOCK": "tests.monitoring_jobs.env_clock",
        "FENCEDJOBS_TEST_NOW": NOW.isoformat(),
    }


def test_checkjobs_in_a_subprocess_exits_2_with_json_on_stdout(history, clock_env):
    result = run_checkjobs(clock_env, "--json")
    assert result.returncode == 2, result.stderr
    states = {entry["name"]: entry["state"] for entry in json.loads(result.stdout)["jobs"]}
    assert states == {BROKEN: "failing", STALLED: "late", FINE: "ok"}
    assert result.stderr.strip().splitlines() == [
        f"CommandError: 2 of 3 job(s) need attention: {BROKEN} (failing), {STALLED} (late)"
    ]


def test_checkjobs_in_a_subprocess_exits_0_when_healthy(history, clock_env):
    result = run_checkjobs(clock_env, "--job", FINE)
    assert result.returncode == 0, result.stderr
    assert FINE in result.stdout and result.stderr == ""


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unreachable_database_is_one_line_on_stderr_and_exit_3(child_env):
    env = {
        **child_env,
        "FENCEDJOBS_TEST_DB": "postgres",
        "DATABASE_URL": f"postgres://fencedjobs@127.0.0.1:{closed_port()}/nowhere",
    }
    result = run_checkjobs(env)
    assert result.returncode == 3, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("CommandError: cannot read the job state, database unavailable: ")
    assert "Traceback" not in result.stderr and result.stdout == ""


def run_checkjobs_with(
    env: dict[str, str], app: str, *args: str, **more: str
) -> subprocess.CompletedProcess[str]:
    """``manage.py checkjobs`` with tests.check_settings and a jobs app of tests/checkapps."""
    return subprocess.run(
        [sys.executable, "-m", "django", "checkjobs", *args],
        env={
            **env,
            "DJANGO_SETTINGS_MODULE": "tests.check_settings",
            "FENCEDJOBS_CHECK_APP": app,
            **more,
        },
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_checkjobs_shows_bad_job_definitions_as_invalid_and_exits_2(child_env):
    result = run_checkjobs_with(child_env, "mixed", "--json")
    assert result.returncode == 2, result.stderr
    jobs = {entry["name"]: entry for entry in json.loads(result.stdout)["jobs"]}
    assert {name: entry["state"] for name, entry in jobs.items()} == {
        "mixed.bad_cron": "invalid",
        "mixed.bad_timeout": "invalid",
        "mixed.async_handler": "invalid",
        "mixed.good": "never_run",
    }
    assert "timeout must be a datetime.timedelta, got 30" in jobs["mixed.bad_timeout"]["reason"]
    assert "async def" in jobs["mixed.async_handler"]["reason"]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "fencedjobs",
    [
        '{"NO_SUCH_KEY": 1}',
        '{"CLOCK": "django_fencedjobs.clock.FakeClock"}',
        '{"LOOP_MAX_SLEEP": 30}',
    ],
    ids=["unknown-key", "clock-class", "bad-value"],
)
def test_a_bad_fencedjobs_setting_is_one_line_on_stderr_and_exit_4(child_env, fencedjobs):
    result = run_checkjobs_with(child_env, "healthy", FENCEDJOBS_CHECK_SETTINGS=fencedjobs)
    assert result.returncode == 4, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("CommandError: FENCEDJOBS is invalid: ")
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_before_migrate_checkjobs_says_to_run_migrate_and_exits_3(unmigrated_env):
    result = run_checkjobs_with(unmigrated_env, "healthy")
    assert result.returncode == 3, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "run `manage.py migrate`" in lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_json_gives_each_jobs_live_watermarks(history):
    from django_fencedjobs.models import Watermark

    at = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
    Watermark.objects.create(job=FINE, key="", position=at)
    Watermark.objects.create(job=FINE, key="orders", cursor=1234)
    _, out, _ = checkjobs("--json")
    by_name = {entry["name"]: entry for entry in json.loads(out)["jobs"]}
    assert by_name[FINE]["watermarks"] == {"": "2026-11-29T09:00:00+00:00", "orders": 1234}
    assert by_name[BROKEN]["watermarks"] == {}
