"""Each configuration mistake is a system check error with a stable id, raised from a real
jobs.py by `manage.py check`, which then exits non-zero."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def manage_check(app: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.check_settings",
        "PYTHONPATH": str(REPO),
        **env,
    }
    environ.pop("FENCEDJOBS_CHECK_APP", None)
    if app:
        environ["FENCEDJOBS_CHECK_APP"] = app
    return subprocess.run(
        [sys.executable, "-m", "django", "check"],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


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


def test_a_top_of_the_hour_schedule_without_jitter_is_a_warning_only():
    result = manage_check("w001")
    assert result.returncode == 0, result.stderr
    assert "fencedjobs.W001" in result.stderr


def test_a_healthy_jobs_module_passes_silently():
    result = manage_check("healthy")
    assert result.returncode == 0, result.stderr
    assert "fencedjobs." not in result.stdout + result.stderr
