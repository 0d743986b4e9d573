"""Fault: a handler overruns its timeout, and ignores the interrupt (a broad ``except``, a
loop that never checks), in a pure-Python busy loop, in ``time.sleep`` outside any
transaction, or spinning inside its fenced transaction.

Why it matters: a runaway run that keeps its lock blocks every later slot; one whose lock
merely expires keeps writing next to its successor. Here the timeout *revokes* the run: the
fence is incremented, so the runaway's next fenced write raises ``FenceLost`` and commits
nothing, however long it keeps running; the run is recorded ``timed_out``.

Run in a child process (``runjobs --once``) and in the test process (``loop.tick()``).
"""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from django_fencedjobs import lease, loop
from django_fencedjobs.models import LEASE_FREE, JobLease, Outcome
from django_fencedjobs.registry import registry
from tests.faults import jobs
from tests.faults.harness import prepare, runs
from tests.faults.jobs import OVERRUN
from tests.testapp.models import Write

pytestmark = pytest.mark.django_db(transaction=True)


def check_revoked(events) -> None:
    (run,) = runs(OVERRUN)
    assert run.outcome == Outcome.TIMED_OUT, run.error
    assert "Timed out" in run.error
    # Revoked: the fence moved on, the lease is free, the failure is counted.
    row = JobLease.objects.get(name=OVERRUN)
    assert row.fence == run.fence + 1
    assert (row.owner, row.lease_until, row.consecutive_failures) == ("", LEASE_FREE, 1)
    with transaction.atomic():
        assert not lease.lock_fence(connection, OVERRUN, run.fence)
    # The handler was interrupted, went on anyway, and its later write failed.
    names = [e["event"] for e in events()]
    assert names == ["wrote", "timeout_delivered", "fence_lost"], events()
    # Nothing written after the timeout committed: only the write made before it.
    assert list(Write.objects.filter(job=OVERRUN).values_list("fence", "seq")) == [(run.fence, 0)]


@pytest.mark.parametrize("mode", ["busy", "sleep"])
def test_overrunning_handler_in_a_worker_is_revoked(spawn, mode):
    prepare(OVERRUN)
    worker = spawn("once", OVERRUN, "W", mode=mode)
    assert worker.wait_exit() == 0, worker.log()
    check_revoked(lambda: [e for e in worker.events() if e["event"] not in ("ready", "go", "exit")])


def test_handler_overrunning_inside_its_transaction_is_revoked_and_rolled_back(spawn):
    """The revocation waits (boundedly: PostgreSQL's lock_timeout, SQLite's busy timeout)
    for the lease row the handler's open transaction holds, interrupts the handler first,
    and revokes once that transaction has rolled back."""
    prepare(OVERRUN)
    worker = spawn("once", OVERRUN, "W", mode="busy_in_transaction")
    assert worker.wait_exit() == 0, worker.log()
    check_revoked(lambda: [e for e in worker.events() if e["event"] not in ("ready", "go", "exit")])


@pytest.mark.parametrize("mode", ["busy", "sleep"])
def test_overrunning_handler_in_process_is_revoked(tmp_path, mode):
    prepare(OVERRUN)
    label = f"in-process-{mode}"
    jobs.CONFIG.update(dir=str(tmp_path), label=label, mode=mode)
    try:
        with registry.isolated():
            jobs.register()
            result = loop.tick([OVERRUN])
    finally:
        jobs.CONFIG.clear()
    assert [r.outcome for r in result.runs] == [Outcome.TIMED_OUT]

    def events() -> list[dict]:
        import json

        lines = (tmp_path / f"events-{label}.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]

    check_revoked(events)
