"""scripts/throwaway_postgres.py's own arguments: --help prints its usage and starts
nothing; its options come before CMD, and everything from CMD on is CMD's."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "throwaway_postgres.py"


def script(*args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("args", [["--help"], ["-h"], ["--durable", "--help"]])
def test_help_prints_the_usage_and_exits_0_starting_nothing(args):
    result = script(*args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: throwaway_postgres.py [--durable]")
    assert "--no-pgbouncer" in result.stdout
    assert result.stderr == "", "it started something (a cluster logs its start on stderr)"


def test_no_command_is_a_usage_error_exit_2_starting_nothing():
    result = script("--durable")
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].endswith("no command given (put it after --)")


def test_the_scripts_options_come_before_cmd_and_the_rest_is_cmds():
    spec = importlib.util.spec_from_file_location("throwaway_postgres", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    split = module.split_argv
    assert split(["--durable", "--", "pytest", "-x"]) == (["--durable"], ["pytest", "-x"])
    assert split(["--", "make", "--", "x"]) == ([], ["make", "--", "x"])
    assert split(["make", "-j2", "--", "x"]) == ([], ["make", "-j2", "--", "x"])
    assert split(["--no-pgbouncer", "pytest", "--help"]) == (
        ["--no-pgbouncer"],
        ["pytest", "--help"],
    )
    assert split(["--help"]) == (["--help"], [])
