"""Fault: a run's end that cannot be recorded as it is, beside a bystander on the same runner.

Why it matters: a runner records the ends of its runs together (on PostgreSQL, in one
statement). An end the database refuses (a count out of the column's range) or that cannot
even be sent (a ``Decimal``) must neither hold the others' ends nor stop the loop, which
would stop every job of the runner while it still beats as if it worked. And a runner
that cannot record its runs' ends (here: a lock held on a run's row) must read not working
in ``checkjobs`` within seconds, not keep beating.

Real ``runjobs`` processes (tests/end_jobs.py) on PostgreSQL.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import transaction
from django.test import override_settings

from django_fencedjobs.health import State, job_health
from django_fencedjobs.models import JobRun, Outcome, Runner
from django_fencedjobs.registry import registry
from tests.conftest import REPO_ROOT
from tests.end_jobs import BYSTANDER, HELD, OVERFLOW, POISON, SMUGGLER, declare
from tests.faults.harness import wait_until

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

#: Bounds small enough for a test to watch a runner go quiet, in seconds.
QUICK = {"RUNNER_BEAT": 0.2, "RUNNER_TIMEOUT": 2.0}


class Runjobs:
    """A ``runjobs`` child process, killed when the test ends."""

    def __init__(self, env: dict[str, str], log: Path, *args: str) -> None:
        self.log_path = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.end_jobs", "runjobs", *args],
                env=env,
                cwd=REPO_ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def log(self) -> str:
        return f"--- runjobs (exit {self.proc.poll()}):\n" + self.log_path.read_text()[-8000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def quick(child_env: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    """The child's environment (the database's clock, the quick beat and bound) and this
    process's settings to match."""
    env = {
        **child_env,
        "FENCEDJOBS_TEST_EXTRA": json.dumps(QUICK),
        "FENCEDJOBS_TEST_DIR": str(tmp_path),
    }
    env.pop("FENCEDJOBS_TEST_CLOCK", None)
    settings = {key: timedelta(seconds=value) for key, value in QUICK.items()}
    with (
        registry.isolated(),
        override_settings(FENCEDJOBS={"CLOCK": "django_fencedjobs.clock.database_now", **settings}),
    ):
        declare()
        yield env


@pytest.fixture
def runjobs(quick: dict[str, str], tmp_path: Path) -> Iterator[list[Runjobs]]:
    started: list[Runjobs] = []
    yield started
    for runner in started:
        runner.kill()


def start(env: dict[str, str], started: list[Runjobs], tmp: Path, *jobs: str) -> Runjobs:
    args = [arg for name in jobs for arg in ("--job", name)]
    runner = Runjobs(env, tmp / f"runjobs-{len(started)}.log", *args, "--workers", "2")
    started.append(runner)
    return runner


def checkjobs(env: dict[str, str], name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.end_jobs", "checkjobs", "--job", name],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def runs(name: str, outcome: str) -> list[JobRun]:
    return list(JobRun.objects.filter(job=name, outcome=outcome).order_by("finished_at"))


def test_an_end_the_database_refuses_is_recorded_failed_and_holds_no_other_runs_end(
    quick, runjobs, tmp_path
):
    poisoned = (POISON, SMUGGLER, OVERFLOW)
    runner = start(quick, runjobs, tmp_path, *poisoned, BYSTANDER)

    # Each poisoned job's runs are recorded failed, one after another...
    failed = {
        name: wait_until(
            lambda name=name: len(found := runs(name, Outcome.FAILED)) >= 2 and found,
            what=f"two failed runs of {name}",
            diagnostics=runner.log,
        )
        for name in poisoned
    }
    # ... and the bystander goes on succeeding after them, on the same runner.
    latest = max(run.finished_at for found in failed.values() for run in found)
    wait_until(
        lambda: (
            JobRun.objects.filter(
                job=BYSTANDER, outcome=Outcome.SUCCEEDED, started_at__gt=latest
            ).count()
            >= 2
        ),
        what="the bystander to succeed after the poisoned runs",
        diagnostics=runner.log,
    )
    assert runner.proc.poll() is None, runner.log()

    # The reason is on each failed run: the handler's own error at add_items()...
    poison = failed[POISON][0]
    assert "ValueError: job 'e.poison': add_items() of 9223372036854775808 items" in (
        poison.error
    ), poison.error
    assert poison.items == 0
    # ... or, for an end that reached the database anyway, why it was refused.
    assert "could not be recorded as it was (TypeError:" in failed[SMUGGLER][0].error
    assert "out of range for type bigint" in failed[OVERFLOW][0].error
    for name in poisoned:
        assert not JobRun.objects.filter(job=name, outcome=Outcome.ABANDONED).exists()
    bystander = runs(BYSTANDER, Outcome.SUCCEEDED)[-1]
    assert bystander.items == 1 and bystander.error == ""

    runner.proc.send_signal(signal.SIGTERM)
    assert runner.proc.wait(30) == 0, runner.log()
    assert not JobRun.objects.filter(outcome__in=(Outcome.RUNNING, Outcome.ABANDONED)).exists()


def test_a_runner_that_cannot_record_an_end_reads_not_working_until_it_can(
    quick, runjobs, tmp_path
):
    runner = start(quick, runjobs, tmp_path, HELD, BYSTANDER)
    wait_until(lambda: list(tmp_path.glob("held-*")), what="the held run", diagnostics=runner.log)
    held = JobRun.objects.get(job=HELD, outcome=Outcome.RUNNING)
    wait_until(
        lambda: job_health(BYSTANDER).runners, what="the bystander served", diagnostics=runner.log
    )

    with transaction.atomic():
        # The held run's row, locked: its end waits, the database reachable all along.
        JobRun.objects.select_for_update().get(pk=held.pk)
        (tmp_path / "release").touch()
        quiet = wait_until(
            lambda: (h := job_health(BYSTANDER)).state is State.NO_RUNNER and h,
            what="the runner to read not working",
            diagnostics=runner.log,
        )
        assert quiet.reason.startswith("no live runner: "), quiet.reason
        result = checkjobs(quick, BYSTANDER)
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.strip().splitlines()[-1] == (
            f"CommandError: 1 of 1 job(s) need attention: {BYSTANDER} (no_runner)"
        ), result.stderr
        assert runner.proc.poll() is None, runner.log()

    # The lock gone, the end is recorded and the runner beats again.
    wait_until(
        lambda: JobRun.objects.get(pk=held.pk).outcome == Outcome.SUCCEEDED,
        what="the held run's end recorded",
        diagnostics=runner.log,
    )
    beat = Runner.objects.get().last_beat_at
    wait_until(
        lambda: Runner.objects.get().last_beat_at > beat and job_health(BYSTANDER).runners,
        what="the runner beating again",
        diagnostics=runner.log,
    )
    runner.proc.send_signal(signal.SIGTERM)
    assert runner.proc.wait(30) == 0, runner.log()
