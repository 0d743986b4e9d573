"""Scheduled ``django.tasks`` in one process: ``schedule_task`` and ``run.enqueue`` on the
fake clock (``loop.tick()``), the tasks run by django-tasks-db's worker in this process.

What is checked: a slot enqueues its task once, with its arguments; a run's enqueues are
writes of its fenced transaction (they roll back with it on the database backend; on any
other backend the task is handed over only once it has committed), and of the innermost
savepoint in it (a savepoint that rolls back leaves no task and no record); the run's record
of each task (``RunTask``) follows what the worker reports; inside a task,
``fenced_atomic()`` checks the fence of the run that enqueued it (``FenceLost`` once a later
run of the job has been granted the lease; ``NotInRun`` for a task no run enqueued); and a
daily task in a zone with daylight saving time is enqueued once per slot of its schedule
across both changes.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import random
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import transaction
from django.test import override_settings
from django_tasks_db.management.commands.db_worker import Worker
from django_tasks_db.models import DBTaskResult

from django_fencedjobs import fenced_atomic, job, lease, signals
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.health import State, job_health
from django_fencedjobs.integrations.tasks import schedule_task
from django_fencedjobs.loop import tick
from django_fencedjobs.models import JobLease, JobRun, Outcome, RunTask, TaskStatus
from tests.conftest import JOBS_T0 as T0
from tests.taskapp import tasks
from tests.testapp.models import Write

pytestmark = pytest.mark.django_db(transaction=True)

HOUR = timedelta(hours=1)


def run_worker() -> None:
    """Run every ready task of the database backend, in this process, then return: what
    ``manage.py db_worker --batch`` does (without its signal handlers)."""
    Worker(
        queue_names=["default"],
        interval=0,
        batch=True,
        backend_name="default",
        startup_delay=False,
        max_tasks=None,
        worker_id="test-worker",
        excluded_queue_names=[],
    ).run()


def run_slot(at: datetime) -> list[JobRun]:
    """Move the fake clock to ``at`` and tick; the runs the tick recorded."""
    fake_clock.set(at)
    return tick().runs


def result_of(record: RunTask) -> DBTaskResult:
    return DBTaskResult.objects.get(pk=record.result_id)


def exception_name(result: DBTaskResult) -> str:
    return result.exception_class_path.rsplit(".", 1)[-1]


def checkjobs(*args: str) -> int:
    """``manage.py checkjobs``'s exit status."""
    try:
        call_command("checkjobs", *args, stdout=StringIO(), stderr=StringIO())
    except CommandError as exc:
        return exc.returncode
    return 0


# -- once per slot ----------------------------------------------------------------------------


def test_schedule_task_enqueues_its_task_once_per_slot_with_its_arguments(jobs):
    schedule_task(
        tasks.plain_write,
        "0 * * * *",
        name="t.hourly_task",
        args=["t.hourly_task"],
        kwargs={"seq": 7},
    )
    tick()  # the job is seen: its first slot is the next hour
    for slot in (T0 + HOUR, T0 + 2 * HOUR, T0 + 3 * HOUR):
        assert [r.outcome for r in run_slot(slot + timedelta(seconds=1))] == [Outcome.SUCCEEDED]
        # The same slot, ticked again (another runner, a restart): nothing more.
        assert run_slot(slot + timedelta(minutes=20)) == []

    results = list(DBTaskResult.objects.order_by("enqueued_at"))
    assert len(results) == 3
    assert {r.task_path for r in results} == {"tests.taskapp.tasks.plain_write"}
    assert [r.args_kwargs for r in results] == [
        {"args": ["t.hourly_task"], "kwargs": {"seq": 7}}
    ] * 3
    records = list(RunTask.objects.select_related("run").order_by("run__scheduled_for"))
    assert [r.run.scheduled_for for r in records] == [T0 + HOUR, T0 + 2 * HOUR, T0 + 3 * HOUR]
    assert {r.result_id for r in records} == {str(r.pk) for r in results}
    assert [(r.job, r.fence, r.backend) for r in records] == [
        ("t.hourly_task", r.run.fence, "default") for r in records
    ]


