"""Fault: the PostgreSQL server restarts (a failover, a minor-version upgrade, a crash) while
the scheduler loop runs, once in the middle of a run and once between runs.

Why it matters: a scheduler that dies with its database connection stops running every job
quietly, until someone notices; one that leaves its run marked ``running`` makes the record
lie. Here the loop reconnects and keeps going: the interrupted run is recorded with an
outcome, the next slot succeeds, and SIGTERM still stops the loop cleanly, releasing its
lease, exit code 0.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess

import pytest
from django.db import connection

from django_fencedjobs.models import JobLease, JobRun, Outcome
from tests.faults.harness import now, prepare, wait_until
from tests.faults.jobs import LOOP

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.throwaway_server,
    pytest.mark.django_db(transaction=True),
]


def restart_server() -> None:
    pg_ctl = shlex.split(os.environ["FENCEDJOBS_TEST_PG_CTL"])
    subprocess.run(
        [*pg_ctl, "restart", "-m", "fast", "-w"], check=True, capture_output=True, timeout=60
    )
    connection.close()  # this process's connection died with the server too


def succeeded_after(run: JobRun, spawn) -> JobRun:
    return wait_until(
        lambda: JobRun.objects.filter(
            job=LOOP, outcome=Outcome.SUCCEEDED, scheduled_for__gt=run.scheduled_for
        ).first(),
        what=f"a run after {run} to succeed",
        diagnostics=spawn.logs,
    )


def test_loop_survives_a_database_restart(spawn):
    prepare(LOOP, due=False)  # the loop runs it at its next 5-second slot
    (spawn.directory / "stall").touch()  # the first run waits mid-run for the restart
    loop = spawn("loop", LOOP, "L")
    (stalled,) = loop.wait_for("stalled")
    restart_server()
    loop.touch("continue")

    # The interrupted run is recorded (it tried to write over the dead connection), not
    # left running.
    interrupted = wait_until(
        lambda: (
            JobRun.objects.exclude(outcome=Outcome.RUNNING)
            .filter(job=LOOP, fence=stalled["fence"])
            .first()
        ),
        what="the interrupted run to be recorded",
        diagnostics=spawn.logs,
    )
    assert interrupted.outcome in (Outcome.FAILED, Outcome.TIMED_OUT, Outcome.ABANDONED), (
        interrupted
    )
    assert interrupted.finished_at is not None
    # The loop reconnected by itself, and the next slot succeeds.
    after_first = succeeded_after(interrupted, spawn)

    # A restart while the loop sleeps between runs: the next slot succeeds too.
    restart_server()
    succeeded_after(after_first, spawn)
    assert loop.proc.poll() is None, loop.log()

    loop.signal(signal.SIGTERM)
    assert loop.wait_exit() == 0, loop.log()
    row = JobLease.objects.get(name=LOOP)
    assert row.owner == "" and row.lease_until < now(), (row.owner, row.lease_until)
    assert not JobRun.objects.filter(job=LOOP, outcome=Outcome.RUNNING).exists()
