"""P8: scheduled ``django.tasks``: what enqueueing through a run costs, and how late a task
starts on a worker (docs/tasks.md).

**Enqueue cost.** A run's handler enqueues N tasks (N = 1, 100, 10,000) with
``run.enqueue`` inside one ``fenced_atomic()`` block, on django-tasks-db's database backend:
each task's row and the run's record of it commit with the run's transaction. Measured side
by side, alternating, against the same N tasks enqueued by a plain loop of
``task.enqueue()`` on the same backend, two ways:

* **plain loop in one transaction** (``transaction.atomic()``): the least a loop can cost,
  and what the goal is judged against;
* **plain loop, autocommit**: the loop as usually written, one commit per task.

Both are timed for the enqueue block alone (the fenced block of a run that already holds its
lease, against the plain block); the whole run (acquire, the block, record) is timed too,
since that is what one slot costs. Ratio = plain time / fenced time (1.0: the fence and the
records cost nothing). Goal: >= 0.9 at N >= 100.

**Lateness.** One ``runjobs`` loop and one idle ``db_worker`` (``--interval 0.1``), a task
scheduled every 2 s with ``schedule_task``, for 60 s: for each slot, the task's start on the
worker (django-tasks-db's own ``started_at``) minus the slot.

**On RQ** (django-tasks-rq), in the same run, on a throwaway ``redis-server`` this module
starts (tests/redis_harness.py; bench/settings.py adds the ``rq`` backend only then). A
task for RQ is not a write of the run's transaction: ``run.enqueue`` records it as an
outbox row (``pending``, with its call) in the fenced block, and right after the commit the
run's process hands them over together (one claim of the batch, the deliveries' ids, RQ's
jobs in one pipeline, one statement marking them: docs/tasks.md). Measured side by side,
alternating, N = 100 and 10,000:

* **fenced block**: ``run.enqueue`` of an RQ task N times in one ``fenced_atomic()`` block,
  timed to the end of the hand-over after the commit;
* **plain loop**: ``task.enqueue()`` N times to the same RQ queue (no database at all);
* **floor**: what the hand-over does on Redis and nothing else: the same N jobs built by
  RQ's ``enqueue_many`` into one pipeline, no record, no database.

Ratio = plain time / fenced time, as above. Goals: >= 0.9 at N = 100, >= 1.0 at 10,000 (one
pipelined hand-over against a loop of round trips). The floor is the least the hand-over
could cost; floor / fenced is what the records and the fence add to it. N = 100 takes 7
samples of each, N = 10,000 three. The statements on PostgreSQL and the commands to Redis
per task are counted for each (one sample of N = 100, not timed).

Then the lateness of a task every 2 s from one ``runjobs`` loop to one idle real
``rqworker`` (django-tasks-rq's job class, rq's default forking worker), listening before
the first slot: the worker's start of the task (RQ's own ``started_at``) minus the slot,
for 60 s, as for django-tasks-db. Without ``redis-server`` the RQ part is skipped, and the
report says so.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench import common

PREFIX = "bench.p8."
LATENESS_JOB = "bench.p8.every_2s"
RQ_LATENESS_JOB = "bench.p8.rq_every_2s"
#: The Redis server of the RQ part (bench/settings.py reads the same variable).
REDIS_URL_ENV = "FENCEDJOBS_BENCH_REDIS_URL"
#: Why the RQ part was not measured, when it was not (set by :func:`main`).
RQ_SKIPPED_ENV = "FENCEDJOBS_BENCH_RQ_SKIPPED"


def enqueue_cost(smoke: bool) -> tuple[list[list[str]], dict[str, float]]:
    from django.db import transaction
    from django_tasks_db.models import DBTaskResult

    from bench.benchapp.tasks import noop
    from django_fencedjobs import clock, fenced_atomic, job, lease, operations, runner
    from django_fencedjobs.declared import sync as sync_rows
    from django_fencedjobs.fencing import reset_current_holder, set_current_holder
    from django_fencedjobs.models import JobRun, RunTask
    from django_fencedjobs.registry import registry
    from django_fencedjobs.run import Run
    from django_fencedjobs.runstate import RunState

    sizes = [1, 10, 100] if smoke else [1, 100, 10_000]
    rows: list[list[str]] = []
    figures: dict[str, float] = {}
    common.clear_jobs(PREFIX)
    with registry.isolated():
        for n in sizes:
            name = f"{PREFIX}fan_out_{n}"

            def fan_out(run: Run, n: int = n) -> None:
                with fenced_atomic():
                    for i in range(n):
                        run.enqueue(noop, i)

            declared = job(every=timedelta(hours=1), name=name)(fan_out).job  # type: ignore[attr-defined]
            sync_rows([declared], clock.now())

            def whole_run(declared: Any = declared) -> None:
                operations.make_due(declared.name, clock.now())
                record = runner.run_named(declared)
                assert record is not None and record.outcome == "succeeded", record

            # The enqueue block alone, in a run of a second job that holds its lease
            # (taken once, for all the samples).
            held = job(every=timedelta(hours=1), name=f"{name}_held")(fan_out).job  # type: ignore[attr-defined]
            sync_rows([held], clock.now())
            operations.make_due(held.name, clock.now())
            holder = JobRun.objects.create(job=held.name, scheduled_for=clock.now(), fence=0)
            with transaction.atomic():
                fence = lease.acquire(
                    lease.read([held.name])[held.name],
                    owner="bench",
                    now=clock.now(),
                    ttl=timedelta(hours=1),
                    next_run_at=clock.now() + timedelta(hours=1),
                )
            assert fence is not None
            holder.fence = fence
            state = RunState(held, holder, watermarks={})
            run = Run(state, now=clock.now())

            def fenced_block(run: Run = run, state: RunState = state, n: int = n) -> None:
                token = set_current_holder(state)
                try:
                    with fenced_atomic():
                        for i in range(n):
                            run.enqueue(noop, i)
                finally:
                    reset_current_holder(token)

            def plain_block(n: int = n) -> None:
                with transaction.atomic():
                    for i in range(n):
                        noop.enqueue(i)

            def plain_autocommit(n: int = n) -> None:
                for i in range(n):
                    noop.enqueue(i)

            variants = {
                "fenced": fenced_block,
                "plain_tx": plain_block,
                "plain_auto": plain_autocommit,
                "run": whole_run,
            }
            repeats = 2 if smoke else (5 if n >= 10_000 else 9)
            for fn in variants.values():
                fn()  # warm
            samples: dict[str, list[float]] = {key: [] for key in variants}
            for _, key in common.alternate(repeats, list(variants)):
                start = time.perf_counter()
                variants[key]()
                samples[key].append(time.perf_counter() - start)
                if n >= 10_000:  # keep the queue table the same size for every sample
                    DBTaskResult.objects.all().delete()
            medians = {key: common.summarize(values).median for key, values in samples.items()}
            block_ratio = medians["plain_tx"] / medians["fenced"]
            auto_ratio = medians["plain_auto"] / medians["fenced"]
            run_ratio = medians["plain_tx"] / medians["run"]
            rows.append(
                [
                    f"{n:,}",
                    f"{medians['fenced'] * 1000:.2f}",
                    f"{medians['plain_tx'] * 1000:.2f}",
                    f"{medians['plain_auto'] * 1000:.2f}",
                    f"{medians['run'] * 1000:.2f}",
                    f"{block_ratio:.2f}",
                    f"{auto_ratio:.2f}",
                    f"{run_ratio:.2f}",
                    f"{n / medians['fenced']:,.0f}",
                ]
            )
            figures[f"ratio_{n}"] = block_ratio
            figures[f"ratio_auto_{n}"] = auto_ratio
            figures[f"ratio_run_{n}"] = run_ratio
            figures[f"tasks_per_s_{n}"] = n / medians["fenced"]
            lease.end(held.name, fence, succeeded_at=None, failed=False)
            DBTaskResult.objects.all().delete()
            RunTask.objects.all().delete()
    common.clear_jobs(PREFIX)
    return rows, figures


def lateness(smoke: bool) -> tuple[list[float], int, int]:
    """Start one runjobs loop and one db_worker; return the lateness of each slot's task
    start (s), the slots run and the tasks started."""
    from django_tasks_db.models import DBTaskResult

    from django_fencedjobs.models import JobRun, RunTask

    seconds = 12 if smoke else 60
    common.clear_jobs(PREFIX)
    DBTaskResult.objects.all().delete()
    env = common.child_env()
    runner_proc = subprocess.Popen(
        [sys.executable, "-m", "bench.p8_tasks", "--serve-runner"], cwd=common.REPO, env=env
    )
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "django",
            "db_worker",
            "--interval",
            "0.1",
            "--no-startup-delay",
            "--no-reload",
            "--verbosity",
            "0",
        ],
        cwd=common.REPO,
        env=env,
    )
    try:
        time.sleep(seconds)
    finally:
        for proc in (runner_proc, worker):
            proc.send_signal(signal.SIGTERM)
        for proc in (runner_proc, worker):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    late: list[float] = []
    slots = JobRun.objects.filter(job=LATENESS_JOB).count()
    started = {
        str(row.id): row.started_at
        for row in DBTaskResult.objects.exclude(started_at=None).only("id", "started_at")
    }
    for task in RunTask.objects.filter(job=LATENESS_JOB).select_related("run"):
        start = started.get(task.result_id)
        if start is not None:
            late.append((start - task.run.scheduled_for).total_seconds())
    common.clear_jobs(PREFIX)
    return late, slots, len(late)


def serve_runner() -> int:
    """The runner process of the lateness measurement: runjobs over the one scheduled task."""
    common.setup_django()
    from django.core.management import call_command

    from bench.benchapp.tasks import noop
    from django_fencedjobs.integrations.tasks import schedule_task

    schedule_task(noop, every=timedelta(seconds=2), name=LATENESS_JOB, args=[0])
    call_command("runjobs", "--job", LATENESS_JOB, verbosity=0)
    return 0


# -- on RQ ------------------------------------------------------------------------------------


def _held_run(name: str) -> tuple[Any, Any, int]:
    """A run of the job ``name`` (declared here, every hour) that holds its lease, for
    timing a block of its alone: (its ``Run``, its ``RunState``, its fence)."""
    from django.db import transaction

    from django_fencedjobs import clock, job, lease, operations
    from django_fencedjobs.declared import sync as sync_rows
    from django_fencedjobs.models import JobRun
    from django_fencedjobs.run import Run
    from django_fencedjobs.runstate import RunState

    def handler(run: Run) -> None:  # never run: only its lease is held
        return None

    held = job(every=timedelta(hours=1), name=name)(handler).job  # type: ignore[attr-defined]
    sync_rows([held], clock.now())
    operations.make_due(held.name, clock.now())
    holder = JobRun.objects.create(job=held.name, scheduled_for=clock.now(), fence=0)
    with transaction.atomic():
        fence = lease.acquire(
            lease.read([held.name])[held.name],
            owner="bench",
            now=clock.now(),
            ttl=timedelta(hours=1),
            next_run_at=clock.now() + timedelta(hours=1),
        )
    assert fence is not None
    holder.fence = fence
    state = RunState(held, holder, watermarks={})
    return Run(state, now=clock.now()), state, fence


def _redis() -> Any:
    from redis import Redis

    return Redis.from_url(os.environ[REDIS_URL_ENV])


def _redis_commands(redis: Any) -> int:
    """Commands the Redis server has processed so far (``INFO stats``)."""
    return int(redis.info("stats")["total_commands_processed"])


def rq_enqueue_cost(smoke: bool) -> tuple[list[list[str]], list[list[str]], dict[str, float]]:
    """The enqueue cost on RQ: (the table's rows, the per-task counts' rows, figures)."""
    import django_rq
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django_tasks_rq.backend import Job as TaskJob
    from django_tasks_rq.backend import failed_callback, success_callback
    from rq import Callback, Queue

    from bench.benchapp.rq_tasks import rq_noop
    from django_fencedjobs import fenced_atomic
    from django_fencedjobs.fencing import reset_current_holder, set_current_holder
    from django_fencedjobs.models import RunTask, TaskDelivery
    from django_fencedjobs.registry import registry

    redis = _redis()
    sizes = [10, 100] if smoke else [100, 10_000]
    rows: list[list[str]] = []
    counts: list[list[str]] = []
    figures: dict[str, float] = {}
    common.clear_jobs(PREFIX)
    with registry.isolated():
        run, state, fence = _held_run(f"{PREFIX}rq_held")

        def fenced_block(n: int) -> None:
            token = set_current_holder(state)
            try:
                with fenced_atomic():
                    for i in range(n):
                        run.enqueue(rq_noop, i)
            finally:
                reset_current_holder(token)

        def plain_loop(n: int) -> None:
            for i in range(n):
                rq_noop.enqueue(i)

        def floor(n: int) -> None:
            # What the batch hand-over does on Redis, with no database at all: the same
            # jobs, built by RQ's enqueue_many into one pipeline.
            queue = django_rq.get_queue(rq_noop.queue_name, job_class=TaskJob)
            on_failure, on_success = Callback(failed_callback), Callback(success_callback)
            jobs = [
                Queue.prepare_data(
                    rq_noop.module_path,
                    args=[i],
                    kwargs={},
                    job_id=uuid.uuid4().hex,
                    meta={"backend_name": rq_noop.backend},
                    on_failure=on_failure,
                    on_success=on_success,
                )
                for i in range(n)
            ]
            with queue.connection.pipeline() as pipe:
                queue.enqueue_many(jobs, pipeline=pipe)
                pipe.execute()

        variants: dict[str, Callable[[int], None]] = {
            "fenced": fenced_block,
            "plain": plain_loop,
            "floor": floor,
        }

        def clean() -> None:
            redis.flushdb()
            TaskDelivery.objects.all().delete()
            RunTask.objects.all().delete()

        # What each costs per task: statements on PostgreSQL, commands to Redis (N = 100,
        # not timed).
        per_task: dict[str, tuple[float, float]] = {}
        sample = sizes[-1] if smoke else 100
        for key, fn in variants.items():
            fn(sample)  # warm
            clean()
            before = _redis_commands(redis)
            with CaptureQueriesContext(connection) as queries:
                fn(sample)
            # INFO itself is one command.
            redis_per = (_redis_commands(redis) - before - 1) / sample
            per_task[key] = (len(queries) / sample, redis_per)
            clean()
        labels = {"fenced": "fenced block", "plain": "plain loop", "floor": "floor"}
        for key, (statements, commands) in per_task.items():
            counts.append([labels[key], f"{statements:.2f}", f"{commands:.1f}"])
            figures[f"rq_statements_per_task_{key}"] = statements
            figures[f"rq_redis_commands_per_task_{key}"] = commands

        for n in sizes:
            repeats = 2 if smoke else (3 if n >= 10_000 else 7)
            samples: dict[str, list[float]] = {key: [] for key in variants}
            for _, key in common.alternate(repeats, list(variants)):
                start = time.perf_counter()
                variants[key](n)
                samples[key].append(time.perf_counter() - start)
                # Every sample starts from an empty queue and empty task tables.
                handed = RunTask.objects.exclude(result_id="").count()
                queued = redis.llen(f"rq:queue:{rq_noop.queue_name}")
                assert queued == n and handed == (0 if key != "fenced" else n), (key, n)
                clean()
            medians = {key: common.summarize(values).median for key, values in samples.items()}
            ratio = medians["plain"] / medians["fenced"]
            figures[f"rq_ratio_{n}"] = ratio
            figures[f"rq_floor_ratio_{n}"] = medians["plain"] / medians["floor"]
            figures[f"rq_fence_ratio_{n}"] = medians["floor"] / medians["fenced"]
            floor_cells = [
                f"{medians['floor'] * 1000:.2f}",
                f"{figures[f'rq_floor_ratio_{n}']:.2f}",
                f"{figures[f'rq_fence_ratio_{n}']:.2f}",
            ]
            rows.append(
                [
                    f"{n:,}",
                    f"{medians['fenced'] * 1000:.2f}",
                    f"{medians['plain'] * 1000:.2f}",
                    floor_cells[0],
                    f"{ratio:.2f}",
                    *floor_cells[1:],
                    f"{n / medians['fenced']:,.0f}",
                    f"{n / medians['plain']:,.0f}",
                    str(repeats),
                ]
            )
            figures[f"rq_tasks_per_s_{n}"] = n / medians["fenced"]
            figures[f"rq_plain_tasks_per_s_{n}"] = n / medians["plain"]
        from django_fencedjobs import lease

        lease.end(f"{PREFIX}rq_held", fence, succeeded_at=None, failed=False)
    common.clear_jobs(PREFIX)
    return rows, counts, figures


def rq_lateness(smoke: bool) -> tuple[list[float], int, int, str]:
    """One runjobs loop and one idle rqworker: the lateness of each slot's task start (s),
    the slots run, the tasks started, and the worker's log if none started."""
    from rq import Worker
    from rq.exceptions import NoSuchJobError
    from rq.job import Job

    from django_fencedjobs.models import JobRun, RunTask
    from tests.redis_harness import RQWorkers

    seconds = 12 if smoke else 60
    common.clear_jobs(PREFIX)
    env = common.child_env()
    redis = _redis()
    with tempfile.TemporaryDirectory() as tmp, RQWorkers(env, Path(tmp)) as workers:
        worker = workers("bench-p8")
        # The worker listens before the first slot, as an idle worker in production does.
        deadline = time.monotonic() + 60
        while Worker.count(connection=redis) < 1:
            if worker.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the rqworker did not start\n" + worker.log())
            time.sleep(0.05)
        runner_proc = subprocess.Popen(
            [sys.executable, "-m", "bench.p8_tasks", "--serve-rq-runner"], cwd=common.REPO, env=env
        )
        try:
            time.sleep(seconds)
        finally:
            runner_proc.send_signal(signal.SIGTERM)
            worker.signal(signal.SIGTERM)  # a warm shutdown: it finishes its task
            try:
                runner_proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                runner_proc.kill()
                runner_proc.wait()
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.wait_exit(30)
        log = worker.log()
    late: list[float] = []
    slots = JobRun.objects.filter(job=RQ_LATENESS_JOB).count()
    for task in RunTask.objects.filter(job=RQ_LATENESS_JOB).select_related("run"):
        if not task.result_id:
            continue
        # RQ's own record of the start (as django-tasks-db's started_at above).
        with contextlib.suppress(NoSuchJobError):
            started_at = Job.fetch(task.result_id, connection=redis).started_at
            if started_at is not None:
                late.append((started_at - task.run.scheduled_for).total_seconds())
    common.clear_jobs(PREFIX)
    redis.flushdb()
    return late, slots, len(late), "" if late else log


