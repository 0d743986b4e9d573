"""P4 under load: a frequent job's lateness while long runs occupy all workers but one.

``loop.loop()`` in this process with 4 workers (the default) and the database clock: 3
jobs every 30 s whose runs sleep 25 s (outside any transaction) keep 3 workers busy; one
job every 2 s writes one row in a fenced transaction. Lateness (``started_at -
scheduled_for``) of the frequent job's runs, from their ``JobRun`` rows, over a minute.
Before the pool, each long run held the frequent job back for its whole length, and its
missed slots coalesced.

Goal: p99 <= 0.5 s; no slot of the frequent job coalesced.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

from bench import common

PREFIX = "bench.p4l."


def measure(smoke: bool) -> common.Report:
    from bench.benchapp.models import Row
    from django_fencedjobs import clock, fenced_atomic, job, loop, operations
    from django_fencedjobs.declared import runnable_jobs
    from django_fencedjobs.declared import sync as sync_rows
    from django_fencedjobs.models import JobRun
    from django_fencedjobs.registry import registry

    seconds = 8.0 if smoke else 60.0
    long_sleep = 5.0 if smoke else 25.0
    fast_name = f"{PREFIX}fast"

    def fast(run: Any) -> None:
        with fenced_atomic():
            Row.objects.create(seq=run.fence, note="p4l")

    def slow(run: Any) -> None:
        deadline = time.monotonic() + long_sleep
        while time.monotonic() < deadline and not run.stopping:
            time.sleep(0.1)

    common.clear_jobs(PREFIX)
    guard = threading.Timer(seconds, lambda: dispatcher.request_stop())
    started = clock.now()
    try:
        with registry.isolated():
            job(every=timedelta(seconds=2), name=fast_name)(fast)
            for i in range(3):
                job(
                    every=timedelta(seconds=30),
                    name=f"{PREFIX}long{i}",
                    timeout=timedelta(seconds=28),
                )(slow)
            declared = runnable_jobs()
            sync_rows(declared, clock.now())
            for d in declared:
                if d.name != fast_name:
                    operations.make_due(d.name, clock.now())  # busy from the first second
            dispatcher = loop.Dispatcher(declared, workers=4)
            guard.start()
            dispatcher.loop()
    finally:
        guard.cancel()

    records = list(
        JobRun.objects.filter(job=fast_name, scheduled_for__gte=started).values_list(
            "scheduled_for", "started_at", "missed_slots"
        )
    )
    busy = JobRun.objects.filter(job__startswith=f"{PREFIX}long").count()
    late = [(s - slot).total_seconds() for slot, s, _ in records if s is not None]
    coalesced = sum(m for *_, m in records)
    p50 = common.percentile(late, 50) if late else float("nan")
    p99 = common.percentile(late, 99) if late else float("nan")
    report = common.Report("P4L", "lateness under load: 3 of 4 workers busy with long runs")
    report.add(
        f"`loop.loop(workers=4)` for {seconds:g} s, database clock; 3 jobs every 30 s "
        f"sleeping {long_sleep:g} s each ({busy} long runs), one job every 2 s (one fenced "
        "insert)."
    )
    report.add("")
    for line in common.table(
        ["runs of the 2-s job", "p50", "p99", "max", "slots coalesced"],
        [
            [
                len(late),
                f"{p50 * 1000:.1f} ms",
                f"{p99 * 1000:.1f} ms",
                f"{max(late, default=0) * 1000:.1f} ms",
                coalesced,
            ]
        ],
    ):
        report.add(line)
    report.figures.update(p50=p50, p99=p99, runs=len(late), coalesced=coalesced)
    report.goal("p99 lateness of the 2-s job", "≤ 0.5 s", f"{p99 * 1000:.1f} ms", p99 <= 0.5)
    report.goal("slots coalesced", "0", str(coalesced), coalesced == 0)
    return report


if __name__ == "__main__":
    raise SystemExit(common.main(measure))