def test_a_handler_fans_out_tasks_in_one_fenced_block_and_outside_any(jobs):
    @job("0 * * * *", name="t.fan_out")
    def fan_out(run):
        with fenced_atomic():
            for seq in range(5):
                run.enqueue(tasks.record_write, "t.fan_out", seq)
        for seq in range(5, 10):
            run.enqueue(tasks.record_write, "t.fan_out", seq=seq)

    tick()
    (run,) = run_slot(T0 + HOUR)
    assert run.outcome == Outcome.SUCCEEDED, run.error
    records = list(RunTask.objects.filter(run=run))
    assert len(records) == 10
    assert {(r.job, r.fence, r.status) for r in records} == {("t.fan_out", run.fence, "ready")}
    assert DBTaskResult.objects.count() == 10
    assert {str(pk) for pk in DBTaskResult.objects.values_list("pk", flat=True)} == {
        r.result_id for r in records
    }

    run_worker()
    assert sorted(Write.objects.filter(job="t.fan_out").values_list("seq", flat=True)) == list(
        range(10)
    )
    assert set(RunTask.objects.values_list("status", flat=True)) == {TaskStatus.SUCCESSFUL}


def test_an_enqueue_in_a_fenced_block_that_raises_rolls_back_the_task_and_its_record(jobs):
    @job("0 * * * *", name="t.rolled_back")
    def rolled_back(run):
        try:
            with fenced_atomic():
                run.enqueue(tasks.record_write, "t.rolled_back", 1)
                raise RuntimeError("after the enqueue")
        except RuntimeError:
            pass
        run.enqueue(tasks.record_write, "t.rolled_back", 2)

    tick()
    (run,) = run_slot(T0 + HOUR)
    assert run.outcome == Outcome.SUCCEEDED, run.error
    (result,) = DBTaskResult.objects.all()
    assert result.args_kwargs == {"args": ["t.rolled_back", 2], "kwargs": {}}
    (record,) = RunTask.objects.all()
    assert record.result_id == str(result.pk)


def test_a_handler_that_fails_after_enqueueing_in_its_block_leaves_no_task(jobs):
    @job("0 * * * *", name="t.failed_run")
    def failed_run(run):
        with fenced_atomic():
            run.enqueue(tasks.record_write, "t.failed_run", 1)
            raise RuntimeError("the handler failed")

    tick()
    (run,) = run_slot(T0 + HOUR)
    assert run.outcome == Outcome.FAILED
    assert DBTaskResult.objects.count() == 0
    assert RunTask.objects.count() == 0


# -- other backends: handed over after the commit ---------------------------------------------


def test_on_the_immediate_backend_the_task_runs_after_the_commit(jobs):
    tasks.NOTES.clear()
    seen = {}

    @job("0 * * * *", name="t.immediate")
    def immediate(run):
        with fenced_atomic():
            run.enqueue(tasks.immediate_note, "t.immediate", 1)
            seen["in block"] = list(tasks.NOTES)
        seen["after block"] = list(tasks.NOTES)
        run.enqueue(tasks.immediate_note, "t.immediate", 2)  # in a fenced block of its own
        seen["outside any block"] = list(tasks.NOTES)

    tick()
    (run,) = run_slot(T0 + HOUR)
    assert run.outcome == Outcome.SUCCEEDED, run.error
    # Handed over once the block's transaction had committed: no transaction open then.
    assert seen == {
        "in block": [],
        "after block": [("t.immediate", 1, False)],
        "outside any block": [("t.immediate", 1, False), ("t.immediate", 2, False)],
    }
    # Their fenced writes committed (checked against the run's fence, as it still held).
    assert sorted(Write.objects.filter(job="t.immediate").values_list("seq", flat=True)) == [1, 2]
    records = list(RunTask.objects.order_by("id"))
    assert [(r.backend, r.status, r.fence) for r in records] == [
        ("immediate", "successful", run.fence)
    ] * 2
    assert all(r.result_id and r.finished_at is not None for r in records)


def test_on_the_immediate_backend_a_rolled_back_block_never_runs_its_task(jobs):
    tasks.NOTES.clear()

    @job("0 * * * *", name="t.immediate_rolled_back")
    def immediate_rolled_back(run):
        try:
            with fenced_atomic():
                run.enqueue(tasks.immediate_note, "t.immediate_rolled_back", 1)
                raise RuntimeError("after the enqueue")
        except RuntimeError:
            pass

    tick()
    (run,) = run_slot(T0 + HOUR)
    assert run.outcome == Outcome.SUCCEEDED, run.error
    assert tasks.NOTES == []
    assert Write.objects.count() == 0
    assert RunTask.objects.count() == 0