def serve_rq_runner() -> int:
    """The runner process of the RQ lateness measurement: runjobs over the one scheduled
    task on RQ."""
    common.setup_django()
    from django.core.management import call_command

    from bench.benchapp.rq_tasks import rq_noop
    from django_fencedjobs.integrations.tasks import schedule_task

    schedule_task(rq_noop, every=timedelta(seconds=2), name=RQ_LATENESS_JOB, args=[0])
    call_command("runjobs", "--job", RQ_LATENESS_JOB, verbosity=0)
    return 0


def measure_rq(smoke: bool, report: common.Report) -> None:
    """The RQ part of the report, beside django-tasks-db's."""
    skipped = os.environ.get(RQ_SKIPPED_ENV)
    if skipped or not os.environ.get(REDIS_URL_ENV):
        report.add(f"On RQ: not measured: {skipped or 'no Redis server'}.")
        report.goal("on RQ: fenced vs plain loop", "≥ 0.9", "not measured", None)
        return
    rows, counts, figures = rq_enqueue_cost(smoke)
    report.add(
        "On RQ (django-tasks-rq, one throwaway redis-server on this machine; the outbox "
        "records and their hand-over together right after the commit): medians of "
        "alternating samples, ms. Plain loop: `task.enqueue()` to the same RQ queue, no "
        "database. Floor: the same jobs by RQ's `enqueue_many` in one pipeline, no record "
        "and no database. Ratios: plain / fenced (the goal's), plain / floor (what one "
        "pipeline saves over the loop), floor / fenced (what the records and the fence add "
        "to the pipeline; 1.0 = nothing)."
    )
    report.add("")
    for line in common.table(
        [
            "N tasks",
            "fenced block",
            "plain loop",
            "floor",
            "plain / fenced",
            "plain / floor",
            "floor / fenced",
            "tasks/s fenced",
            "tasks/s plain",
            "samples each",
        ],
        rows,
    ):
        report.add(line)
    report.add("")
    report.add(
        "Per task, on RQ (one sample of N = 100, not timed): statements on PostgreSQL and "
        "commands to Redis."
    )
    report.add("")
    for line in common.table(["variant", "PostgreSQL statements", "Redis commands"], counts):
        report.add(line)
    report.add("")
    late, slots, started, log = rq_lateness(smoke)
    if late:
        p50 = common.percentile(late, 50)
        p99 = common.percentile(late, 99)
        high = common.summarize(late).high
        report.add(
            f"Lateness on RQ, slot to the task's start on one idle rqworker (rq's forking "
            f"worker), a task every 2 s: {started} tasks started of {slots} slots run; p50 "
            f"{p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max {high * 1000:.0f} ms."
        )
        figures.update(rq_late_p50=p50, rq_late_p99=p99, rq_slots=slots, rq_started=started)
    else:
        report.add(f"Lateness on RQ: no task started ({slots} slots run).")
        print(log, file=sys.stderr)
        figures.update(rq_slots=slots, rq_started=0)
    report.add("")
    for n in (100, 10_000):
        if f"rq_ratio_{n}" in figures:
            ratio = figures[f"rq_ratio_{n}"]
            goal = 0.9 if n < 10_000 else 1.0
            report.goal(
                f"on RQ: fenced vs plain loop, N = {n:,}",
                f"≥ {goal}",
                f"{ratio:.2f}",
                ratio >= goal,
            )
            report.goal(
                f"on RQ: floor (the same jobs by `enqueue_many`, no records) vs plain loop, "
                f"N = {n:,}",
                "(printed)",
                f"{figures[f'rq_floor_ratio_{n}']:.2f}",
                None,
            )
    if late:
        report.goal(
            "on RQ: lateness to an idle rqworker, p50 / p99",
            "(printed)",
            f"{figures['rq_late_p50'] * 1000:.0f} ms / {figures['rq_late_p99'] * 1000:.0f} ms",
            None,
        )
    report.figures.update(figures)


