"""Fault: several schedulers fire the same slot at the same instant (cron on every web node,
two replicas of a Deployment, an overlapping restart).

Why it matters: a job that runs twice for one slot sends the invoices twice. Each slot must
produce exactly one recorded run and exactly one execution of the handler, however many
``runjobs --once`` processes race for it: acquiring the lease is one conditional UPDATE,
and only one process can win it.

The contenders are real processes held at a barrier (each blocks reading its stdin, with
Django set up and its connection open) and released together.
"""

from __future__ import annotations

from collections import Counter

import pytest

from django_fencedjobs.models import Outcome
from tests.faults.harness import make_due, prepare, runs
from tests.faults.jobs import DOUBLE_FIRE
from tests.testapp.models import Write

pytestmark = pytest.mark.django_db(transaction=True)

CONTENDERS = 4
ROUNDS = 15


def executions(workers, round_: int) -> list[dict]:
    return [e for w in workers for e in w.events("executed") if e["round"] == round_]


def check_one_run_per_slot(workers, rounds: int) -> None:
    recorded = runs(DOUBLE_FIRE)
    assert len(recorded) == rounds, [str(r) for r in recorded]
    assert len({r.scheduled_for for r in recorded}) == rounds
    assert [r.outcome for r in recorded] == [Outcome.SUCCEEDED] * rounds, [
        r.error for r in recorded
    ]
    fences = sorted(e["fence"] for w in workers for e in w.events("executed"))
    assert fences == [r.fence for r in recorded]
    # One committed write per round, by the run that executed it.
    writes = Counter(Write.objects.filter(job=DOUBLE_FIRE).values_list("seq", "fence"))
    assert writes == Counter(
        {(e["round"], e["fence"]): 1 for w in workers for e in w.events("executed")}
    )


def test_simultaneous_once_runs_execute_each_slot_once(spawn):
    """Long-lived contenders, one ``runjobs --once`` each per round, many rounds."""
    prepare(DOUBLE_FIRE, due=False)
    workers = [spawn("rounds", DOUBLE_FIRE, f"W{n}") for n in range(CONTENDERS)]
    for worker in workers:
        worker.wait_for("ready")
    for round_ in range(ROUNDS):
        make_due(DOUBLE_FIRE)
        for worker in workers:
            worker.send(f"go {round_}")
        for worker in workers:
            worker.wait_for("round_done", count=round_ + 1)
        assert len(executions(workers, round_)) == 1, (round_, executions(workers, round_))
    check_one_run_per_slot(workers, ROUNDS)


@pytest.mark.parametrize("round_", range(3))
def test_simultaneous_once_processes_execute_the_slot_once(spawn, round_):
    """Fresh processes, as cron starts them: each runs ``runjobs --once`` and exits."""
    prepare(DOUBLE_FIRE)
    workers = [
        spawn("once", DOUBLE_FIRE, f"P{n}", wait_go=True, round=round_) for n in range(CONTENDERS)
    ]
    for worker in workers:
        worker.wait_for("ready")
    for worker in workers:
        worker.send("go")
    for worker in workers:
        assert worker.wait_exit() == 0, worker.log()
    assert len(executions(workers, round_)) == 1
    check_one_run_per_slot(workers, 1)
