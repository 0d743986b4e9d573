"""The outbox of tasks handed over after the commit: the relay hands a pending task over
until its backend takes it, with backoff, or records it failed; and a second delivery of
a task whose first delivery wrote writes nothing. In process, on the fake clock.
(Real processes: tests/test_tasks_faults.py, a runner killed between the commit and the
hand-over.)"""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest

from django_fencedjobs import clock, fenced_atomic, job, loop
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.exceptions import DuplicateDelivery
from django_fencedjobs.fencing import reset_current_holder, set_current_holder
from django_fencedjobs.integrations import relay
from django_fencedjobs.integrations import tasks as integration
from django_fencedjobs.models import RunTask, TaskDelivery, TaskStatus
from tests.taskapp import tasks
from tests.taskapp.backends import FlakyBackend
from tests.testapp.models import Write

pytestmark = pytest.mark.django_db(transaction=True)


def _declare(task):
    @job("0 * * * *", name="t.relayed")
    def relayed(run):
        run.enqueue(task, "t.relayed", 1)

    loop.tick()  # its row
    fake_clock.advance(timedelta(hours=1))
    return relayed


@pytest.fixture
def flaky():
    yield FlakyBackend
    FlakyBackend.refusals = 0


def test_a_task_the_backend_refuses_is_relayed_with_backoff_until_taken(jobs, flaky):
    flaky.refusals = 2
    _declare(tasks.flaky_write)
    loop.tick()  # the run commits its task; the hand-over right after is refused
    (record,) = RunTask.objects.all()
    assert (record.status, record.handovers) == (TaskStatus.PENDING, 1)
    assert "ConnectionError: the broker is down" in record.error
    assert record.handover_after - clock.now() == relay.BACKOFF
    assert integration.relay_pending() == 0  # not due yet

    fake_clock.advance(relay.BACKOFF)
    assert integration.relay_pending() == 0  # refused again: the wait doubles
    record.refresh_from_db()
    assert (record.handovers, record.handover_after - clock.now()) == (2, 2 * relay.BACKOFF)

    fake_clock.advance(2 * relay.BACKOFF)
    assert integration.relay_pending() == 1
    record.refresh_from_db()
    assert (record.status, record.handovers, record.error) == (TaskStatus.SUCCESSFUL, 3, "")
    assert TaskDelivery.objects.filter(task_id=record.pk).count() == 1
    assert Write.objects.filter(job="t.relayed").count() == 1


def test_a_task_never_taken_is_recorded_failed_with_the_reason(jobs, flaky):
    flaky.refusals = 100
    _declare(tasks.flaky_write)
    loop.tick()
    for _ in range(relay.MAX_HANDOVERS):
        fake_clock.advance(timedelta(hours=1))
        integration.relay_pending()
    (record,) = RunTask.objects.all()
    assert record.status == TaskStatus.FAILED
    assert record.handovers == relay.MAX_HANDOVERS
    assert f"Not enqueued after {relay.MAX_HANDOVERS} hand-overs" in record.error
    assert "the broker is down" in record.error
    assert not Write.objects.exists()


def _deliver_again(record: RunTask) -> SimpleNamespace:
    """What a worker holds when the backend delivers ``record``'s task a second time under
    the same id (a broker's redelivery): its start, a fenced block, its end."""
    result = SimpleNamespace(
        backend=record.backend,
        id=record.result_id,
        status=integration.TaskResultStatus.RUNNING,
        started_at=None,
        finished_at=None,
        errors=[],
    )
    integration._task_started(type(None), task_result=result)
    return result


def test_a_second_delivery_of_a_task_that_wrote_writes_nothing_and_is_counted(jobs):
    _declare(tasks.immediate_write)
    loop.tick()
    (record,) = RunTask.objects.all()
    assert record.status == TaskStatus.SUCCESSFUL and record.executor  # claimed by its run
    result = _deliver_again(record)
    with pytest.raises(DuplicateDelivery), fenced_atomic():
        Write.objects.create(job="t.relayed", fence=-1, seq=2)
    result.status = integration.TaskResultStatus.FAILED
    integration._task_finished(type(None), task_result=result)
    record.refresh_from_db()
    assert (record.status, record.duplicates) == (TaskStatus.SUCCESSFUL, 1)
    assert list(Write.objects.values_list("seq", flat=True)) == [1]


def test_a_redelivery_after_a_later_run_took_the_lease_writes_nothing_and_is_counted(jobs):
    # Its first execution wrote; the next slot's run has had the lease since: the fence
    # check fails, and the delivery is still what it is, a duplicate.
    _declare(tasks.immediate_write)
    loop.tick()
    (record,) = RunTask.objects.all()
    fake_clock.advance(timedelta(hours=1))
    loop.tick()  # the next slot's run: the lease and the fence move on
    assert RunTask.objects.count() == 2
    result = _deliver_again(record)
    with pytest.raises(DuplicateDelivery), fenced_atomic():
        Write.objects.create(job="t.relayed", fence=-1, seq=3)
    result.status = integration.TaskResultStatus.FAILED
    integration._task_finished(type(None), task_result=result)
    record.refresh_from_db()
    assert (record.status, record.duplicates) == (TaskStatus.SUCCESSFUL, 1)
    assert list(Write.objects.values_list("seq", flat=True)) == [1, 1]


