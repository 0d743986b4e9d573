"""Each configuration mistake is a system check error with a stable id, raised from a real
jobs.py by `manage.py check`, which then exits non-zero."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from django_fencedjobs import checks as jobs_checks
from django_fencedjobs import job
from django_fencedjobs.registry import registry
from django_fencedjobs.schedule import Schedule
from tests.test_runjobs_command import start

REPO = Path(__file__).resolve().parent.parent


def manage(
    *argv: str, app: str | None = None, base: dict[str, str] | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """``manage.py <argv>`` in a subprocess with tests.check_settings and ``app``."""
    environ = {
        **(base if base is not None else os.environ),
        "DJANGO_SETTINGS_MODULE": "tests.check_settings",
        "PYTHONPATH": str(REPO),
        **env,
    }
    environ.pop("FENCEDJOBS_CHECK_APP", None)
    if app:
        environ["FENCEDJOBS_CHECK_APP"] = app
    return subprocess.run(
        [sys.executable, "-m", "django", *argv],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


def manage_check(app: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return manage("check", app=app, **env)


def reported(output: str, check_id: str) -> dict[str, str]:
    """The objects ``manage.py check`` reported under ``check_id``, and each one's line."""
    found = {}
    for line in output.splitlines():
        if f": ({check_id}) " in line:
            found[line.split(": (", 1)[0]] = line
    return found


@pytest.mark.parametrize(
    ("app", "check_id", "words"),
    [
        ("e001", "fencedjobs.E001", "61 * * * *"),
        ("e002", "fencedjobs.E002", "Mars/Olympus_Mons"),
        ("e003", "fencedjobs.E003", "UTC+2"),
        ("e004", "fencedjobs.E004", "timeout 0:05:00 is not shorter"),
        ("e005", "fencedjobs.E005", "jitter 0:10:00 is not shorter"),
        ("e006", "fencedjobs.E006", "lease_ttl must be positive"),
        ("e008", "fencedjobs.E008", "declared twice"),
    ],
)
def test_bad_configuration_fails_manage_py_check(app, check_id, words):
    result = manage_check(app)
    assert result.returncode != 0
    assert check_id in result.stderr
    assert words in result.stderr


def test_advisory_exclusion_is_an_error_on_sqlite_only(on_postgres):
    result = manage_check("e007")
    if on_postgres:
        assert result.returncode == 0, result.stderr
        assert "fencedjobs.E007" not in result.stderr
    else:
        assert result.returncode != 0
        assert "fencedjobs.E007" in result.stderr
        assert "sqlite" in result.stderr


def test_tables_routed_to_another_database_are_an_error():
    result = manage_check("healthy", FENCEDJOBS_CHECK_ROUTE_ELSEWHERE="1")
    assert result.returncode != 0
    assert "fencedjobs.E009" in result.stderr


def test_an_unimportable_clock_is_an_error():
    result = manage_check("healthy", FENCEDJOBS_CHECK_CLOCK="no.such.clock")
    assert result.returncode != 0
    assert "fencedjobs.E010" in result.stderr


# -- W001: a stampede, not one job at minute 0 (issue 20, item 6) ---------------------------


def test_ten_jobs_without_jitter_starting_at_one_instant_are_warning_w001_naming_them():
    result = manage_check("w001")
    assert result.returncode == 0, result.stderr
    (line,) = reported(result.stderr, "fencedjobs.W001").values()
    assert "10 jobs without jitter start at the same instant" in line
    assert "10 or more jobs at one instant within the next 7 days" in line
    hint = result.stderr.split("HINT:", 1)[1]
    assert "checks.every_5_minutes, checks.hourly_0" in hint and "and 5 more" in hint
    assert "checks.jittered" not in result.stderr


def test_one_nightly_job_at_minute_0_without_jitter_is_no_warning():
    result = manage_check("nightly")
    assert result.returncode == 0, result.stderr
    assert "fencedjobs.W001" not in result.stdout + result.stderr


NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)  # a Monday; Berlin is at UTC+1


def declare(n: int, cron: str | None = None, prefix: str = "j", **kwargs: object) -> None:
    for i in range(n):
        job(cron, name=f"{prefix}.{i}", **kwargs)(lambda run: None)