def measure(smoke: bool) -> common.Report:
    rows, figures = enqueue_cost(smoke)
    late, slots, started = lateness(smoke)
    report = common.Report(
        "P8", "scheduled django.tasks: enqueue cost and lateness, on django-tasks-db and on RQ"
    )
    report.add(
        "Enqueue cost: medians of alternating samples, ms; django-tasks-db's database "
        "backend on the same PostgreSQL. Ratio = plain / fenced (higher is better, 1.0 = "
        "free); tasks/s through the fenced block."
    )
    report.add("")
    for line in common.table(
        [
            "N tasks",
            "fenced block",
            "plain loop, 1 tx",
            "plain loop, autocommit",
            "whole run",
            "ratio vs 1 tx",
            "ratio vs autocommit",
            "whole run vs 1 tx",
            "tasks/s",
        ],
        rows,
    ):
        report.add(line)
    report.add("")
    if late:
        summary = common.summarize(late)
        p50 = common.percentile(late, 50)
        p99 = common.percentile(late, 99)
        report.add(
            f"Lateness, slot to the task's start on one idle db_worker (--interval 0.1), a "
            f"task every 2 s: {started} tasks started of {slots} slots run; p50 "
            f"{p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max {summary.high * 1000:.0f} ms."
        )
        figures.update(late_p50=p50, late_p99=p99, slots=slots, started=started)
    else:
        report.add(f"Lateness: no task started ({slots} slots run).")
        figures.update(slots=slots, started=0)
    report.add("")
    for n in (100, 10_000):
        if f"ratio_{n}" in figures:
            ratio = figures[f"ratio_{n}"]
            met = ratio >= 0.9
            report.goal(
                f"django-tasks-db: fenced vs plain loop (1 tx), N = {n:,}",
                "≥ 0.9",
                f"{ratio:.2f}",
                met,
            )
    if late:
        report.goal(
            "django-tasks-db: lateness to an idle db_worker, p50 / p99",
            "(printed)",
            f"{figures['late_p50'] * 1000:.0f} ms / {figures['late_p99'] * 1000:.0f} ms",
            None,
        )
    report.figures.update(figures)
    measure_rq(smoke, report)
    return report


@contextlib.contextmanager
def redis_server() -> Iterator[None]:
    """A throwaway redis-server for the RQ part, named in the environment (bench/settings.py
    reads it when Django is set up; the runner and the worker inherit it); without one, why
    not."""
    from tests.redis_harness import RedisServer, RedisUnavailable

    try:
        server = RedisServer().start()
    except RedisUnavailable as exc:
        os.environ[RQ_SKIPPED_ENV] = str(exc).split("\n", 1)[0]
        yield
        return
    os.environ[REDIS_URL_ENV] = server.url
    try:
        yield
    finally:
        server.close()


def main() -> int:
    if "--serve-runner" in sys.argv:
        return serve_runner()
    if "--serve-rq-runner" in sys.argv:
        return serve_rq_runner()
    with redis_server():
        return common.main(measure)


if __name__ == "__main__":
    raise SystemExit(main())
