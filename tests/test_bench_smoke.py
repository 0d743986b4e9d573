"""The benchmarks keep working: ``bench/run.py --smoke`` runs every one of them at tiny
sizes, end to end, against this suite's PostgreSQL server (in a database of its own, which
it drops). Timings are not asserted: smoke sizes measure nothing; ``make bench`` does."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

KEYS = [
    "Ceiling",
    "P1",
    "P2",
    "P3",
    "P4",
    "P4L",
    "P5",
    "P6",
    "P7",
    "P8",
    "P9",
    "P10",
    "P11",
    "P12",
    "P13",
    "P14",
    "P15",
]


# Every benchmark once, at its smallest sizes, RQ's on a throwaway redis-server included:
# some minutes on 2 cores shared with the other tests.
@pytest.mark.postgres_only
@pytest.mark.timeout(900)
def test_every_benchmark_runs_at_smoke_sizes(tmp_path):
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        pytest.fail("the benchmarks need DATABASE_URL to name a PostgreSQL server")
    output = tmp_path / "benchmarks.md"
    env = dict(os.environ)
    env.pop("MAKELEVEL", None)
    env.pop("DJANGO_SETTINGS_MODULE", None)  # the benchmarks use bench.settings
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, "bench/run.py", "--smoke", "--output", str(output)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    text = output.read_text()
    for key in KEYS:
        assert f"### {key}:" in text, key
    assert "FAILED TO RUN" not in text
    # P2 asserts exactly-once processing itself; the count it prints must be zero.
    assert "items processed twice | 0 | 0 | met |" in text
    # P11's runner processes over instances: no slot run twice, no two runs overlapping.
    assert "hourly: slots run twice, overlapping runs | 0 | 0, 0 | met |" in text
    assert "every 5 minutes: slots run twice, overlapping runs | 0 | 0, 0 | met |" in text
    assert "- command: `" in text and "- PostgreSQL 1" in text