def test_nine_jobs_at_one_instant_are_not_a_stampede_and_ten_are():
    with registry.isolated():
        declare(9, "0 3 * * *", timezone="Europe/Berlin")
        declare(20, "0 4 * * *", prefix="jittered", jitter=timedelta(minutes=5))
        assert jobs_checks.stampede(registry.all(), NOW) is None
        job("0 2 * * *", name="other.utc")(lambda run: None)  # 02:00 UTC is 03:00 in Berlin
        instant, names = jobs_checks.stampede(registry.all(), NOW)
    assert instant == datetime(2026, 3, 3, 2, 0, tzinfo=UTC)
    assert names == sorted([*(f"j.{i}" for i in range(9)), "other.utc"])


def test_jobs_that_meet_once_a_week_or_once_a_month_are_a_stampede_too():
    with registry.isolated():
        declare(6, "0 6 * * 0")  # Sundays
        declare(4, "0 6 * * *", prefix="daily")
        assert jobs_checks.stampede(registry.all(), NOW)[0] == datetime(
            2026, 3, 8, 6, 0, tzinfo=UTC
        )
    with registry.isolated():
        # Ten jobs of one schedule start together at each of its fire times, however rare.
        declare(10, "30 1 1 1 *")
        assert jobs_checks.stampede(registry.all(), NOW)[0] == datetime(
            2027, 1, 1, 1, 30, tzinfo=UTC
        )


def test_interval_jobs_finer_than_a_minute_count_at_every_instant_they_fire():
    with registry.isolated():
        declare(5, every=timedelta(seconds=30), prefix="fine")
        declare(5, "17 5 * * *", prefix="daily")
        instant, names = jobs_checks.stampede(registry.all(), NOW)
    assert instant == datetime(2026, 3, 3, 5, 17, tzinfo=UTC)
    assert len(names) == 10


def test_the_stampede_check_expands_each_schedule_once_however_many_jobs_share_it(monkeypatch):
    expanded: list[str] = []
    fire_times = Schedule.fire_times

    def counting(self, start, end, limit=None):
        if end - start == jobs_checks.STAMPEDE_HORIZON:
            expanded.append(self.cron or str(self.every))
        return fire_times(self, start, end, limit)

    with registry.isolated():
        declare(300, "*/5 * * * *", timezone="Europe/Berlin")
        declare(200, "0 * * * *", prefix="hourly")
        declare(100, "0 3 * * *", prefix="tenant", jitter=timedelta(minutes=30))
        monkeypatch.setattr(Schedule, "fire_times", counting)
        instant, names = jobs_checks.stampede(registry.all(), NOW)
    assert sorted(expanded) == ["*/5 * * * *", "0 * * * *"]
    assert (instant, len(names)) == (datetime(2026, 3, 2, 13, 0, tzinfo=UTC), 500)


def test_a_healthy_jobs_module_passes_silently():
    result = manage_check("healthy")
    assert result.returncode == 0, result.stderr
    assert "fencedjobs." not in result.stdout + result.stderr


# -- SQLite without transaction_mode IMMEDIATE (issue 12, item 7) ----------------------------


@pytest.mark.parametrize(
    ("options", "warned"),
    [
        ("{}", True),
        ('{"transaction_mode": "DEFERRED", "timeout": 20}', True),
        ('{"transaction_mode": "IMMEDIATE", "timeout": 20}', False),
        ('{"transaction_mode": "immediate"}', False),
        ('{"transaction_mode": "EXCLUSIVE"}', False),
    ],
    ids=["no-options", "deferred", "immediate", "lower-case", "exclusive"],
)
def test_sqlite_without_transaction_mode_immediate_is_warning_w002(tmp_path, options, warned):
    result = manage_check(
        "healthy",
        FENCEDJOBS_CHECK_SQLITE=str(tmp_path / "db.sqlite3"),
        FENCEDJOBS_CHECK_SQLITE_OPTIONS=options,
    )
    assert result.returncode == 0, result.stderr
    assert ("fencedjobs.W002" in result.stderr) is warned, result.stderr
    if warned:
        assert '"OPTIONS": {"transaction_mode": "IMMEDIATE"' in result.stderr


# -- handlers that cannot run as written (issue 9, item 8) -----------------------------------


def test_async_and_generator_handlers_are_check_errors_naming_the_job():
    result = manage_check("e011")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    assert set(reported(result.stderr, "fencedjobs.E011")) == {
        "checks.async_def",
        "checks.async_generator",
        "checks.generator",
        "checks.async_call",
    }
    assert "async def" in reported(result.stderr, "fencedjobs.E011")["checks.async_def"]


