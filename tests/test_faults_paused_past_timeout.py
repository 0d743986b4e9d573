"""Fault: a lease holder paused (SIGSTOP) past its lease *and* past its timeout, taken over
meanwhile, then resumed.

Why it matters: when the process resumes, two things are true of its run: its deadline has
passed, and another run holds the lease. Which one ended it decides what the record says
and what an operator looks for: ``timed_out`` points at a handler that is too slow,
``fence_lost`` at a process that stalled (a GC pause, a VM suspend, a stopped container).
The run did not overrun its timeout while it ran; it lost its lease while it was paused,
so it is recorded ``fence_lost``.

Worker A writes through ``fenced_atomic``, then computes outside any transaction, where it
is stopped; once its lease ran out, worker B takes the job over and finishes; once A's
timeout has passed too, A is resumed. A's handler writes nothing more: what ends its run
is its supervisor, which wakes past its deadline and revokes the run, finding the lease
taken over.
"""

from __future__ import annotations

import time

import pytest

from django_fencedjobs.models import LEASE_FREE, JobLease, Outcome
from tests.faults.harness import (
    make_due,
    prepare,
    runs,
    stop_outside_transactions,
    wait_lease_expired,
    wait_until,
)
from tests.faults.jobs import PAUSE_TIMEOUT, PAUSED_PAST_TIMEOUT
from tests.testapp.models import Write

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_holder_paused_past_its_lease_and_its_timeout_is_recorded_fence_lost(spawn):
    prepare(PAUSED_PAST_TIMEOUT)
    a = spawn("once", PAUSED_PAST_TIMEOUT, "A", pause_after=3)
    b = spawn("once", PAUSED_PAST_TIMEOUT, "B", wait_go=True, pause_after=3)
    (pause,) = a.wait_for("pause_point")
    stop_outside_transactions(a)
    (run_a,) = runs(PAUSED_PAST_TIMEOUT)
    assert run_a.outcome == Outcome.RUNNING, (
        f"A's run ended before it was stopped: {run_a.outcome}\n{a.log()}"
    )

    wait_lease_expired(PAUSED_PAST_TIMEOUT, diagnostics=spawn.logs)
    make_due(PAUSED_PAST_TIMEOUT)
    b.wait_for("ready")
    b.send("go")
    b.wait_for("pause_point")
    b.touch("release-B")
    assert b.wait_exit() == 0, b.log()
    assert b.events("done"), b.log()
    # A's supervisor started before its handler, so its deadline had come before this.
    deadline = pause["t"] + PAUSE_TIMEOUT.total_seconds() + 0.5
    wait_until(lambda: time.time() > deadline, what="A's timeout to pass while it is stopped")

    a.cont()
    assert a.wait_exit() == 0, a.log()
    run_a, run_b = runs(PAUSED_PAST_TIMEOUT)
    assert (run_a.fence, run_b.fence) == (pause["fence"], b.events("done")[0]["fence"])
    assert run_b.outcome == Outcome.SUCCEEDED, run_b.error
    assert run_a.outcome == Outcome.FENCE_LOST, run_a.error
    assert "another run took the lease over" in run_a.error, run_a.error
    # Its handler was stopped (by its supervisor: it checks nothing itself), and says so.
    assert a.events("stopped") and not a.events("done"), a.log()
    log = a.log()
    assert f"run finished: {PAUSED_PAST_TIMEOUT} fence_lost" in log, log
    assert f"run finished: {PAUSED_PAST_TIMEOUT} timed_out" not in log, log
    # Nor does the process log a timeout first: the lost fence, found at the deadline, is
    # what it reports.
    assert "timed out after" not in log, log
    assert "fence lost: another run took over" in log, log
    # A committed what it wrote before it was stopped, nothing after; B's end freed the
    # lease, and the late A changed nothing of it.
    written = Write.objects.filter(job=PAUSED_PAST_TIMEOUT, fence=run_a.fence)
    assert sorted(written.values_list("seq", flat=True)) == [1, 2, 3]
    row = JobLease.objects.get(name=PAUSED_PAST_TIMEOUT)
    assert row.fence > run_b.fence
    assert (row.owner, row.lease_until, row.consecutive_failures) == ("", LEASE_FREE, 0)
