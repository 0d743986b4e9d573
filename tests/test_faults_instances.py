"""Instances with real runner processes: changes made while a loop runs take effect at its
next look (created, edited, disabled, broken behind ``save()``'s back, deleted), two loops
share a thousand due instances and run each slot once, and a runner SIGKILLed with a batch
of claimed instances in flight leaves none of them stuck.

Instances are created and changed here, in the test process, as an operator or a tenant's
sign-up would: through ``Instances`` (one transaction each with the lease row), or the ORM.
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connection

from django_fencedjobs import db
from django_fencedjobs.instances import Instances
from django_fencedjobs.models import JobInstance, JobLease, JobRun, Outcome
from django_fencedjobs.registry import registry
from tests.faults import jobs
from tests.faults.harness import now, wait_until
from tests.testapp.models import Write

pytestmark = pytest.mark.django_db(transaction=True)

#: Longer than a loop takes to look again (loop.INSTANCES_POLL, 1 s) and to finish a run.
SETTLE = 3.0


@pytest.fixture(autouse=True)
def declared() -> Iterator[None]:
    """The fault jobs, declared in this process too: ``Instances`` checks each instance
    against its declared job, as the runners do."""
    with registry.isolated():
        jobs.register()
        yield


def names_run(worker, instance: str) -> list[dict]:
    return [event for event in worker.events("ran") if event["job"] == instance]


def started_after(name: str, instant) -> list[JobRun]:
    return list(JobRun.objects.filter(job=name, started_at__gt=instant))


def test_changes_made_while_a_loop_runs_take_effect_at_its_next_look(spawn):
    every = Instances(jobs.INSTANCES)
    runner = spawn("loop", jobs.INSTANCES, "A", workers=2)
    runner.wait_for("ready")

    # Created: it runs, with its arguments.
    every.upsert("a", every=timedelta(seconds=1), kwargs={"n": 1})
    every.upsert("c", every=timedelta(seconds=1), kwargs={"n": 30})
    wait_until(lambda: names_run(runner, "faults.instances[a]"), diagnostics=runner.log)

    # Edited: its next runs have the new arguments.
    every.upsert("a", every=timedelta(seconds=1), kwargs={"n": 2})
    wait_until(
        lambda: any(e["n"] == 2 for e in names_run(runner, "faults.instances[a]")),
        what="a run with the edited arguments",
        diagnostics=runner.log,
    )

    # Broken behind save()'s back (a queryset update): paused at its next claim, never run,
    # and the other instances go on.
    JobInstance.objects.filter(key="c").update(kwargs={"no_such_argument": 1})
    wait_until(
        lambda: JobLease.objects.get(name="faults.instances[c]").paused,
        what="the broken instance paused",
        diagnostics=runner.log,
    )
    broken_at = now()

    # Disabled: no run starts after the change committed (one in progress may finish).
    every.set_enabled(["a"], False)
    disabled_at = now()
    before = len(names_run(runner, "faults.instances[a]"))
    every.upsert("b", every=timedelta(seconds=1), kwargs={"n": 3})
    wait_until(lambda: names_run(runner, "faults.instances[b]"), diagnostics=runner.log)

    # Deleted: its lease row goes with it; its runs are kept.
    assert every.delete("b")
    deleted_at = now()
    kept = JobRun.objects.filter(job="faults.instances[b]").count()
    assert kept >= 1
    every.upsert("d", every=timedelta(seconds=1), kwargs={"n": 4})
    wait_until(lambda: names_run(runner, "faults.instances[d]"), diagnostics=runner.log)
    wait_until(
        lambda: (
            JobRun.objects.filter(job="faults.instances[d]", started_at__gt=now()).exists()
            or len(names_run(runner, "faults.instances[d]")) >= 3
        ),
        what="the loop going on past the changes",
        diagnostics=runner.log,
    )

    assert not started_after("faults.instances[a]", disabled_at), runner.log()
    assert len(names_run(runner, "faults.instances[a]")) <= before + 1  # at most one in flight
    assert not started_after("faults.instances[b]", deleted_at), runner.log()
    assert JobRun.objects.filter(job="faults.instances[b]").count() == kept
    assert not started_after("faults.instances[c]", broken_at), runner.log()
    assert "faults.instances[c] is invalid and does not run" in runner.log()
    runner.signal(signal.SIGTERM)
    assert runner.wait_exit() == 0, runner.log()


def test_two_runners_share_a_thousand_due_instances_and_run_each_slot_once(spawn):
    # SQLite takes one writer at a time: 200 of them there keep the test within its
    # time on a busy machine; the thousand are for PostgreSQL, where runners claim side
    # by side.
    count = 1000 if connection.vendor == "postgresql" else 200
    holding = Instances(jobs.HOLDING_INSTANCES)
    for n in range(count):
        # Yearly: no slot of their own falls due while the test runs (an hourly one could,
        # if the test crossed the hour).
        holding.upsert(f"tenant-{n:04d}", cron="0 0 1 1 *", kwargs={"n": n})
    runners = [spawn("loop", jobs.HOLDING_INSTANCES, label, workers=4) for label in "AB"]
    for runner in runners:
        runner.wait_for("ready")

    def logs() -> str:
        return "\n".join(runner.log() for runner in runners)

    for round_ in (1, 2):
        # Every instance due at once: a stampede the two runners drain side by side.
        JobLease.objects.filter(instance__isnull=False).update(next_run_at=now())
        expected = count * round_
        # Every run ended (a run twice, or one that failed, is named by the asserts below).
        wait_until(
            lambda expected=expected: (
                JobRun.objects.exclude(outcome=Outcome.RUNNING).count() >= expected
            ),
            timeout=240,
            what=f"round {round_}: every instance run",
            diagnostics=logs,
        )

    unsucceeded = JobRun.objects.exclude(outcome=Outcome.SUCCEEDED)
    assert not unsucceeded.exists(), list(unsucceeded.values_list("job", "outcome", "error"))
    per_instance = Counter(JobRun.objects.values_list("job", flat=True))
    assert set(per_instance.values()) == {2}
    assert len(per_instance) == count
    writes = Counter(Write.objects.values_list("job", "seq"))
    assert len(writes) == count
    assert set(writes.values()) == {2}  # each run wrote once, no run twice
    # Both took part: the batches were claimed side by side, not by one of them.
    owners = Counter(JobRun.objects.values_list("owner", flat=True))
    assert len(owners) == 2, owners


def test_a_runner_killed_with_a_batch_in_flight_leaves_no_instance_stuck(spawn, tmp_path):
    holding = Instances(jobs.HOLDING_INSTANCES)
    for n in range(6):
        holding.upsert(f"i{n}", every=timedelta(hours=1), kwargs={"n": n, "hold": True})
    JobLease.objects.filter(instance__isnull=False).update(next_run_at=now())
    a = spawn("loop", jobs.HOLDING_INSTANCES, "A", workers=4)
    holding_events = a.wait_for("holding", count=4)
    a.signal(signal.SIGKILL)
    assert a.wait_exit() == -signal.SIGKILL
    killed = {event["job"]: event["fence"] for event in holding_events}
    assert len(killed) == 4

    # B is let through at once; the four claimed by A wait for A's lease to run out.
    (tmp_path / "release-B").touch()
    b = spawn("loop", jobs.HOLDING_INSTANCES, "B", workers=4)
    b.wait_for("ready")
    untouched = {f"faults.holding_instances[i{n}]" for n in range(6)} - set(killed)
    wait_until(
        lambda: JobRun.objects.filter(job__in=untouched, outcome=Outcome.SUCCEEDED).count() == 2,
        what="the two instances A never claimed run on B",
        diagnostics=lambda: a.log() + b.log(),
    )
    # Each of A's four at its next slot (made due now, as "run now" would): taken over once
    # its lease ran out, the dead run marked abandoned, nothing of it written.
    wait_until(
        lambda: all(
            row.lease_until < now()
            for row in JobLease.objects.filter(name__in=killed, instance__isnull=False)
        ),
        what="the leases of the killed runs to run out",
    )
    JobLease.objects.filter(name__in=killed).update(next_run_at=now())
    wait_until(
        lambda: JobRun.objects.filter(job__in=killed, outcome=Outcome.SUCCEEDED).count() == 4,
        what="A's four instances run again on B",
        diagnostics=lambda: a.log() + b.log(),
    )
    for name, fence in killed.items():
        dead = JobRun.objects.using(db.lease_db()).get(job=name, fence=fence)
        assert dead.outcome == Outcome.ABANDONED
        assert not Write.objects.filter(job=name, fence=fence).exists()
        assert Write.objects.filter(job=name).count() == 1
    b.signal(signal.SIGTERM)
    assert b.wait_exit() == 0, b.log()


@pytest.mark.postgres_only
def test_a_run_of_a_deleted_instance_writes_nothing_once_it_is_created_again(spawn, tmp_path):
    # A runs the instance and is SIGSTOPped before its fenced block; the instance is deleted
    # and created again under the same key (a new lease row); B runs the new one. A's fence
    # must not be the new row's: resumed, A's write is refused and B's run is undisturbed.
    holding = Instances(jobs.HOLDING_INSTANCES)
    name = f"{jobs.HOLDING_INSTANCES}[again]"
    holding.upsert("again", every=timedelta(hours=1), kwargs={"n": 1, "hold": True})
    JobLease.objects.filter(name=name).update(next_run_at=now())
    a = spawn("loop", jobs.HOLDING_INSTANCES, "A", workers=1)
    old_fence = a.wait_for("holding")[0]["fence"]
    a.signal(signal.SIGSTOP)

    assert holding.delete("again")
    holding.upsert("again", every=timedelta(hours=1), kwargs={"n": 2, "hold": True})
    JobLease.objects.filter(name=name).update(next_run_at=now())
    b = spawn("loop", jobs.HOLDING_INSTANCES, "B", workers=1)
    new_fence = b.wait_for("holding")[0]["fence"]
    assert new_fence > old_fence

    (tmp_path / "release-A").touch()
    a.signal(signal.SIGCONT)
    # Read abandoned meanwhile, perhaps (a loop's beat records a run whose row is gone),
    # until its own end says what happened to it.
    wait_until(
        lambda: JobRun.objects.filter(
            job=name, fence=old_fence, outcome=Outcome.FENCE_LOST
        ).exists(),
        what="the deleted instance's run to end, its fence lost",
        diagnostics=lambda: a.log() + b.log(),
    )
    old = JobRun.objects.get(job=name, fence=old_fence)
    assert old.outcome == Outcome.FENCE_LOST, (old.outcome, old.error)
    assert not Write.objects.filter(job=name, seq=1).exists()
    # B still holds its lease, untouched by A's supervisor and end.
    row = JobLease.objects.get(name=name)
    assert (row.fence, row.owner != "") == (new_fence, True)

    (tmp_path / "release-B").touch()
    wait_until(
        lambda: JobRun.objects.filter(
            job=name, fence=new_fence, outcome=Outcome.SUCCEEDED
        ).exists(),
        what="the new instance's run to succeed",
        diagnostics=lambda: a.log() + b.log(),
    )
    assert list(Write.objects.filter(job=name).values_list("seq", "fence")) == [(2, new_fence)]
    for worker in (a, b):
        worker.signal(signal.SIGTERM)
        assert worker.wait_exit() == 0, worker.log()