def test_a_handler_that_cannot_take_the_run_as_its_one_argument_is_a_check_error():
    result = manage_check("e012")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    flagged = reported(result.stderr, "fencedjobs.E012")
    assert set(flagged) == {
        "checks.no_argument",
        "checks.two_arguments",
        "checks.keyword_only",
        "checks.not_callable",
    }
    assert "checks.fine_" not in result.stderr


# -- bad @job arguments (issue 9, item 13) ---------------------------------------------------


def test_bad_job_arguments_are_check_errors_naming_job_and_argument_not_an_import_crash():
    result = manage_check("e013")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    flagged = reported(result.stderr, "fencedjobs.E013")
    expected = {
        "checks.int_timeout": "timeout must be a datetime.timedelta, got 30",
        "checks.zero_batches": "max_batches must be a positive int, got 0",
        "checks.mutex": "exclusion must be 'lease' or 'advisory', got 'mutex'",
        "checks.negative_grace": "grace must be positive",
        "checks.float_threshold": "failure_threshold must be a positive int, got 2.5",
        "checks.seconds_deadline": "starting_deadline must be a datetime.timedelta, got 60",
    }
    assert set(flagged) == set(expected)
    for name, words in expected.items():
        assert f"job {name!r}" in flagged[name] and words in flagged[name]


def test_an_out_of_range_cron_field_gets_a_hint_about_the_range_not_the_field_count():
    result = manage_check("e001")
    assert result.returncode != 0
    (hint,) = [line for line in result.stderr.splitlines() if "HINT:" in line]
    assert "five fields" not in hint
    assert "minute 0-59" in hint


@pytest.mark.django_db(transaction=True)
def test_bad_job_definitions_do_not_block_migrate(unmigrated_env):
    result = manage("migrate", app="mixed", base=unmigrated_env)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    # Still shown, as warnings, so whoever deploys sees them.
    assert "mixed.bad_cron: (fencedjobs.E001)" in result.stderr
    assert "mixed.bad_timeout: (fencedjobs.E013)" in result.stderr


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.django_db(transaction=True)
def test_bad_job_definitions_do_not_stop_the_web_app(child_env):
    port = free_port()
    server = start(child_env, "runserver", "--noreload", f"127.0.0.1:{port}", app="mixed")
    try:
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/login/") as page:
                    status = page.status
                break
            except OSError:
                time.sleep(0.2)
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=30)
    assert status == 200, stderr
    assert "Traceback" not in stderr


# -- FENCEDJOBS values (issue 9, item 12) ----------------------------------------------------


@pytest.mark.parametrize(
    ("fencedjobs", "check_id", "words"),
    [
        ('{"ERROR_MAX_CHARS": 1}', "fencedjobs.E014", "ERROR_MAX_CHARS"),
        ('{"LOOP_MAX_SLEEP": 30}', "fencedjobs.E014", "LOOP_MAX_SLEEP"),
        ('{"RUN_RETENTION": 7}', "fencedjobs.E014", "RUN_RETENTION"),
        ('{"RUNS_KEPT_PER_JOB": -1}', "fencedjobs.E014", "RUNS_KEPT_PER_JOB"),
        ('{"SENTRY": "no"}', "fencedjobs.E014", "SENTRY"),
        ('{"OWNER": 7}', "fencedjobs.E014", "OWNER"),
        ('{"METRICS_TOKEN": None}', "fencedjobs.E014", "METRICS_TOKEN"),
        ('{"CLOCK": 42}', "fencedjobs.E014", "CLOCK"),
        ('{"CLOCK": "django_fencedjobs.clock.FakeClock"}', "fencedjobs.E010", "a class"),
        ('{"CLOCK": "os.path.join"}', "fencedjobs.E010", "zero-argument"),
        ('["CLOCK"]', "fencedjobs.E010", "must be a dict"),
    ],
)
def test_every_bad_fencedjobs_value_is_a_check_error_naming_the_key(fencedjobs, check_id, words):
    result = manage_check("healthy", FENCEDJOBS_CHECK_SETTINGS=fencedjobs)
    assert result.returncode != 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    line = next(line for line in result.stderr.splitlines() if check_id in line)
    assert words in line


def test_every_setting_has_a_type_and_range_rule():
    from dataclasses import fields

    from django_fencedjobs.conf import _RULES, Settings

    assert set(_RULES) == {f.name for f in fields(Settings)}


