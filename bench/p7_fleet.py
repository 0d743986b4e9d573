"""P7: a fleet of runners against a stampede: many jobs due at the same instant.

Four runner processes (``loop.loop()`` each, default workers, the database clock) over
2,000 jobs due every minute at second 0, no jitter (the stampede that per-tenant jobs
make), for 5 minutes; each run writes one row in a fenced transaction. From the run
records: lateness (``started_at - scheduled_for``) p50/p99/max, runs per second while a
slot drains, commits per run (``pg_stat_database.xact_commit``) and statements per run
(counted in each runner, on Django's cursors: not the two a run sends on psycopg's own, its
fence check with ``BEGIN`` and its end). Asserted: no slot ran twice (one row per job and
slot, one run per job and slot) and every slot of every job ran.

Goal: p99 lateness <= 2 s.

Then the same fleet over as many *instances* of one job (``@job(instances=True)``, each
instance's own lease and fence), which the runners claim in batches (one transaction
takes the leases and records the runs of as many due instances as they have free workers)
and whose ends are one statement each: the fleet's CPU per run against the floor of (2)
below, measured side by side in this run (goal: at most 1.5 times it).

Side by side, the floor under it on this machine: the same number of runs' work done by
as many processes and threads with no scheduler at all, (1) the handler's write alone, one
transaction each, and (2) that write plus a start record committed before it and an end
record committed after it, one run at a time: the least a scheduler does that records
every run before it starts. A slot cannot drain faster than (2) unless runs' starts and
ends are committed several at once.

For each of the three (the two floors and the fleet's drains), the whole machine's busy
CPU time per run while the work was done (every process, the server's included, from
``/proc/stat``): divided among the machine's cores, it says how far the work is CPU-bound.

    python -m bench.p7_fleet --runner   (one runner process; started by the benchmark)
    python -m bench.p7_fleet --floor    (one process of the floor; started by it too)
"""

from __future__ import annotations

import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench import common

PREFIX = "bench.p7."


def sizes(smoke: bool) -> tuple[int, timedelta, float]:
    """(jobs, interval, seconds to run)."""
    if smoke:
        return 40, timedelta(seconds=5), 12.0
    return 2000, timedelta(minutes=1), 330.0


def declare(jobs: int, every: timedelta) -> list[str]:
    from bench.benchapp.models import Row
    from django_fencedjobs import fenced_atomic, job

    def handler(run: Any) -> None:
        with fenced_atomic():
            Row.objects.create(
                seq=int(run.scheduled_for.timestamp()), note=run.job.name.rsplit(".", 1)[-1]
            )

    names = [f"{PREFIX}job{n:04d}" for n in range(jobs)]
    for name in names:
        job(every=every, name=name, timeout=every / 2)(handler)
    return names


#: The job whose instances the second fleet runs (``bench.p7.instances[i000000]``, ...).
INSTANCES = f"{PREFIX}instances"


def declare_instances(every: timedelta) -> str:
    """The job with instances of the second fleet: the same write as :func:`declare`'s."""
    from bench.benchapp.models import Row
    from django_fencedjobs import fenced_atomic, job

    def handler(run: Any, *, tenant: int) -> None:
        with fenced_atomic():
            Row.objects.create(seq=int(run.scheduled_for.timestamp()), note=f"inst{tenant:06d}")

    job(instances=True, name=INSTANCES, timeout=every / 2)(handler)
    return INSTANCES


