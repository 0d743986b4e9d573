"""P6: the loop's memory over 10,000 ticks.

``loop.loop(max_ticks=10_000)`` in a fresh process with ``LOOP_MAX_SLEEP = 0`` (ticks do
not sleep) and the fake clock, moved one second forward after every tick (the
``tick_finished`` signal), so that three jobs run all along: a fenced writer every 10 s,
a job that fails every 30 s (its traceback is recorded), and a ``run.windows()`` job every
60 s that advances its watermark window by window: about 1,500 runs. The resident set
(``VmRSS`` in ``/proc/self/status``) is read after a full garbage collection at tick 100
and every 1,000 ticks.

Goal: growth from tick 100 to the end <= 5 MB.
"""

from __future__ import annotations

import gc
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from bench import common

PREFIX = "bench.p6."
SETTINGS = {"CLOCK": "django_fencedjobs.clock.fake_clock", "LOOP_MAX_SLEEP": timedelta(0)}


def rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def measure(smoke: bool) -> common.Report:
    from django.test.utils import override_settings

    from bench.benchapp.models import Row
    from django_fencedjobs import fenced_atomic, job, loop, signals
    from django_fencedjobs.clock import fake_clock
    from django_fencedjobs.models import JobRun
    from django_fencedjobs.registry import registry

    ticks = 400 if smoke else 10_000
    every = 100 if smoke else 1_000
    baseline_tick = 100

    common.clear_jobs(PREFIX)
    samples: list[tuple[int, int, int]] = []  # (tick, rss kB, gc objects)
    count = 0

    def on_tick(sender: Any, **kwargs: Any) -> None:
        nonlocal count
        count += 1
        fake_clock.advance(timedelta(seconds=1))
        if count == baseline_tick or count % every == 0 or count == ticks:
            gc.collect()
            samples.append((count, rss_kb(), len(gc.get_objects())))

    def writer(run: Any) -> None:
        with fenced_atomic():
            Row.objects.create(seq=run.fence, note="p6")
            run.add_items(1)

    def failing(run: Any) -> None:
        raise RuntimeError("P6: a job that fails, so that tracebacks are recorded")

    def windows(run: Any) -> None:
        for window in run.windows(timedelta(seconds=10)):
            with fenced_atomic():
                Row.objects.create(seq=int(window.start.timestamp()), note="p6w")
                run.advance_watermark(window.end)

    # The failing job's records are still made (their cost is the loop's), not printed.
    log = logging.getLogger("django_fencedjobs")
    saved = log.propagate
    quiet = logging.NullHandler()
    log.propagate = False
    log.addHandler(quiet)
    signals.tick_finished.connect(on_tick, weak=False)
    try:
        with registry.isolated(), override_settings(FENCEDJOBS=SETTINGS):
            fake_clock.set(datetime.now(UTC).replace(microsecond=0))
            job(every=timedelta(seconds=10), name=f"{PREFIX}writer")(writer)
            job(every=timedelta(seconds=30), name=f"{PREFIX}failing")(failing)
            job(every=timedelta(seconds=60), name=f"{PREFIX}windows")(windows)
            loop.loop(max_ticks=ticks)
    finally:
        signals.tick_finished.disconnect(on_tick)
        log.propagate = saved
        log.removeHandler(quiet)

    runs = JobRun.objects.filter(job__startswith=PREFIX).count()
    base = next(s for s in samples if s[0] == baseline_tick)
    end = samples[-1]
    growth_mb = (end[1] - base[1]) / 1024

    report = common.Report("P6", f"the loop's resident memory over {ticks:,} ticks")
    report.add(
        f"`loop.loop(max_ticks={ticks})`, no sleep, fake clock +1 s per tick; {runs:,} runs "
        "(writer / failing / windows). RSS after `gc.collect()`:"
    )
    report.add("")
    for line in common.table(
        ["tick", "RSS MB", "vs tick 100", "gc objects"],
        [
            [t, f"{kb / 1024:.1f}", f"{(kb - base[1]) / 1024:+.2f} MB", f"{objs:,}"]
            for t, kb, objs in samples
        ],
    ):
        report.add(line)
    report.figures.update(growth_mb=growth_mb, runs=runs)
    report.goal(
        f"RSS growth, tick {baseline_tick} to {end[0]:,}",
        "≤ 5 MB",
        f"{growth_mb:+.2f} MB",
        growth_mb <= 5,
    )
    return report


if __name__ == "__main__":
    raise SystemExit(common.main(measure))
