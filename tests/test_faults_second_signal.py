"""Fault: a second Ctrl-C (SIGINT), or a second SIGTERM, while ``runjobs`` is already
stopping after the first and waits for a run that does not stop.

Why it matters: whoever sends it wants the process gone now, and a page of traceback out of
the middle of the shutdown reads like a crash and hides what happened to the data. Here the
process says so in one line and dies of that signal at once (exit status 128 + its number);
the run it held keeps its lease until ``lease_ttl`` runs out, its open transaction rolls
back, and the job's next run takes over and marks it abandoned.

Real ``runjobs`` processes and real signals; the handler waits inside its fenced
transaction on a file lock the test holds (tests/checkapps/stuck).
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from django_fencedjobs import clock
from django_fencedjobs.models import JobLease, Outcome
from tests.faults.harness import wait_until
from tests.test_faults_abandoned_handlers import Gate, env_for, make_due, runs, start
from tests.test_runjobs_command import REPO
from tests.testapp.models import Write

pytestmark = pytest.mark.django_db(transaction=True)

JOB = "stuck.in_transaction"
WAIT = 60.0


@pytest.fixture
def gate(tmp_path):
    gate = Gate(tmp_path / "gate")
    yield gate
    gate.close()


def runjobs_once(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", "runjobs", "--once", "--job", JOB],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT,
    )


@pytest.mark.parametrize(
    ("mode", "first", "second"),
    [
        ("loop", signal.SIGINT, signal.SIGINT),
        ("once", signal.SIGINT, signal.SIGINT),
        ("loop", signal.SIGTERM, signal.SIGTERM),
        ("loop", signal.SIGTERM, signal.SIGINT),
    ],
    ids=["loop-int-int", "once-int-int", "loop-term-term", "loop-term-int"],
)
def test_a_second_signal_during_a_run_is_one_line_and_an_immediate_exit_without_traceback(
    child_env, tmp_path, gate, mode, first, second
):
    env = env_for(child_env, gate, '{"LOOP_MAX_SLEEP": timedelta(seconds=0.2)}')
    assert runjobs_once(env).returncode == 0  # registers the job, runs nothing
    make_due(JOB)
    process = start(env, tmp_path, *(["--once"] if mode == "once" else []), "--job", JOB)
    blocking = tmp_path / "gate.blocking"

    def log() -> str:
        return (tmp_path / "runjobs.stderr").read_text(errors="replace")

    try:
        wait_until(blocking.exists, timeout=WAIT, what="the run to block", diagnostics=log)
        process.send_signal(first)
        stopping = f"received {first.name}: stopping after the current batch"
        wait_until(lambda: stopping in log(), timeout=WAIT, what=stopping, diagnostics=log)
        assert process.poll() is None, log()  # waiting for the run, which does not stop
        before = log().splitlines()
        process.send_signal(second)
        # The handler would wait on the gate for as long as the test holds it.
        code = process.wait(WAIT)
    finally:
        process.kill()
        process.wait()

    assert code == -second, log()  # died of the signal: a shell says 128 + its number
    assert "Traceback" not in log()
    assert log().splitlines()[len(before) :] == [
        f"received {second.name} while stopping: exiting now; runs in progress roll back "
        "their open transactions and are marked abandoned by their job's next run, once "
        "their leases expire"
    ]
    # Nothing of the run committed or was recorded; it still holds the lease, until it
    # expires.
    (killed,) = runs(JOB)
    assert killed.outcome == Outcome.RUNNING
    assert not Write.objects.filter(job=JOB).exists()
    row = JobLease.objects.get(name=JOB)
    assert row.fence == killed.fence and row.owner

    # Once it has expired, the next run takes the job over and marks the killed run
    # abandoned.
    wait_until(
        lambda: JobLease.objects.get(name=JOB).lease_until < clock.now(),
        timeout=WAIT,
        what="the lease to expire",
    )
    gate.open()
    make_due(JOB)
    assert runjobs_once(env).returncode == 0
    assert [run.outcome for run in runs(JOB)] == [Outcome.ABANDONED, Outcome.SUCCEEDED]
    (write,) = Write.objects.filter(job=JOB)
    assert write.fence == runs(JOB)[1].fence