# -- the run's record follows the task --------------------------------------------------------


def test_a_tasks_record_follows_the_worker_ready_then_successful_or_failed(jobs):
    @job("0 * * * *", name="t.outcomes")
    def outcomes(run):
        run.enqueue(tasks.record_write, "t.outcomes", 1)
        run.enqueue(tasks.fail, "the task broke")

    tick()
    (run,) = run_slot(T0 + HOUR)
    assert run.outcome == Outcome.SUCCEEDED, run.error
    written, failed = RunTask.objects.order_by("id")
    assert (written.status, failed.status) == (TaskStatus.READY, TaskStatus.READY)
    assert written.started_at is None and written.finished_at is None

    run_worker()
    written.refresh_from_db()
    failed.refresh_from_db()
    assert written.status == TaskStatus.SUCCESSFUL, written.error
    assert written.started_at is not None and written.finished_at is not None
    assert written.error == ""
    assert failed.status == TaskStatus.FAILED
    assert "RuntimeError: the task broke" in failed.error
    assert failed.finished_at is not None
    assert result_of(written).status == "SUCCESSFUL"
    assert result_of(failed).status == "FAILED"


def finished_runs(received: list[dict]) -> list[tuple[int, bool]]:
    return [(kwargs["record"].pk, kwargs["failed"]) for kwargs in received]


@pytest.fixture
def tasks_finished():
    """The ``run_tasks_finished`` signals sent during the test (their keyword arguments)."""
    received: list[dict] = []

    def receive(sender, **kwargs):
        received.append(kwargs)

    signals.run_tasks_finished.connect(receive, dispatch_uid="test_tasks.tasks_finished")
    yield received
    signals.run_tasks_finished.disconnect(dispatch_uid="test_tasks.tasks_finished")


def test_run_tasks_finished_is_sent_once_when_the_workers_finish_a_runs_last_task(
    jobs, tasks_finished
):
    @job("0 * * * *", name="t.last_task")
    def last_task(run):
        run.enqueue(tasks.record_write, "t.last_task", 1)
        run.enqueue(tasks.fail, "one of them broke")

    tick()
    (run,) = run_slot(T0 + HOUR)
    assert tasks_finished == []
    run_worker()
    assert finished_runs(tasks_finished) == [(run.pk, True)]


def test_run_tasks_finished_is_sent_for_a_task_handed_over_after_the_commit(jobs, tasks_finished):
    tasks.NOTES.clear()

    @job("0 * * * *", name="t.last_immediate")
    def last_immediate(run):
        run.enqueue(tasks.immediate_note, "t.last_immediate", 1)

    tick()
    (run,) = run_slot(T0 + HOUR)
    assert RunTask.objects.get(run=run).status == TaskStatus.SUCCESSFUL
    assert finished_runs(tasks_finished) == [(run.pk, False)]


def test_a_task_a_fast_worker_finished_before_its_id_was_recorded_reads_finished(
    jobs, tasks_finished
):
    """A backend that does not write to the lease database: the runner records the task's id
    after the backend returned it. A worker that starts and finishes the task before that
    reports to no record; the run's record must still end as the task did (and the run's
    last task be announced), not as the runner last read it."""
    fast = {"BACKEND": "tests.taskapp.backends.FastWorkerBackend"}
    with override_settings(TASKS={**settings.TASKS, "fast": fast}):
        on_fast_worker = tasks.plain_write.using(backend="fast")

        @job("0 * * * *", name="t.fast_worker")
        def fast_worker(run):
            run.enqueue(on_fast_worker, "t.fast_worker", 1)

        tick()
        (run,) = run_slot(T0 + HOUR)
    assert run.outcome == Outcome.SUCCEEDED, run.error
    record = RunTask.objects.get(run=run)
    assert record.result_id
    assert record.status == TaskStatus.SUCCESSFUL, record.status
    assert record.finished_at is not None
    assert finished_runs(tasks_finished) == [(run.pk, False)]


# -- the fence inside the task ----------------------------------------------------------------


def test_a_task_no_run_enqueued_gets_not_in_run_from_fenced_atomic(jobs):
    result = tasks.record_write.enqueue("t.no_run", 1)
    run_worker()
    stored = DBTaskResult.objects.get(pk=result.id)
    assert stored.status == "FAILED"
    assert exception_name(stored) == "NotInRun", stored.traceback
    assert Write.objects.count() == 0
    assert RunTask.objects.count() == 0


