"""P9: what it costs per run to bound every run (docs/running.md, "Timeouts").

A run's handler runs in a thread of its own, beside a supervisor thread: that is what lets
the runner end a run at its timeout whatever the handler catches or blocks in, and be free
again. (The idle limit that ends a paused holder costs no statement of its own: it rides
in each fenced transaction's fence check, bench P1.) Measured side by side, alternating,
on one job whose handler makes one fenced one-row write:

* **run on a pool worker**: handed to a worker thread of a :class:`~django_fencedjobs.loop.Pool`
  and waited for, the path ``runjobs`` takes;
* **run in the caller's thread**: ``runner.run_named`` (the supervisor thread is still
  there; the run's own thread is not);
* **a process per run**, the other way to bound runs (celery's hard time limit, django-q2):
  the least such a process costs, starting Python and ``django.setup()`` with no run in it.

Goal: the run's own thread costs at most 25% of a run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta

from bench import common

NAME = "bench.p9.one_write"


def measure(smoke: bool) -> common.Report:

    from bench.benchapp.models import Row
    from django_fencedjobs import clock, fenced_atomic, job, loop, operations, runner
    from django_fencedjobs.declared import sync as sync_rows
    from django_fencedjobs.registry import registry

    repeats = 3 if smoke else 15
    runs_per_sample = 3 if smoke else 40
    processes = 2 if smoke else 10

    def one_write(run: object) -> None:
        with fenced_atomic():
            Row.objects.create(seq=run.fence, note="p9")  # type: ignore[attr-defined]

    common.clear_jobs("bench.p9.")
    with registry.isolated():
        declared = job(every=timedelta(hours=1), name=NAME)(one_write).job  # type: ignore[attr-defined]
        sync_rows([declared], clock.now())

        def make_due() -> None:
            operations.make_due(NAME, clock.now())

        def sample(how: str) -> float:
            total = 0.0
            for _ in range(runs_per_sample):
                make_due()
                start = time.perf_counter()
                if how == "thread":
                    (acquired,) = runner.claim(1, named={NAME: declared})
                    pool.submit(acquired)
                    while not (done := pool.finished()):
                        pool.wake.wait(1)
                        pool.wake.clear()
                    (record,) = done
                else:
                    record = runner.run_named(declared)
                total += time.perf_counter() - start
                assert record is not None and record.outcome == "succeeded", record
            return total / runs_per_sample

        pool = loop.Pool(1)
        sample("thread"), sample("caller")  # warm
        samples: dict[str, list[float]] = {"thread": [], "caller": []}
        for _, how in common.alternate(repeats, ["thread", "caller"]):
            samples[how].append(sample(how))
        pool.shutdown()
    Row.objects.filter(note="p9").delete()

    env = dict(os.environ, DJANGO_SETTINGS_MODULE="bench.settings")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(common.REPO), env.get("PYTHONPATH", "")) if p
    )
    startups = []
    for _ in range(processes):
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", "import django; django.setup()"],
            env=env,
            cwd=common.REPO,
            check=True,
        )
        startups.append(time.perf_counter() - start)

    ms = {how: common.summarize([v * 1000 for v in values]) for how, values in samples.items()}
    process = common.summarize([v * 1000 for v in startups])
    own_thread = ms["thread"].median - ms["caller"].median
    share = max(own_thread, 0) / ms["thread"].median
    report = common.Report("P9", "the cost of bounding every run")
    report.add(
        f"{repeats} alternating samples of {runs_per_sample} runs each (one fenced one-row "
        f"write per run), and {processes} process start-ups."
    )
    report.add("")
    for line in common.table(
        ["per run", "ms"],
        [
            ["run on a pool worker (runjobs)", ms["thread"].fmt(".3f")],
            ["run in the caller's thread", ms["caller"].fmt(".3f")],
            ["a process per run: Python + django.setup() alone", process.fmt(".1f")],
        ],
    ):
        report.add(line)
    report.add("")
    report.add(
        f"Handing the run to a worker thread costs {own_thread:.3f} ms: {share:.0%} of a run. "
        "A process per run would "
        f"cost {process.median / ms['thread'].median:.0f}x a whole run before doing anything."
    )
    report.figures.update(
        thread_ms=ms["thread"].median,
        caller_ms=ms["caller"].median,
        process_ms=process.median,
        share=share,
    )
    report.goal("own thread, share of a run", "≤ 25%", f"{share:.0%}", share <= 0.25)
    return report


if __name__ == "__main__":
    raise SystemExit(common.main(measure))