def runner_process(smoke: bool, counts: Path, instances: bool) -> None:
    """One runner: the loop until SIGTERM; then the number of statements it sent."""
    from django.db import connections

    from django_fencedjobs import loop
    from django_fencedjobs.declared import runnable_jobs

    jobs, every, _ = sizes(smoke)
    names = [declare_instances(every)] if instances else declare(jobs, every)
    statements = 0

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal statements
        statements += 1
        return execute(sql, params, many, context)

    # Every connection any thread of this process opens counts its statements.
    from django.db.backends.signals import connection_created

    def wrap(sender: Any, connection: Any, **kwargs: Any) -> None:
        connection.execute_wrappers.append(count)

    connection_created.connect(wrap, weak=False)
    connections.close_all()
    dispatcher = loop.Dispatcher(runnable_jobs(names))
    # A handler that set the dispatcher's events itself could wait on a lock its own
    # thread holds: the handler hands the signal to a thread that does.
    stop: queue.SimpleQueue[int] = queue.SimpleQueue()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.put(signum))
    threading.Thread(target=lambda: stop.get() and dispatcher.request_stop(), daemon=True).start()
    cpu = time.process_time()
    dispatcher.loop()
    counts.write_text(json.dumps({"statements": statements, "cpu": time.process_time() - cpu}))


#: The floor's two kinds of run: the handler's write alone; with its start and end recorded.
FLOOR_MODES = ("write", "recorded")