def test_a_task_no_run_enqueued_gets_not_in_run_on_the_immediate_backend(jobs):
    result = tasks.immediate_write.enqueue("t.no_run", 1)
    assert result.status == "FAILED"
    assert result.errors[-1].exception_class_path.endswith(".NotInRun")
    assert Write.objects.count() == 0


def test_a_task_commits_after_its_run_ended_and_fails_once_a_later_run_was_granted(jobs):
    @job("0 * * * *", name="t.fenced_task")
    def fenced_task(run):
        run.enqueue(tasks.record_write, "t.fenced_task", run.fence)

    tick()
    (first,) = run_slot(T0 + HOUR)
    # Nothing later yet: the first run's task, run after its run ended, commits.
    run_worker()
    assert list(Write.objects.values_list("seq", flat=True)) == [first.fence]

    (second,) = run_slot(T0 + 2 * HOUR)
    (third,) = run_slot(T0 + 3 * HOUR)
    assert first.fence < second.fence < third.fence
    # The second run's task runs only after the third run was granted the lease: its fenced
    # write is refused; the third run's own task commits.
    run_worker()
    assert sorted(Write.objects.values_list("seq", flat=True)) == [first.fence, third.fence]
    late = RunTask.objects.get(run=second)
    assert late.status == TaskStatus.FAILED
    assert "FenceLost" in late.error
    assert exception_name(result_of(late)) == "FenceLost"
    assert RunTask.objects.get(run=third).status == TaskStatus.SUCCESSFUL


def test_a_task_of_a_run_taken_over_while_running_fails_with_fence_lost(jobs):
    """The run is taken over (its lease granted to a successor) after it committed its
    enqueue and before it ended: the lease row then carries fence + 1, still held."""

    @job("0 * * * *", name="t.taken_over")
    def taken_over(run):
        run.enqueue(tasks.record_write, "t.taken_over", run.fence)
        seen = lease.read(["t.taken_over"])["t.taken_over"]
        later = fake_clock() + timedelta(days=1)  # past this run's lease, renewed or not
        granted = lease.acquire(
            seen, owner="successor", now=later, ttl=HOUR, next_run_at=seen.next_run_at
        )
        assert granted == run.fence + 1

    tick()
    (run,) = run_slot(T0 + HOUR)
    row = JobLease.objects.get(name="t.taken_over")
    assert (row.fence, row.owner) == (run.fence + 1, "successor")

    run_worker()
    assert Write.objects.count() == 0
    record = RunTask.objects.get()
    assert record.status == TaskStatus.FAILED
    assert exception_name(result_of(record)) == "FenceLost"


# -- an enqueue belongs to the innermost transaction ------------------------------------------


class Skip(Exception):
    """An item (or block) that fails after its enqueues: the block it ends rolls back."""


def item(run, task, name: str, seq: int, *, fails: bool = False) -> None:
    """One item of a handler's loop: its own write, then a task for it."""
    Write.objects.create(job=name, fence=run.fence, seq=seq)
    run.enqueue(task, name, seq)
    if fails:
        raise Skip(seq)


def per_item(run, task, name: str) -> None:
    """A handler enqueueing one task per item, in each way of nesting a block in a fenced
    block; items 1, 3 and 5 commit, every other one rolls back."""
    with fenced_atomic():
        for seq in (1, 2):  # a savepoint per item, item 2's rolled back
            try:
                with transaction.atomic():
                    item(run, task, name, seq, fails=seq == 2)
            except Skip:
                pass
        with fenced_atomic():  # a fenced block nested in the fenced block
            item(run, task, name, 3)
            try:
                with transaction.atomic():
                    item(run, task, name, 4, fails=True)
            except Skip:
                pass
        with transaction.atomic(savepoint=False):  # joins the fenced block, commits with it
            item(run, task, name, 5)
        try:
            with transaction.atomic():
                with transaction.atomic(savepoint=False):  # joins the savepoint, fails in it
                    item(run, task, name, 6, fails=True)
        except Skip:
            pass
        try:
            with transaction.atomic():
                with transaction.atomic():  # released into its parent...
                    item(run, task, name, 7)
                raise Skip(7)  # ... which then rolls back
        except Skip:
            pass
        try:
            with transaction.atomic():
                with fenced_atomic():
                    item(run, task, name, 8)
                raise Skip(8)
        except Skip:
            pass


