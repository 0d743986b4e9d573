"""What every benchmark shares: its own database, Django set-up, statistics, the report.

A benchmark module defines ``measure(smoke: bool) -> Report`` and ends with
``if __name__ == "__main__": common.main(measure)``. Run alone (``python -m bench.p1_...``)
it prints its figures, adds a dated section to ``docs/benchmarks-history.md`` and rewrites
the current figures of ``docs/benchmarks.md`` (``bench/results.py`` owns both files' form);
``bench/run.py`` runs every module that way in its own process and writes one section for
all of them.

Measurements are taken side by side: the variants of a comparison alternate (A B, then
B A, ...) within one process and one connection, so that drift of the machine (other
processes, CPU frequency, autovacuum) falls on both alike, and every figure is the median
over the repeats with its spread.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench import results

REPO = Path(__file__).resolve().parent.parent
DB_ENV = "FENCEDJOBS_BENCH_DB"

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


# -- the benchmark database --------------------------------------------------------------


def _server_dsn(dbname: str | None = None) -> dict[str, Any]:
    from tests.settings import parse_database_url

    url = os.environ.get("DATABASE_URL", "")
    if not url.lower().startswith(("postgres://", "postgresql://", "pgsql://")):
        raise SystemExit(
            "bench: DATABASE_URL must name a PostgreSQL server; run `make bench`, or "
            "python3 scripts/throwaway_postgres.py --durable -- python bench/run.py"
        )
    db = parse_database_url(url)
    params: dict[str, Any] = {
        "dbname": dbname or db["NAME"],
        "user": db["USER"] or None,
        "password": db["PASSWORD"] or None,
        "host": db["HOST"] or None,
        "port": db["PORT"] or None,
    }
    params.update(db["OPTIONS"])
    return {k: v for k, v in params.items() if v is not None}


def connect(dbname: str | None = None, *, autocommit: bool = True) -> Any:
    """A raw psycopg connection to the server (to the benchmark database by default)."""
    import psycopg

    return psycopg.connect(**_server_dsn(dbname or os.environ.get(DB_ENV)), autocommit=autocommit)


@contextlib.contextmanager
def bench_database() -> Iterator[str]:
    """A database of the benchmarks' own on the ``DATABASE_URL`` server, created for the
    duration and dropped afterwards; nothing is written to the database the URL names.
    Reentrant: inside ``bench/run.py`` the modules reuse the one it created."""
    existing = os.environ.get(DB_ENV)
    if existing:
        yield existing
        return
    name = f"fencedjobs_bench_{os.getpid()}"
    with connect(_server_dsn()["dbname"]) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    os.environ[DB_ENV] = name
    try:
        yield name
    finally:
        del os.environ[DB_ENV]
        from django.db import connections

        with contextlib.suppress(Exception):
            connections.close_all()
        with connect(_server_dsn()["dbname"]) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def child_env(**more: str) -> dict[str, str]:
    """The environment of a benchmark's child process (a runner, a worker): this one, with
    the bench settings and the repository importable, and ``more``."""
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="bench.settings", **more)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def setup_django() -> None:
    # Always the benchmarks' own settings, even when started from the test suite.
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    import django

    django.setup()


def migrate() -> None:
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def clear_jobs(prefix: str) -> None:
    """Forget the lease rows, runs and watermarks of the jobs named ``prefix...``."""
    from django_fencedjobs.models import JobLease, JobRun, Watermark

    for model, field in ((JobRun, "job"), (Watermark, "job"), (JobLease, "name")):
        model.objects.filter(**{f"{field}__startswith": prefix}).delete()


def vacuum(*tables: str) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"VACUUM ANALYZE {connection.ops.quote_name(table)}")


# -- the machine's CPU ------------------------------------------------------------------


class CpuSampler:
    """The whole machine's busy CPU time (every process: runners, PostgreSQL, the rest),
    read from Linux's ``/proc/stat`` every ``every`` seconds by a thread of its own.

    ``busy(start, end)`` is how many CPU-seconds the machine's cores spent busy between two
    epoch times, from the samples around them: what a piece of work cost in CPU, whoever
    did it. ``available`` is False where there is no ``/proc/stat``; then nothing is
    sampled.
    """

    STAT = Path("/proc/stat")

    def __init__(self, every: float = 0.1) -> None:
        import threading

        self.every = every
        self.cores = os.cpu_count() or 1
        self.available = self.STAT.exists()
        self._samples: list[tuple[float, float]] = []  # (epoch, busy CPU-seconds so far)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> CpuSampler:
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _sample(self) -> None:
        ticks = os.sysconf("SC_CLK_TCK")
        while not self._stop.is_set():
            # cpu user nice system idle iowait irq softirq steal ...: busy is user, nice,
            # system, irq and softirq (steal is the hypervisor's, not this machine's work).
            fields = [int(v) for v in self.STAT.read_text().split("\n", 1)[0].split()[1:]]
            busy = (sum(fields[:7]) - fields[3] - fields[4]) / ticks
            self._samples.append((time.time(), busy))
            self._stop.wait(self.every)

    def busy(self, start: float, end: float) -> float:
        """CPU-seconds spent between ``start`` and ``end`` (epoch seconds), widened to the
        nearest samples outside them (waiting for the one after ``end`` if it is to come);
        NaN without samples around both."""
        while self._thread.is_alive() and not (self._samples and self._samples[-1][0] >= end):
            time.sleep(self.every / 2)
        before = [busy for at, busy in self._samples if at <= start]
        after = [busy for at, busy in self._samples if at >= end]
        if not before or not after:
            return float("nan")
        return after[0] - before[-1]


# -- statistics ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Summary:
    median: float
    low: float
    high: float
    n: int

    def fmt(self, spec: str = ".3g", unit: str = "") -> str:
        return f"{self.median:{spec}}{unit} ({self.low:{spec}} to {self.high:{spec}}, n={self.n})"


def summarize(values: Sequence[float]) -> Summary:
    """Median and spread (min to max) over the repeats."""
    if not values:
        raise ValueError("no values")
    return Summary(statistics.median(values), min(values), max(values), len(values))


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), nearest-rank: a value that was measured."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def alternate(repeat: int, variants: Sequence[Any]) -> Iterator[tuple[int, Any]]:
    """(repeat, variant) in interleaved order: A B, B A, A B, ... so drift cancels."""
    for r in range(repeat):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for variant in order:
            yield r, variant


def timed(fn: Callable[[], object], times: int) -> float:
    """Seconds per call of ``fn``, over ``times`` calls."""
    start = time.perf_counter()
    for _ in range(times):
        fn()
    return (time.perf_counter() - start) / times


# -- the report -------------------------------------------------------------------------------


@dataclasses.dataclass
class Goal:
    label: str
    target: str
    measured: str
    met: bool | None  # None: informative only


@dataclasses.dataclass
class Report:
    key: str
    title: str
    lines: list[str] = dataclasses.field(default_factory=list)
    goals: list[Goal] = dataclasses.field(default_factory=list)
    #: Figures other reports may refer to (e.g. the ceiling's tps).
    figures: dict[str, float] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0

    def add(self, line: str = "") -> None:
        self.lines.append(line)
        print(line, flush=True)

    def goal(self, label: str, target: str, measured: str, met: bool | None) -> None:
        self.goals.append(Goal(label, target, measured, met))
        mark = {True: "met", False: "MISSED", None: "info"}[met]
        print(f"[{self.key} {mark}] {label}: {measured} (goal: {target})", flush=True)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Report:
        goals = [Goal(**g) for g in data.pop("goals")]
        return cls(goals=goals, **data)


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


# -- the machine -------------------------------------------------------------------------------


def machine() -> dict[str, str]:
    """What the figures were measured on."""
    import django
    import psycopg

    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with connect() as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        durability = ", ".join(
            f"{name}={conn.execute(f'SHOW {name}').fetchone()[0]}"
            for name in ("fsync", "synchronous_commit", "full_page_writes")
        )
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return {
        "cores": str(os.cpu_count()),
        "cpu": cpu or platform.processor() or "unknown",
        "os": f"{platform.system()} {platform.release()}",
        "postgresql": f"{version} ({durability})",
        "python": platform.python_version(),
        "django": django.get_version(),
        "psycopg": psycopg.__version__,
        "load": load,
    }


def command_line() -> str:
    """The command that produced the figures, as the reader would type it."""
    args = sys.argv[1:]
    if os.environ.get("MAKELEVEL"):
        return "make bench" + (f" BENCH_ARGS={shlex.quote(shlex.join(args))}" if args else "")
    exe = sys.executable
    if exe.startswith(str(REPO) + os.sep):
        exe = os.path.relpath(exe, REPO)
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    target = f"-m {spec.name}" if spec is not None else os.path.relpath(sys.argv[0], REPO)
    inner = shlex.join([exe, *target.split(), *args])
    if os.environ.get("FENCEDJOBS_TEST_PG_THROWAWAY") == "1":
        return f"python3 scripts/throwaway_postgres.py --durable -- {inner}"
    return inner


# -- running one module ---------------------------------------------------------------------


def main(measure: Callable[[bool], Report], argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks it runs")
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON (bench/run.py)")
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    started = datetime.now(UTC)
    t0 = time.monotonic()
    with bench_database():
        setup_django()
        migrate()
        report = measure(args.smoke)
        report.seconds = time.monotonic() - t0
        if args.json:
            Path(args.json).write_text(json.dumps(report.to_json()))
        else:
            history, summary = results.destinations(args)
            if history is not None:
                text = results.section(
                    [report],
                    started=started,
                    seconds=report.seconds,
                    smoke=args.smoke,
                    machine=machine(),
                    command=command_line(),
                )
                results.publish(text, history=history, summary=summary)
    return 0


# -- the loop, in this process ----------------------------------------------------------


def loop_until(
    declare: Callable[[], object], done: Callable[[Any], bool], *, seconds: float
) -> None:
    """Declare jobs with ``declare`` (in an isolated registry) and run ``loop.loop()`` over
    them in this process, with the database clock, until ``done(record)`` is true of a run
    that finished, or ``seconds`` pass."""
    import threading

    from django_fencedjobs import loop, signals
    from django_fencedjobs.declared import runnable_jobs
    from django_fencedjobs.registry import registry

    dispatchers: list[Any] = []

    def stop() -> None:
        for dispatcher in dispatchers:
            dispatcher.request_stop()

    def on_finished(sender: Any, job: Any, record: Any, **kwargs: Any) -> None:
        if done(record):
            stop()

    guard = threading.Timer(seconds, stop)
    signals.run_finished.connect(on_finished, weak=False)
    try:
        with registry.isolated():
            declare()
            dispatchers.append(loop.Dispatcher(runnable_jobs()))
            guard.start()
            dispatchers[0].loop()
    finally:
        guard.cancel()
        signals.run_finished.disconnect(on_finished)


# -- many instances at once ---------------------------------------------------------------


def make_instances(
    job_name: str,
    count: int,
    *,
    cron: str,
    jitter: timedelta = timedelta(0),
    start: int = 0,
    batch: int = 5000,
) -> float:
    """Create the instances ``i000000``, ``i000001``, ... (from ``start``, ``count`` of
    them) of the job ``job_name`` (declared with ``instances=True``), each with the
    arguments ``{"tenant": n}``, and their lease rows; seconds taken.

    Saving instances one by one (``JobInstance.save()``, each in its own transaction with
    its lease row) would take minutes at 100,000: both tables are filled by
    ``bulk_create`` in batches instead, each lease row as that save writes it (named
    ``job[key]``, its job as ``parent``, the next fire time after now by the instance's
    schedule and that slot's deadline, the schedule's fingerprint, not paused). The
    schedule is built as the instance's job builds it (``Schedule(..., key=job[key])``);
    for a sample of the rows, the next fire time and
    the fingerprint are checked against ``instances.instance_job(...).valid_schedule``,
    which also checks that the instance is valid.
    """
    from django_fencedjobs import clock, instances
    from django_fencedjobs.models import JobInstance, JobLease
    from django_fencedjobs.registry import registry
    from django_fencedjobs.schedule import Schedule

    began = time.monotonic()
    base = registry.get(job_name)
    now = clock.now()
    for first in range(start, start + count, batch):
        rows = JobInstance.objects.bulk_create(
            JobInstance(
                job=job_name, key=f"i{n:06d}", cron=cron, jitter=jitter, kwargs={"tenant": n}
            )
            for n in range(first, min(first + batch, start + count))
        )
        leases = []
        for row in rows:
            schedule = Schedule(cron=cron, jitter=jitter, key=row.name)
            next_run_at = schedule.next_after(now)
            leases.append(
                JobLease(
                    name=row.name,
                    instance=row,
                    parent=job_name,
                    next_run_at=next_run_at,
                    late_after=base.late_after(next_run_at) if base.timeout else None,
                    schedule_fingerprint=schedule.fingerprint(),
                    created_at=now,
                )
            )
        JobLease.objects.bulk_create(leases)
    sample = JobInstance.objects.filter(job=job_name).select_related("lease").order_by("?")
    for row in sample[:20]:
        expected = instances.instance_job(base, row).valid_schedule
        lease = row.lease
        if (lease.next_run_at, lease.schedule_fingerprint) != (
            expected.next_after(lease.created_at),
            expected.fingerprint(),
        ):
            raise RuntimeError(f"make_instances: the lease row of {row.name} is not as saved")
    return time.monotonic() - began


def drop_instances(job_name: str) -> None:
    """Delete every instance of ``job_name``, their lease rows, runs and watermarks, by a
    few statements (the ORM's cascade would load 100,000 rows)."""
    from django.db import connection

    from django_fencedjobs.models import JobInstance, JobLease, JobRun, Watermark

    prefix = job_name + "["
    with connection.cursor() as cursor:
        for model, column in ((JobRun, "job"), (Watermark, "job"), (JobLease, "name")):
            cursor.execute(
                f"DELETE FROM {model._meta.db_table} WHERE {column} LIKE %s",
                [prefix.replace("_", "\\_") + "%"],
            )
        cursor.execute(f"DELETE FROM {JobInstance._meta.db_table} WHERE job = %s", [job_name])