def test_a_delivery_whose_first_execution_wrote_nothing_is_not_a_duplicate(jobs):
    # The first execution's fenced block rolled back (its worker died, or it failed):
    # the task's writes are not claimed, and a redelivery writes them.
    _declare(tasks.immediate_write)
    loop.tick()
    (record,) = RunTask.objects.all()
    RunTask.objects.filter(pk=record.pk).update(executor="")
    Write.objects.all().delete()
    fence = integration.TaskFence(backend=record.backend, result_id=record.result_id)
    token = set_current_holder(fence)
    try:
        with fenced_atomic():
            Write.objects.create(job="t.relayed", fence=-1, seq=1)
    finally:
        reset_current_holder(token)
    record.refresh_from_db()
    assert record.executor == fence.executor and record.duplicates == 0
    assert Write.objects.count() == 1


def test_a_start_reported_before_the_hand_over_recorded_the_id_is_kept_by_the_end(jobs, flaky):
    # A worker quicker than the runner: it starts the task before the runner has recorded
    # the task's id, so its start finds no record; its end, which does, keeps the start.
    flaky.refusals = 1
    _declare(tasks.flaky_write)
    loop.tick()  # the task is committed, not handed over yet
    (record,) = RunTask.objects.all()
    started = clock.now()
    result = SimpleNamespace(
        backend=record.backend,
        id="quick",
        status=integration.TaskResultStatus.RUNNING,
        started_at=started,
        finished_at=None,
        errors=[],
    )
    integration._task_started(type(None), task_result=result)
    RunTask.objects.filter(pk=record.pk).update(result_id="quick", status=TaskStatus.READY)
    fake_clock.advance(timedelta(seconds=3))
    result.status = integration.TaskResultStatus.SUCCESSFUL
    result.finished_at = clock.now()
    integration._task_finished(type(None), task_result=result)
    record.refresh_from_db()
    assert record.status == TaskStatus.SUCCESSFUL
    assert (record.started_at, record.finished_at) == (started, result.finished_at)


def test_a_task_recorded_failed_then_run_again_successfully_reads_successful(jobs):
    # Its first execution died; the backend's cleanup reported it failed; an operator
    # requeued it and it ran to its end. (No other report moves a finished record.)
    _declare(tasks.immediate_write)
    loop.tick()
    (record,) = RunTask.objects.all()
    RunTask.objects.filter(pk=record.pk).update(
        status=TaskStatus.FAILED, error="the worker died", executor=""
    )
    result = _deliver_again(record)
    with fenced_atomic():
        Write.objects.create(job="t.relayed", fence=-1, seq=2)
    result.status = integration.TaskResultStatus.SUCCESSFUL
    integration._task_finished(type(None), task_result=result)
    record.refresh_from_db()
    assert (record.status, record.error, record.duplicates) == (TaskStatus.SUCCESSFUL, "", 0)
    # A failure reported after a success does not take it back.
    result.status = integration.TaskResultStatus.FAILED
    integration._task_finished(type(None), task_result=result)
    record.refresh_from_db()
    assert record.status == TaskStatus.SUCCESSFUL


def _outbox(n: int) -> list[RunTask]:
    """``n`` committed outbox records of one run of ``t.relayed``, none handed over."""
    from django_fencedjobs.models import JobRun

    run = JobRun.objects.create(job="t.relayed", scheduled_for=clock.now(), fence=1)
    return RunTask.objects.bulk_create(
        RunTask(
            run=run,
            job="t.relayed",
            fence=1,
            task_path="tests.taskapp.tasks.flaky_write",
            backend="flaky",
            status=TaskStatus.PENDING,
            call={"args": ["t.relayed", i], "kwargs": {}},
            handover_after=clock.now(),
        )
        for i in range(n)
    )


def test_a_hand_over_is_claimed_once_whoever_claims_it_with_the_same_count(jobs):
    records = _outbox(3)
    first = relay.claim(records)
    assert [record.handovers for record in first] == [1, 1, 1]
    # Another process that read the records before this claim (count 0) gets none.
    stale = [RunTask.objects.get(pk=record.pk) for record in records]
    for record in stale:
        record.handovers = 0
    assert relay.claim(stale) == []
    assert set(RunTask.objects.values_list("handovers", flat=True)) == {1}
    # The next hand-over, by the count read now, is claimed again.
    assert len(relay.claim(list(RunTask.objects.all()))) == 3
    # A record no longer pending is nobody's to hand over.
    RunTask.objects.filter(pk=records[0].pk).update(status=TaskStatus.READY)
    assert {r.pk for r in relay.claim(list(RunTask.objects.all()))} == {
        records[1].pk,
        records[2].pk,
    }


def test_a_batch_marked_handed_over_keeps_what_a_worker_reported_first(jobs):
    ahead, behind = relay.claim(_outbox(2))
    # A worker that was quicker than the mark: its task already failed, with its reason.
    RunTask.objects.filter(pk=ahead.pk).update(status=TaskStatus.FAILED, error="it broke")
    RunTask.objects.filter(pk=behind.pk).update(error="Hand-over 1: the broker was down")
    relay.delivered([ahead, behind], "fjabc-")
    ahead.refresh_from_db()
    behind.refresh_from_db()
    assert (ahead.result_id, ahead.status, ahead.error) == (
        f"fjabc-{ahead.pk}",
        TaskStatus.FAILED,
        "it broke",
    )
    assert (behind.result_id, behind.status, behind.error) == (
        f"fjabc-{behind.pk}",
        TaskStatus.READY,
        "",
    )


def test_each_delivery_of_a_batch_is_recorded_under_its_own_tasks_backend(jobs):
    first, second = _outbox(2)
    RunTask.objects.filter(pk=second.pk).update(backend="other")
    second.refresh_from_db()
    relay.will_deliver([first, second], "fjabc-")
    delivered = dict(TaskDelivery.objects.values_list("result_id", "backend"))
    assert delivered == {f"fjabc-{first.pk}": "flaky", f"fjabc-{second.pk}": "other"}