COMMITTED = [1, 3, 5]


def item_writes(name: str) -> list[int]:
    return sorted(Write.objects.filter(job=name).exclude(fence=-1).values_list("seq", flat=True))


def task_writes(name: str) -> list[int]:
    return sorted(Write.objects.filter(job=name, fence=-1).values_list("seq", flat=True))


def test_on_the_immediate_backend_a_task_enqueued_in_a_rolled_back_savepoint_never_runs(jobs):
    tasks.NOTES.clear()
    job("0 * * * *", name="t.items_immediate")(
        lambda run: per_item(run, tasks.immediate_note, "t.items_immediate")
    )

    tick()
    (run,) = run_slot(T0 + HOUR)
    assert run.outcome == Outcome.SUCCEEDED, run.error
    assert item_writes("t.items_immediate") == COMMITTED
    # Only the committed items' tasks ran, and each has a record that says so.
    assert sorted(seq for _, seq, _ in tasks.NOTES) == COMMITTED
    assert task_writes("t.items_immediate") == COMMITTED
    records = list(RunTask.objects.all())
    assert len(records) == len(COMMITTED)
    assert {(r.run_id, r.backend, r.status) for r in records} == {
        (run.pk, "immediate", TaskStatus.SUCCESSFUL)
    }


def test_on_the_database_backend_a_rolled_back_savepoint_leaves_no_task_no_record_and_no_lateness(
    jobs,
):
    job("0 * * * *", name="t.items_db")(lambda run: per_item(run, tasks.record_write, "t.items_db"))

    tick()
    (run,) = run_slot(T0 + HOUR)
    assert run.outcome == Outcome.SUCCEEDED, run.error
    assert item_writes("t.items_db") == COMMITTED
    # A queue row and a record for each committed item, no other: none without the other.
    assert sorted(r.args_kwargs["args"][1] for r in DBTaskResult.objects.all()) == COMMITTED
    records = list(RunTask.objects.all())
    assert {r.result_id for r in records} == {
        str(pk) for pk in DBTaskResult.objects.values_list("pk", flat=True)
    }
    assert len(records) == len(COMMITTED)

    run_worker()
    assert task_writes("t.items_db") == COMMITTED
    assert set(RunTask.objects.values_list("status", flat=True)) == {TaskStatus.SUCCESSFUL}
    # Past the slot's deadline for its tasks (the run's timeout, 30 minutes, plus its grace,
    # 5), before the next slot's: the job is healthy, and checkjobs says so.
    fake_clock.set(T0 + HOUR + timedelta(minutes=36))
    assert job_health("t.items_db").state == State.OK
    assert checkjobs("--job", "t.items_db") == 0


@pytest.mark.parametrize("backend", ["immediate", "database"])
def test_an_enqueue_in_a_failed_block_joined_without_a_savepoint_rolls_back_with_the_fenced_block(
    jobs, backend
):
    """``atomic(savepoint=False)`` fails, and the handler catches the error inside the fenced
    block: Django rolls the whole block back when it ends, enqueues included, as it would
    without them."""
    tasks.NOTES.clear()
    task = tasks.immediate_note if backend == "immediate" else tasks.record_write

    @job("0 * * * *", name="t.joined_failed")
    def joined_failed(run):
        with fenced_atomic():
            item(run, task, "t.joined_failed", 1)
            try:
                with transaction.atomic(savepoint=False):
                    item(run, task, "t.joined_failed", 2, fails=True)
            except Skip:
                pass

    tick()
    (run,) = run_slot(T0 + HOUR)
    assert run.outcome == Outcome.SUCCEEDED, run.error
    run_worker()
    assert Write.objects.count() == 0
    assert tasks.NOTES == []
    assert DBTaskResult.objects.count() == 0
    assert RunTask.objects.count() == 0


Program = list[tuple[Any, ...]]


def random_program(
    rng: random.Random, depth: int = 0, seqs: Iterator[int] | None = None
) -> Program:
    """Items and blocks nested in each other at random: ``("item", seq)``, or
    ``("block", kind, body, fails)`` where kind is a savepoint (``atomic``), a block joined
    without one (``joined``) or a nested ``fenced`` block; a block that fails raises at its
    end, after its body."""
    seqs = seqs if seqs is not None else itertools.count(1)
    program: Program = []
    for _ in range(rng.randint(1, 4)):
        if depth < 3 and rng.random() < 0.5:
            kind = rng.choice(["atomic", "joined", "fenced"])
            body = random_program(rng, depth + 1, seqs)
            program.append(("block", kind, body, rng.random() < (0.1 if kind == "joined" else 0.3)))
        else:
            program.append(("item", next(seqs)))
    return program


