"""P11: a population of 100,000 instances run by 4 runner processes.

Two populations of the bench app's job declared with ``instances=True``
(bench/benchapp/jobs.py: each run one fenced insert of a row naming its instance and
slot), each run by 4 real runner processes (``python -m django runjobs --job bench.digest
-v 0``, what ``manage.py runjobs`` runs, default workers, the database clock) against
this benchmark's PostgreSQL:

1. **hourly**: 100,000 instances at ``0 * * * *`` with a jitter of 59 minutes, which
   spreads them over the hour (about 28 runs/s), for 10 minutes. From the run records:
   lateness (``started_at - scheduled_for``) p50/p99/max of the slots in the window;
   no slot run twice (one run per instance and slot, one row written per instance and
   slot), no two runs of one instance overlapping (each one's fence above the one
   before, started after it ended); every slot of the window run: each instance's slots
   in the window, counted from its schedule, against the runs.
2. **every 5 minutes**: 100,000 instances at ``*/5 * * * *`` with a jitter of 4 min 59 s
   (about 333 runs/s), for 5 minutes: more than 2 cores sustain. Runs per second
   achieved, and the CPU time per run: the 4 runner processes' and the PostgreSQL
   server's (every process of it: ``/proc/<pid>/stat``), over the window, divided by the
   runs started in it; the whole machine's busy CPU (``/proc/stat``) alongside. A machine
   with more cores would sustain, by that figure, about cores / CPU per run runs/s (the
   paper estimate: it assumes the work spreads over the cores and nothing else limits).

The instances and their lease rows are made by ``bulk_create`` in batches
(``common.make_instances``: saving 100,000 one by one would take minutes), each lease row
as ``JobInstance.save()`` writes it. The runners start once they are made; slots due in
the meantime are run late, so the window starts after a warm-up (60 s) and the hourly
population's runners are stopped 15 s after its end, so that every slot of the window
has started by then.

Goals (hourly population): p99 lateness <= 1 s; 0 slots run twice and 0 overlapping
runs; 0 slots of the window missing. It takes about 20 minutes, so ``make bench`` runs
it only when named: ``make bench BENCH_ARGS="--only P11"``.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench import common

RUNNERS = 4


@dataclasses.dataclass(frozen=True)
class Population:
    label: str
    instances: int
    cron: str
    jitter: timedelta
    period: timedelta
    window: float  # seconds measured
    warm: float  # seconds before the window
    tail: float  # seconds after it, before the runners are stopped


def populations(smoke: bool) -> list[Population]:
    hourly = ("0 * * * *", timedelta(minutes=59), timedelta(hours=1))
    five = ("*/5 * * * *", timedelta(minutes=4, seconds=59), timedelta(minutes=5))
    if smoke:
        return [
            Population("hourly", 2_000, *hourly, window=15, warm=8, tail=5),
            Population("every 5 minutes", 2_000, *five, window=10, warm=8, tail=0),
        ]
    return [
        Population("hourly", 100_000, *hourly, window=600, warm=60, tail=15),
        Population("every 5 minutes", 100_000, *five, window=300, warm=60, tail=0),
    ]


# -- CPU time of processes, from /proc ---------------------------------------------------


TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces: the fields follow the last ).
    return text[text.rindex(")") + 2 :].split()


def process_cpu(pid: int, *, children: bool = False) -> float:
    """CPU-seconds a process has used (user + system), with its waited-for children's
    when ``children``; 0 when it is gone."""
    fields = _stat(pid)
    if fields is None:
        return 0.0
    # After the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
    used = int(fields[11]) + int(fields[12])
    if children:
        used += int(fields[13]) + int(fields[14])
    return used / TICKS


def server_cpu(postmaster: int | None) -> float:
    """CPU-seconds of the PostgreSQL server: its postmaster (with the backends it has
    reaped) and every process it started that still runs. NaN when unknown."""
    if postmaster is None:
        return float("nan")
    total = process_cpu(postmaster, children=True)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and fields[1] == str(postmaster):
                total += (int(fields[11]) + int(fields[12])) / TICKS
    return total


def postmaster_pid() -> int | None:
    """The server's postmaster, from ``postmaster.pid`` in its data directory (when this
    process may read it: the server is on this machine)."""
    from django.db import connection

    try:
        with connection.cursor() as cursor:
            cursor.execute("SHOW data_directory")
            directory = cursor.fetchone()[0]
        return int(Path(directory, "postmaster.pid").read_text().split("\n", 1)[0])
    except Exception:  # not superuser, a server on another machine: unknown
        return None


# -- one population -----------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    population: Population
    made: float
    window: tuple[datetime, datetime]
    late: list[float]
    runs_in_window: int
    #: Runs that started in the window, whatever their slot: what the runners achieved.
    started: int
    expected: int
    missing: int
    unexpected: int
    doubled: int
    overlapping: int
    coalesced: int
    failed: int
    runner_cpu: float
    server_cpu: float
    machine_cpu: float
    commits: int


def commits() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
        return int(cursor.fetchone()[0])


def run_population(pop: Population, cpu: common.CpuSampler) -> Outcome:
    from bench.benchapp.jobs import DIGEST
    from bench.benchapp.models import Row

    common.drop_instances(DIGEST)
    Row.objects.filter(note__startswith="i").delete()
    made = common.make_instances(DIGEST, pop.instances, cron=pop.cron, jitter=pop.jitter)
    common.vacuum("fencedjobs_jobinstance", "fencedjobs_joblease")
    postmaster = postmaster_pid()

    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(common.REPO), env.get("PYTHONPATH", "")) if p
    )
    argv = [sys.executable, "-m", "django", "runjobs", "--job", DIGEST, "-v", "0"]
    procs = [subprocess.Popen(argv, cwd=common.REPO, env=env) for _ in range(RUNNERS)]
    try:
        time.sleep(pop.warm)
        start = datetime.now(UTC)
        runners0 = sum(process_cpu(p.pid) for p in procs)
        server0, commits0 = server_cpu(postmaster), commits()
        time.sleep(pop.window)
        end = datetime.now(UTC)
        runners1 = sum(process_cpu(p.pid) for p in procs)
        server1, commits1 = server_cpu(postmaster), commits()
        time.sleep(pop.tail)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(180)
    if any(proc.returncode != 0 for proc in procs):
        raise RuntimeError(f"P11: a runner exited with {[p.returncode for p in procs]}")
    return _outcome(
        pop,
        made,
        (start, end),
        runner_cpu=runners1 - runners0,
        server_cpu=server1 - server0,
        machine_cpu=cpu.busy(start.timestamp(), end.timestamp()),
        commits=commits1 - commits0,
    )


def _outcome(
    pop: Population,
    made: float,
    window: tuple[datetime, datetime],
    **figures: Any,
) -> Outcome:
    from bench.benchapp.jobs import DIGEST
    from bench.benchapp.models import Row
    from django_fencedjobs.models import JobRun
    from django_fencedjobs.schedule import Schedule

    start, end = window
    runs = list(
        JobRun.objects.filter(job__startswith=DIGEST + "[")
        .order_by()
        .values_list(
            "job", "scheduled_for", "started_at", "finished_at", "fence", "outcome", "missed_slots"
        )
    )
    slots = [(job, slot) for job, slot, *_ in runs]
    doubled = len(slots) - len(set(slots))
    rows = list(Row.objects.filter(note__startswith="i").values_list("note", "seq").order_by())
    doubled += len(rows) - len(set(rows))
    by_job: dict[str, list[tuple[Any, ...]]] = {}
    for run in runs:
        by_job.setdefault(run[0], []).append(run)
    overlapping = 0
    for own in by_job.values():
        own.sort(key=lambda r: r[2])
        for before, after in itertools.pairwise(own):
            if after[4] <= before[4] or before[3] is None or after[2] < before[3]:
                overlapping += 1
    in_window = [r for r in runs if start < r[1] <= end]
    late = [(r[2] - r[1]).total_seconds() for r in in_window if r[2] is not None]
    # Each instance's slots in the window, by its schedule.
    expected: set[tuple[str, datetime]] = set()
    for n in range(pop.instances):
        name = f"{DIGEST}[i{n:06d}]"
        schedule = Schedule(cron=pop.cron, jitter=pop.jitter, key=name)
        slot = schedule.next_after(start)
        while slot <= end:
            expected.add((name, slot))
            slot = schedule.next_after(slot)
    ran = {(r[0], r[1]) for r in in_window}
    return Outcome(
        population=pop,
        made=made,
        window=window,
        late=late,
        runs_in_window=len(in_window),
        started=sum(1 for r in runs if r[2] is not None and start < r[2] <= end),
        expected=len(expected),
        missing=len(expected - ran),
        unexpected=len(ran - expected),
        doubled=doubled,
        overlapping=overlapping,
        coalesced=sum(r[6] for r in in_window),
        failed=sum(1 for r in in_window if r[5] not in ("succeeded", "running")),
        **figures,
    )


# -- the report ---------------------------------------------------------------------------


def measure(smoke: bool) -> common.Report:
    from bench.benchapp.jobs import DIGEST

    with common.CpuSampler() as cpu:
        outcomes = [run_population(pop, cpu) for pop in populations(smoke)]
        common.drop_instances(DIGEST)
        cores = cpu.cores

    report = common.Report("P11", "a population of instances run by 4 runner processes")
    report.add(
        f"{RUNNERS} runner processes (`python -m django runjobs --job {DIGEST} -v 0`, "
        "default workers, database clock); each run one fenced insert. Instances made by "
        "`bulk_create` with their lease rows, then `VACUUM ANALYZE`; the window starts after "
        "a warm-up. Lateness is `started_at - scheduled_for` of the slots in the window."
    )
    report.add("")
    rows = []
    for o in outcomes:
        pop, seconds = o.population, (o.window[1] - o.window[0]).total_seconds()
        rate = pop.instances / pop.period.total_seconds()
        cpu_ms = 1000 * (o.runner_cpu + o.server_cpu) / max(o.started, 1)
        rows.append(
            [
                f"{pop.instances:,} {pop.label} (`{pop.cron}`, jitter {pop.jitter})",
                f"{seconds:.0f} s",
                f"{rate:.0f}/s",
                f"{o.started / seconds:.1f}/s",
                _pct(o.late, 50),
                _pct(o.late, 99),
                f"{max(o.late, default=0):.2f} s",
                f"{cpu_ms:.2f}",
                f"{1000 * o.runner_cpu / max(o.started, 1):.2f}",
                f"{1000 * o.machine_cpu / max(o.started, 1):.2f}",
                f"{o.commits / max(o.started, 1):.2f}",
            ]
        )
    for line in common.table(
        [
            "population",
            "window",
            "due",
            "runs/s achieved",
            "lateness p50",
            "p99",
            "max",
            "CPU ms/run (runners + server)",
            "of which runners",
            "whole machine",
            "commits/run",
        ],
        rows,
    ):
        report.add(line)
    report.add("")
    for o in outcomes:
        report.add(
            f"- {o.population.label}: {o.expected:,} slots in the window by the schedules, "
            f"{o.runs_in_window:,} runs of them; missing {o.missing:,}, run though not in "
            f"the schedules {o.unexpected:,}, run twice {o.doubled}, overlapping runs of one "
            f"instance {o.overlapping}, slots coalesced {o.coalesced:,}, runs not succeeded "
            f"{o.failed}; instances made in {o.made:.0f} s."
        )
    hourly, five = outcomes[0], outcomes[-1]
    five_cpu = (five.runner_cpu + five.server_cpu) / max(five.started, 1)
    report.add("")
    if five_cpu > 0:
        estimate = ", ".join(f"{c} cores {c / five_cpu:,.0f}/s" for c in (cores, 8, 16, 32))
        report.add(
            f"At {1000 * five_cpu:.2f} CPU ms per run (runners and server, the "
            f"{five.population.label} population), the paper estimate of what a machine "
            f"sustains, cores / CPU per run: {estimate} (this machine: {cores} cores; the "
            "estimate assumes the work spreads over the cores and nothing else limits it: "
            "one server's locks, disk flushes)."
        )
    for o in outcomes:
        key = o.population.label.split()[0]
        seconds = (o.window[1] - o.window[0]).total_seconds()
        report.figures.update(
            {
                f"{key}_runs_per_second": o.started / seconds,
                f"{key}_cpu_ms_per_run": 1000 * (o.runner_cpu + o.server_cpu) / max(o.started, 1),
                f"{key}_p99": common.percentile(o.late, 99) if o.late else float("nan"),
            }
        )
    p99 = common.percentile(hourly.late, 99) if hourly.late else float("nan")
    label = f"{hourly.population.instances:,} hourly"
    report.goal(f"{label}: p99 lateness", "≤ 1 s", f"{p99:.2f} s", p99 <= 1.0)
    report.goal(
        f"{label}: slots run twice, overlapping runs",
        "0",
        f"{hourly.doubled}, {hourly.overlapping}",
        hourly.doubled == 0 and hourly.overlapping == 0,
    )
    report.goal(
        f"{label}: every slot of the window run",
        "0 missing",
        f"{hourly.missing:,} missing of {hourly.expected:,}"
        + (f", {hourly.coalesced:,} coalesced" if hourly.coalesced else ""),
        hourly.missing == 0 and hourly.unexpected == 0 and hourly.coalesced == 0,
    )
    seconds = (five.window[1] - five.window[0]).total_seconds()
    report.goal(
        f"{five.population.instances:,} every 5 minutes: runs/s achieved (due)",
        "(printed)",
        f"{five.started / seconds:.0f}/s "
        f"({five.population.instances / five.population.period.total_seconds():.0f}/s)",
        None,
    )
    report.goal(
        f"{five.population.instances:,} every 5 minutes: CPU ms per run, runners + server",
        "(printed)",
        f"{1000 * five_cpu:.2f} ms: {cores / five_cpu if five_cpu else 0:,.0f} runs/s on "
        f"{cores} cores, {16 / five_cpu if five_cpu else 0:,.0f} on 16 by the paper estimate",
        None,
    )
    report.goal(
        f"{five.population.instances:,} every 5 minutes: slots run twice, overlapping runs",
        "0",
        f"{five.doubled}, {five.overlapping}",
        five.doubled == 0 and five.overlapping == 0,
    )
    return report


def _pct(values: list[float], q: float) -> str:
    return f"{common.percentile(values, q):.2f} s" if values else "-"


if __name__ == "__main__":
    raise SystemExit(common.main(measure))
