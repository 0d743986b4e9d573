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
scheduled every 2 s with ``schedule_task``: for each slot, the task's start on the worker
(django-tasks-db's own ``started_at``) minus the slot.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

from bench import common

PREFIX = "bench.p8."
LATENESS_JOB = "bench.p8.every_2s"


def _env() -> dict[str, str]:
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="bench.settings")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(common.REPO), env.get("PYTHONPATH", "")) if p
    )
    return env


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
                record = runner.run_job(declared, lease.read([declared.name])[declared.name])
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
            repeats = 2 if smoke else (3 if n >= 10_000 else 9)
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

    seconds = 12 if smoke else 120
    common.clear_jobs(PREFIX)
    DBTaskResult.objects.all().delete()
    env = _env()
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


def measure(smoke: bool) -> common.Report:
    rows, figures = enqueue_cost(smoke)
    late, slots, started = lateness(smoke)
    report = common.Report("P8", "scheduled django.tasks: enqueue cost and lateness")
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
    for n in (100, 10_000):
        if f"ratio_{n}" in figures:
            ratio = figures[f"ratio_{n}"]
            met = ratio >= 0.9
            report.goal(f"fenced vs plain loop (1 tx), N = {n:,}", "≥ 0.9", f"{ratio:.2f}", met)
    report.figures.update(figures)
    return report


if __name__ == "__main__":
    if "--serve-runner" in sys.argv:
        raise SystemExit(serve_runner())
    raise SystemExit(common.main(measure))