def execute(run, task, program: Program) -> None:
    """Run ``program``: each item writes and enqueues as :func:`item` does. The error of a
    failed block is caught right outside it, but for a block joined without a savepoint,
    whose error fails the block around it (Django could not roll back less)."""
    for node in program:
        if node[0] == "item":
            item(run, task, "t.nested", node[1])
            continue
        _, kind, body, fails = node
        block = {
            "atomic": transaction.atomic,
            "joined": functools.partial(transaction.atomic, savepoint=False),
            "fenced": fenced_atomic,
        }[kind]()
        with contextlib.suppress(Skip) if kind != "joined" else contextlib.nullcontext():
            with block:
                execute(run, task, body)
                if fails:
                    raise Skip(kind)


@pytest.mark.parametrize("backend", ["immediate", "database"])
def test_in_any_nesting_a_task_stands_exactly_when_the_write_beside_it_commits(jobs, backend):
    """Seeded random nestings of savepoints, joined blocks and fenced blocks in a fenced
    block, some failing: an item's task (its record, its queue row, its run on the
    immediate backend) exists exactly when the item's own write committed."""
    task = tasks.immediate_note if backend == "immediate" else tasks.record_write
    program: dict[str, Program] = {}
    job("0 * * * *", name="t.nested")(lambda run: execute(run, task, program["now"]))
    tick()
    for seed in range(40):
        rng = random.Random(seed)
        program["now"] = [("block", "fenced", random_program(rng), False)]
        tasks.NOTES.clear()
        for model in (Write, RunTask, DBTaskResult):
            model.objects.all().delete()

        (run,) = run_slot(T0 + (seed + 1) * HOUR)
        assert run.outcome == Outcome.SUCCEEDED, run.error
        committed = item_writes("t.nested")
        assert RunTask.objects.count() == len(committed), (seed, program)
        if backend == "immediate":
            assert sorted(seq for _, seq, _ in tasks.NOTES) == committed, (seed, program)
        else:
            queued = DBTaskResult.objects.all()
            assert sorted(r.args_kwargs["args"][1] for r in queued) == committed, (seed, program)
            assert {r.result_id for r in RunTask.objects.all()} == {str(r.pk) for r in queued}


# -- daylight saving time ---------------------------------------------------------------------


NEW_YORK = ZoneInfo("America/New_York")


@pytest.mark.parametrize(
    ("cron", "start"),
    [
        # 2026-03-08: 02:00 EST jumps to 03:00 EDT; 02:30 does not exist that day.
        ("30 2 * * *", datetime(2026, 3, 6, 12, tzinfo=UTC)),
        # 2026-11-01: 02:00 EDT falls back to 01:00 EST.
        ("30 2 * * *", datetime(2026, 10, 30, 12, tzinfo=UTC)),
        # The same day, 01:30 comes twice on the wall clock.
        ("30 1 * * *", datetime(2026, 10, 30, 12, tzinfo=UTC)),
    ],
    ids=["spring-forward", "fall-back", "fall-back-repeated-hour"],
)
def test_a_daily_task_across_a_dst_change_is_enqueued_once_per_slot(jobs, cron, start):
    declared = schedule_task(
        tasks.plain_write,
        cron,
        timezone="America/New_York",
        name="t.daily",
        args=["t.daily", 0],
    )
    fake_clock.set(start)
    tick()
    end = start + timedelta(days=4)
    at = start
    while at < end:
        at += timedelta(minutes=15)
        run_slot(at)

    expected = declared.valid_schedule.fire_times(start, end)
    # One slot per local day, none missing and none doubled, as the schedule defines them.
    days = [slot.astimezone(NEW_YORK).date() for slot in expected]
    assert len(days) == 4 and len(set(days)) == 4, expected
    slots = list(
        RunTask.objects.order_by("run__scheduled_for").values_list("run__scheduled_for", flat=True)
    )
    assert slots == expected
    assert DBTaskResult.objects.count() == len(expected)
    assert Counter(JobRun.objects.values_list("outcome", flat=True)) == {
        Outcome.SUCCEEDED: len(expected)
    }
