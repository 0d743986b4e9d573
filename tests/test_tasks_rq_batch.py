"""A run's tasks for RQ are handed over together, and every hand-over is one process's.

With real processes on a throwaway ``redis-server`` and PostgreSQL: a runner
(``runjobs --once``) whose run enqueues :data:`~tests.rq_jobs.FAN_OUT` tasks in one fenced
block, relays (``relay_pending``, a runner's chore) in processes of their own, and a real
``rqworker``.

Why it matters: the batch hand-over builds RQ's jobs itself (one pipeline for the lot), so
its jobs must be the ones django-tasks-rq's own ``enqueue`` makes, or workers would run them
differently; and a task handed over by two processes at once (two runners' relays, or a
relay and the run's own process) would be delivered twice for nothing. The claim of a
hand-over (``relay.claim``) is what keeps them apart: each test below holds the records'
rows locked until both processes wait on them in that very statement, then lets them go.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import connection, transaction
from redis import Redis
from rq import Queue
from rq.job import Job as RQJob

from django_fencedjobs.models import (
    FINISHED_TASK,
    JobRun,
    Outcome,
    RunTask,
    TaskDelivery,
    TaskStatus,
)
from tests.faults.harness import REPO_ROOT, WAIT, wait_until
from tests.rq_jobs import FAN_OUT, HOLD_CLAIM_ENV, RQ_FAN_OUT
from tests.taskapp.backends import KILL_MARKER_ENV
from tests.test_tasks_rq import prepare, run_jobs
from tests.testapp.models import Write

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only]

#: A job's fields that say how RQ runs it (not which call, nor when it was made).
HOW_RUN = (
    "origin",
    "status",
    "meta",
    "success_callback_name",
    "failure_callback_name",
    "timeout",
    "result_ttl",
    "failure_ttl",
    "ttl",
    "stopped_callback_name",
)


def _python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", f"import sys, tests.rq_jobs as m; sys.exit({code})", *args]


def start(env: dict[str, str], code: str, log: Path, *args: str) -> subprocess.Popen[str]:
    with open(log, "w") as out:
        return subprocess.Popen(
            _python(code, *args),
            env=env,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )


def records() -> list[RunTask]:
    return list(RunTask.objects.filter(job=RQ_FAN_OUT).order_by("pk"))


def waiting_on_locks() -> int:
    """Other sessions of this database waiting for a lock (read afresh: inside a
    transaction, the statistics views keep their first snapshot)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def let_go_together(
    begin: Callable[[], list[subprocess.Popen[str]]], logs: list[Path]
) -> list[subprocess.Popen[str]]:
    """Lock every record's row, ``begin()`` the processes, wait until each waits on those
    rows in its claim, then let them all go at once; wait for their ends."""

    def diagnostics() -> str:
        return "\n".join(log.read_text() for log in logs if log.exists())

    with transaction.atomic():
        list(RunTask.objects.filter(job=RQ_FAN_OUT).select_for_update())
        processes = begin()
        wait_until(
            lambda: waiting_on_locks() >= len(processes),
            what="every claim to wait on the rows",
            diagnostics=diagnostics,
        )
    for proc, log in zip(processes, logs, strict=True):
        assert proc.wait(WAIT) == 0, log.read_text()
    return processes