def floor_process(mode: str, runs: int, go: Path, out: Path) -> None:
    """One process of the floor: ``WORKERS`` threads share ``runs`` runs; they start when
    ``go`` exists. Writes the process's first start and last end (epoch seconds)."""
    from django.db import connections, transaction

    from bench.benchapp.models import Row
    from django_fencedjobs.conf import get_settings

    threads = get_settings().WORKERS

    def work(count: int) -> None:
        connections["default"].ensure_connection()
        while not go.exists():
            time.sleep(0.001)
        for seq in range(count):
            if mode == "recorded":
                with transaction.atomic():
                    started = Row.objects.create(seq=seq, note="floor start")
            with transaction.atomic():
                Row.objects.create(seq=seq, note="floor write")
            if mode == "recorded":
                with transaction.atomic():
                    Row.objects.filter(pk=started.pk).update(note="floor end")
        connections.close_all()

    workers = [
        threading.Thread(target=work, args=(runs // threads + (n < runs % threads),))
        for n in range(threads)
    ]
    for worker in workers:
        worker.start()
    while not go.exists():
        time.sleep(0.001)
    began = time.time()
    for worker in workers:
        worker.join()
    out.write_text(json.dumps([began, time.time()]))


def floor(
    runs: int, env: dict[str, str], rounds: int, cpu: common.CpuSampler
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Seconds for ``runs`` runs' work by 4 processes, per mode, ``rounds`` alternating
    samples of each; and the machine's CPU-seconds per run in each sample."""
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    seconds: dict[str, list[float]] = {mode: [] for mode in FLOOR_MODES}
    cpu_per_run: dict[str, list[float]] = {mode: [] for mode in FLOOR_MODES}
    argv = [sys.executable, "-m", "bench.p7_fleet", "--floor"]
    for sample in range(rounds * len(FLOOR_MODES)):
        mode = FLOOR_MODES[sample % len(FLOOR_MODES)]
        go = tmp / f"p7-floor-go-{os.getpid()}"
        outs = [tmp / f"p7-floor-{os.getpid()}-{n}.json" for n in range(4)]
        go.unlink(missing_ok=True)
        procs = [
            subprocess.Popen(
                [*argv, mode, str(runs // 4 + (n < runs % 4)), str(go), str(out)],
                cwd=common.REPO,
                env=env,
            )
            for n, out in enumerate(outs)
        ]
        time.sleep(3)  # every process connected and waiting
        go.touch()
        for proc in procs:
            if proc.wait(300) != 0:
                raise RuntimeError(f"a floor process failed (exit {proc.returncode})")
        spans = [json.loads(out.read_text()) for out in outs]
        began, ended = min(start for start, _ in spans), max(end for _, end in spans)
        seconds[mode].append(ended - began)
        cpu_per_run[mode].append(cpu.busy(began, ended) / runs)
        go.unlink()
        for out in outs:
            out.unlink()
    return seconds, cpu_per_run


def measure(smoke: bool) -> common.Report:
    with common.CpuSampler() as cpu:
        return _measure(smoke, cpu)


def _measure(smoke: bool, cpu: common.CpuSampler) -> common.Report:
    from bench.benchapp.models import Row
    from django_fencedjobs import clock, declared
    from django_fencedjobs.registry import registry

    jobs, every, seconds = sizes(smoke)
    common.clear_jobs(PREFIX)
    common.drop_instances(INSTANCES)
    Row.objects.filter(note__startswith="job").delete()
    Row.objects.filter(note__startswith="inst").delete()
    with registry.isolated():
        declare(jobs, every)
        declared.sync(declared.runnable_jobs(), clock.now())
        declare_instances(every)
        # Every instance at second 0 of the minute, no jitter: the same stampede.
        common.make_instances(INSTANCES, jobs, cron="* * * * *")
        if smoke:
            # The smoke's slots are 5 s apart: an interval (each save moves its lease row).
            from django_fencedjobs.models import JobInstance

            for instance in JobInstance.objects.filter(job=INSTANCES):
                instance.cron, instance.every = "", every
                instance.save()

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(common.REPO), env.get("PYTHONPATH", "")) if p
    )
    floors, floor_cpu = floor(jobs, env, 1 if smoke else 3, cpu)
    Row.objects.filter(note__startswith="floor").delete()
    code = _fleet(False, smoke, env, cpu)
    batched = _fleet(True, smoke, env, cpu)

    report = common.Report("P7", "a fleet of 4 runners, every job due at the same instant")
    report.add(
        f"4 `runjobs` loops (default workers) over {jobs:,} jobs every "
        f"{every.total_seconds():g} s, no jitter, one fenced insert per run, for "
        f"{seconds:g} s; then the same over {jobs:,} instances of one job (claimed in "
        "batches). Whole slots only."
    )
    report.add("")
    header = [
        "fleet over",
        "runs",
        "lateness p50",
        "p99",
        "max",
        "runs/s while a slot drains",
        "commits/run",
        "Django statements/run",
    ]
    rows = [
        [
            label,
            f"{f['runs']:,}",
            f"{f['p50']:.2f} s",
            f"{f['p99']:.2f} s",
            f"{f['max']:.2f} s",
            f"{f['runs_per_second']:.0f}",
            f"{f['commits_per_run']:.2f}",
            f"{f['statements_per_run']:.1f}",
        ]
        for label, f in (("jobs", code), ("instances", batched))
    ]
    for line in common.table(header, rows):
        report.add(line)
    report.add("")
    for label, f in (("jobs", code), ("instances", batched)):
        report.add(
            f"Over {label}: runners taking part: {f['owners']}; runs missing from whole "
            f"slots: {f['missing']}; slots coalesced: {f['coalesced']}; slots run twice: "
            f"{f['doubled']}."
        )
    write_floor = common.summarize(floors["write"])
    recorded_floor = common.summarize(floors["recorded"])
    # CPU-milliseconds per run, the whole machine's (median of the samples).
    write_cpu = 1000 * statistics.median(floor_cpu["write"])
    recorded_cpu = 1000 * statistics.median(floor_cpu["recorded"])
    report.add("")
    report.add(
        f"The floor on this machine: {jobs:,} runs' work by 4 processes of default workers "
        "each, no scheduler, alternating samples (seconds from the first start to the last "
        "end):"
    )
    report.add("")
    table = [
        [
            "the handler's write alone (1 commit per run)",
            write_floor.fmt(".2f"),
            "1",
            f"{write_cpu:.2f}",
            "-",
        ],
        [
            "with a start and an end record (3 commits per run)",
            recorded_floor.fmt(".2f"),
            f"{recorded_floor.median / write_floor.median:.2f}",
            f"{recorded_cpu:.2f}",
            "1",
        ],
    ]
    for label, f in (("jobs", code), ("instances", batched)):
        table.append(
            [
                f"the fleet over {label}: a slot drained (median, start of the last run)",
                f"{f['slot_drain']:.2f}",
                f"{f['slot_drain'] / write_floor.median:.2f}",
                f"{f['cpu_ms_per_run']:.2f}",
                f"{f['cpu_ms_per_run'] / recorded_cpu:.2f}",
            ]
        )
    for line in common.table(
        ["the work of a slot", "seconds", "vs the write alone", "CPU ms per run", "vs (2)"],
        table,
    ):
        report.add(line)
    cores = cpu.cores
    report.add("")
    report.add(
        f"*CPU ms per run* is the whole machine's busy CPU time (every process: the "
        f"runners, PostgreSQL, the rest; from `/proc/stat`) while the slot's work was "
        f"done, per run. This machine has {cores} core(s): a slot of {jobs:,} runs "
        f"cannot drain in less than its runs' CPU time shared among {cores} core(s): "
        f"{jobs * write_cpu / 1000 / cores:.2f} s for the write alone, "
        f"{jobs * recorded_cpu / 1000 / cores:.2f} s with each run's start and end "
        f"committed, {jobs * code['cpu_ms_per_run'] / 1000 / cores:.2f} s at the cost of "
        f"the fleet over jobs, {jobs * batched['cpu_ms_per_run'] / 1000 / cores:.2f} s over "
        "instances. The runner processes' own share, per run (their CPU time from the first "
        f"tick to the stop, idle ticks included): {code['runner_cpu_ms_per_run']:.2f} ms "
        f"over jobs, {batched['runner_cpu_ms_per_run']:.2f} ms over instances."
    )
    report.figures.update(
        floor_write=write_floor.median,
        floor_recorded=recorded_floor.median,
        cpu_ms_per_run_write=write_cpu,
        cpu_ms_per_run_recorded=recorded_cpu,
        cpu_ms_per_run_fleet=code["cpu_ms_per_run"],
        cpu_ms_per_run_instances=batched["cpu_ms_per_run"],
        runner_cpu_ms_per_run=code["runner_cpu_ms_per_run"],
        runner_cpu_ms_per_run_instances=batched["runner_cpu_ms_per_run"],
        slot_drain=code["slot_drain"],
        slot_drain_instances=batched["slot_drain"],
        p50=code["p50"],
        p99=code["p99"],
        p99_instances=batched["p99"],
        commits_per_run=code["commits_per_run"],
        commits_per_run_instances=batched["commits_per_run"],
        statements_per_run=code["statements_per_run"],
        statements_per_run_instances=batched["statements_per_run"],
        runs_per_second=code["runs_per_second"],
        runs_per_second_instances=batched["runs_per_second"],
    )
    for label, f in (("jobs", code), ("instances", batched)):
        report.goal(f"slots run twice, over {label}", "0", str(f["doubled"]), f["doubled"] == 0)
        lost = f["missing"] + f["coalesced"]
        report.goal(f"every slot run, over {label}", "0 missing", str(lost), lost == 0)
    report.goal("p99 lateness, over jobs", "≤ 2 s", f"{code['p99']:.2f} s", code["p99"] <= 2.0)
    report.goal(
        "p99 lateness, over instances",
        "≤ 2 s",
        f"{batched['p99']:.2f} s",
        batched["p99"] <= 2.0,
    )
    for label, f in (("jobs", code), ("instances", batched)):
        ratio = f["cpu_ms_per_run"] / recorded_cpu
        report.goal(
            f"CPU per run over {label}, against the floor with start and end recorded",
            "≤ 1.5",
            f"{ratio:.2f} ({f['cpu_ms_per_run']:.2f} ms against {recorded_cpu:.2f} ms)",
            ratio <= 1.5,
        )
    return report


def _fleet(
    instances: bool, smoke: bool, env: dict[str, str], cpu: common.CpuSampler
) -> dict[str, Any]:
    """Run the fleet (4 runner processes) over the jobs, or over the instances, for the
    benchmark's duration; what it did, from the run records and the runners' counts."""
    from django.db import connection

    from bench.benchapp.models import Row
    from django_fencedjobs import clock
    from django_fencedjobs.models import JobRun

    jobs, _, seconds = sizes(smoke)
    prefix = f"{INSTANCES}[" if instances else f"{PREFIX}job"
    note = "inst" if instances else "job"

    def commits() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            )
            return int(cursor.fetchone()[0])

    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    count_files = [tmp / f"p7-statements-{os.getpid()}-{n}.json" for n in range(4)]
    argv = [sys.executable, "-m", "bench.p7_fleet", "--runner", "--counts"]
    started = clock.now()
    before = commits()
    procs = [
        subprocess.Popen(
            [
                *argv,
                str(path),
                *(["--smoke"] if smoke else []),
                *(["--instances"] if instances else []),
            ],
            cwd=common.REPO,
            env=env,
        )
        for path in count_files
    ]
    try:
        time.sleep(seconds)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(120)
    after = commits()
    counted = [json.loads(p.read_text()) for p in count_files if p.exists()]
    statements = sum(c["statements"] for c in counted)
    runner_cpu = sum(c["cpu"] for c in counted)
    for path in count_files:
        path.unlink(missing_ok=True)

    runs = list(
        JobRun.objects.filter(job__startswith=prefix, scheduled_for__gt=started).values_list(
            "job", "scheduled_for", "started_at", "outcome", "missed_slots", "owner"
        )
    )
    slots = sorted({slot for _, slot, *_ in runs})
    # Whole slots only: the first after start and the last before the stop may be partial.
    whole = slots[1:-1] if len(slots) > 2 else slots
    measured = [r for r in runs if r[1] in whole]
    late = [(r[2] - r[1]).total_seconds() for r in measured if r[2] is not None]
    per_slot: dict[Any, list[Any]] = {}
    for _, slot, started_at, *_ in measured:
        if started_at is not None:
            per_slot.setdefault(slot, []).append(started_at)
    # Per slot: seconds until its last run started, and runs per second until then.
    drained = [
        (len(starts), max((max(starts) - slot).total_seconds(), 1e-3))
        for slot, starts in per_slot.items()
    ]
    drain_seconds = [seconds_ for _, seconds_ in drained]
    drain = [count / seconds_ for count, seconds_ in drained]
    # The whole machine's CPU while each slot drained, per run started in it.
    drain_cpu = [
        cpu.busy(slot.timestamp(), max(starts).timestamp()) / len(starts)
        for slot, starts in per_slot.items()
    ]
    rows = list(Row.objects.filter(note__startswith=note).values_list("note", "seq").order_by())
    total_runs = len(runs)
    return {
        "runs": total_runs,
        "p50": common.percentile(late, 50) if late else float("nan"),
        "p99": common.percentile(late, 99) if late else float("nan"),
        "max": max(late, default=0.0),
        "runs_per_second": common.percentile(drain, 50) if drain else 0.0,
        "slot_drain": common.percentile(drain_seconds, 50) if drain_seconds else float("nan"),
        "cpu_ms_per_run": 1000 * statistics.median(drain_cpu) if drain_cpu else float("nan"),
        "runner_cpu_ms_per_run": 1000 * runner_cpu / max(total_runs, 1),
        "commits_per_run": (after - before) / max(total_runs, 1),
        "statements_per_run": statements / max(total_runs, 1),
        "missing": len(whole) * jobs - len(measured),
        "coalesced": sum(r[4] for r in measured),
        "doubled": len(rows) - len(set(rows)),
        "owners": len({r[5].rsplit(":", 1)[-1] for r in measured}),
    }


if __name__ == "__main__":
    if "--runner" in sys.argv:
        common.setup_django()
        runner_process(
            "--smoke" in sys.argv,
            Path(sys.argv[sys.argv.index("--counts") + 1]),
            instances="--instances" in sys.argv,
        )
    elif "--floor" in sys.argv:
        common.setup_django()
        mode, count, go, out = sys.argv[sys.argv.index("--floor") + 1 :]
        floor_process(mode, int(count), Path(go), Path(out))
    else:
        raise SystemExit(common.main(measure))