@pytest.mark.parametrize(
    ("fencedjobs", "words"),
    [
        ({"ERROR_MAX_CHARS": 1}, "FENCEDJOBS['ERROR_MAX_CHARS'] must be an int of at least 200"),
        ({"LOOP_MAX_SLEEP": 30}, "FENCEDJOBS['LOOP_MAX_SLEEP'] must be a datetime.timedelta"),
        ({"RUN_RETENTION": 7}, "FENCEDJOBS['RUN_RETENTION'] must be a datetime.timedelta"),
    ],
)
def test_get_settings_refuses_a_bad_value_in_one_clear_line(fencedjobs, words):
    from django.core.exceptions import ImproperlyConfigured
    from django.test import override_settings

    from django_fencedjobs.conf import get_settings

    with override_settings(FENCEDJOBS=fencedjobs), pytest.raises(ImproperlyConfigured) as info:
        get_settings()
    assert words in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.postgres_only
def test_an_isolation_level_stricter_than_read_committed_is_an_error():
    result = manage_check("healthy", FENCEDJOBS_CHECK_ISOLATION="1")
    assert result.returncode != 0
    assert "fencedjobs.E015" in result.stderr
    assert "REPEATABLE_READ" in result.stderr


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_runjobs_refuses_a_server_whose_default_isolation_is_stricter(child_env):
    """Set on the server side (here for the session, as a role or database default would):
    no setting shows it, so runjobs asks the server and says so in one line."""
    env = {**child_env, "PGOPTIONS": "-c default_transaction_isolation=serializable"}
    result = subprocess.run(
        [sys.executable, "-m", "django", "runjobs", "--once"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "SERIALIZABLE" in line and "READ COMMITTED" in line


class _TaskQueueElsewhere:
    """Routes django-tasks-db's queue to another database than the job leases."""

    def db_for_write(self, model, **hints):
        return "queue" if model.__module__.startswith("django_tasks_db.") else None


@pytest.mark.parametrize("elsewhere", [False, True])
def test_a_task_queue_outside_the_lease_database_is_warning_w003(elsewhere):
    from django.test import override_settings

    from django_fencedjobs.checks import check_task_database

    routers = [f"{__name__}._TaskQueueElsewhere"] if elsewhere else []
    with override_settings(DATABASE_ROUTERS=routers):
        messages = check_task_database()
    if elsewhere:
        (warning,) = messages
        assert warning.id == "fencedjobs.W003"
        assert "'queue'" in warning.msg and "effectively once" in warning.msg
    else:
        assert messages == []


@pytest.mark.postgres_only
def test_a_transaction_pooler_with_server_side_cursors_is_an_error(monkeypatch, settings):
    from django.db import connection

    from django_fencedjobs.checks import check_transaction_pooler

    settings.FENCEDJOBS = {"TRANSACTION_POOLER": True}
    monkeypatch.setitem(connection.settings_dict, "DISABLE_SERVER_SIDE_CURSORS", False)
    (error,) = check_transaction_pooler()
    assert error.id == "fencedjobs.E016"
    assert "DISABLE_SERVER_SIDE_CURSORS" in error.msg
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", {"server_side_binding": True})
    (error,) = check_transaction_pooler()
    assert "server_side_binding" in error.msg and "DISABLE_SERVER_SIDE_CURSORS" in error.msg
    # Declared as Django's documentation asks for transaction pooling: no error.
    monkeypatch.setitem(connection.settings_dict, "DISABLE_SERVER_SIDE_CURSORS", True)
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", {})
    assert check_transaction_pooler() == []
    # Not declared: nothing is asked of the database settings.
    monkeypatch.setitem(connection.settings_dict, "DISABLE_SERVER_SIDE_CURSORS", False)
    settings.FENCEDJOBS = {}
    assert check_transaction_pooler() == []


def test_every_check_id_is_in_the_reference_and_every_id_there_is_a_check():
    from django_fencedjobs.checkids import CheckId

    reference = (REPO / "docs" / "checks.md").read_text()
    documented = re.findall(r"^\| `(fencedjobs\.[EW]\d{3})` \|", reference, flags=re.MULTILINE)
    assert len(documented) == len(set(documented)), "an id is listed twice in docs/checks.md"
    in_code = {check_id.value for check_id in CheckId}
    assert set(documented) - in_code == set(), "documented, but no check has the id"
    assert in_code - set(documented) == set(), "a check's id is missing from docs/checks.md"