def test_a_runs_rq_tasks_go_over_together_as_the_backends_own_jobs_and_run_once_each(
    rq_env, rq_worker, redis_server
):
    prepare(RQ_FAN_OUT)
    runner = run_jobs(rq_env, RQ_FAN_OUT)
    assert runner.returncode == 0, runner.stdout + runner.stderr
    (run,) = JobRun.objects.filter(job=RQ_FAN_OUT)
    assert run.outcome == Outcome.SUCCEEDED, run.error
    handed = records()
    assert len(handed) == FAN_OUT
    # One hand-over for all of them: one prefix, then each record's own id.
    prefixes = {record.result_id.removesuffix(str(record.pk)) for record in handed}
    assert len(prefixes) == 1 and re.fullmatch(r"fj[0-9a-f]{32}-", prefixes.pop()), prefixes
    assert {record.status for record in handed} == {TaskStatus.READY}
    assert {record.handovers for record in handed} == {1}
    delivered = dict(TaskDelivery.objects.values_list("task_id", "result_id"))
    assert delivered == {record.pk: record.result_id for record in handed}
    conn = Redis.from_url(redis_server.url)
    queue = Queue("default", connection=conn)
    assert queue.job_ids == [record.result_id for record in handed]  # in enqueue order

    # The same job as the backend's own enqueue makes, but for its call.
    plain = subprocess.run(
        _python("m.enqueue_plain_main()"),
        env=rq_env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert plain.returncode == 0, plain.stderr
    own = RQJob.fetch(plain.stdout.strip(), connection=conn)
    ours = RQJob.fetch(handed[0].result_id, connection=conn)
    own_fields, our_fields = own.to_dict(), ours.to_dict()
    assert {key: our_fields.get(key) for key in HOW_RUN} == {
        key: own_fields.get(key) for key in HOW_RUN
    }
    assert (ours.func_name, type(ours)) == (own.func_name, type(own))
    assert (ours.args, ours.kwargs) == ([RQ_FAN_OUT, 0], {})
    queue.remove(own.id)  # a task of no run: not the worker's business here

    run_them_all(rq_worker)


def run_them_all(rq_worker) -> None:
    """A real worker runs every task handed over: each writes once, none is lost."""
    rq_worker("W0")
    wait_until(
        lambda: RunTask.objects.filter(job=RQ_FAN_OUT, status__in=FINISHED_TASK).count() == FAN_OUT,
        # RQ's forking worker forks a process per job: 120 of them take a minute or more on
        # a machine busy with other tests.
        timeout=WAIT * 8,
        what="the worker to run every task",
        diagnostics=rq_worker.logs,
    )
    assert {record.status for record in records()} == {TaskStatus.SUCCESSFUL}
    seqs = Write.objects.filter(job=RQ_FAN_OUT).values_list("seq", flat=True)
    assert sorted(seqs) == list(range(FAN_OUT))


def test_two_relays_at_once_hand_each_task_over_once(rq_env, rq_worker, redis_server, tmp_path):
    # A run's hand-over killed before anything reached Redis: its tasks are pending,
    # for the relays once the grace (1 s) has passed.
    marker = tmp_path / "kill-on-enqueue"
    marker.touch()
    prepare(RQ_FAN_OUT)
    env = {**rq_env, KILL_MARKER_ENV: str(marker), "FENCEDJOBS_TEST_HANDOVER_GRACE": "1"}
    killed = run_jobs(env, RQ_FAN_OUT)
    assert killed.returncode < 0, killed.stdout + killed.stderr
    marker.unlink()
    assert {(r.status, r.handovers) for r in records()} == {(TaskStatus.PENDING, 1)}
    from django_fencedjobs import clock

    latest = max(record.handover_after for record in records())
    wait_until(lambda: clock.now() > latest, what="the hand-over's grace to pass")

    logs = [tmp_path / "relay-a.log", tmp_path / "relay-b.log"]
    let_go_together(lambda: [start(env, "m.relay_main()", log) for log in logs], logs)

    taken = [int(re.search(r"taken (\d+)", log.read_text()).group(1)) for log in logs]
    assert sorted(taken) == [0, FAN_OUT], taken  # the first claim has them all
    assert {(r.status, r.handovers) for r in records()} == {(TaskStatus.READY, 2)}
    per_record = Counter(TaskDelivery.objects.values_list("task_id", flat=True))
    assert set(per_record.values()) == {2}  # the killed hand-over's, and one relay's
    assert Queue("default", connection=Redis.from_url(redis_server.url)).count == FAN_OUT
    run_them_all(rq_worker)


def test_a_relay_racing_a_runs_own_hand_over_leaves_each_task_to_one_of_them(
    rq_env, rq_worker, redis_server, tmp_path
):
    # No grace: the run's tasks are the relay's too the moment they commit.
    hold = tmp_path / "hold-before-claim"
    hold.touch()
    prepare(RQ_FAN_OUT)
    env = {**rq_env, HOLD_CLAIM_ENV: str(hold), "FENCEDJOBS_TEST_HANDOVER_GRACE": "0"}
    logs = [tmp_path / "runner.log", tmp_path / "relay.log"]
    runner = start(env, "m.main(sys.argv[1:])", logs[0], RQ_FAN_OUT)
    wait_until(
        lambda: Path(f"{hold}.reached").exists() or runner.poll() is not None,
        what="the run's hand-over to reach its claim",
    )
    assert runner.poll() is None, logs[0].read_text()
    assert {(r.status, r.handovers) for r in records()} == {(TaskStatus.PENDING, 0)}

    def begin() -> list[subprocess.Popen[str]]:
        hold.unlink()  # the run's claim goes on, to the rows held
        return [runner, start(env, "m.relay_main()", logs[1])]

    let_go_together(begin, logs)

    handed = records()
    assert {(r.status, r.handovers) for r in handed} == {(TaskStatus.READY, 1)}
    assert TaskDelivery.objects.count() == FAN_OUT
    assert len({record.result_id.removesuffix(str(record.pk)) for record in handed}) == 1
    assert Queue("default", connection=Redis.from_url(redis_server.url)).count == FAN_OUT
    (run,) = JobRun.objects.filter(job=RQ_FAN_OUT)
    assert run.outcome == Outcome.SUCCEEDED, run.error
    run_them_all(rq_worker)
