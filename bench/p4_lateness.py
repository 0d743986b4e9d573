"""P4: how late the loop starts runs: ``started_at - scheduled_for``.

``loop.loop()`` in this process, with the database clock (the default) and the default
``LOOP_MAX_SLEEP``, runs 20 jobs due every 5 seconds, spread by a 5-second jitter (so
several share a second and run one after another, as they would in production); each run
writes one row in a fenced transaction. The loop stops after the first 150 runs; the
lateness of every run comes from its ``JobRun`` row (both instants are the database's).

Goal: p99 <= 0.5 s (p50 and p99 printed; the lower bound is 0).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from bench import common

PREFIX = "bench.p4."


def measure(smoke: bool) -> common.Report:
    from bench.benchapp.models import Row
    from django_fencedjobs import fenced_atomic, job
    from django_fencedjobs.models import JobRun, Outcome

    jobs = 4 if smoke else 20
    every = timedelta(seconds=1 if smoke else 5)
    wanted = 6 if smoke else 150
    limit = 60.0 if smoke else 300.0

    common.clear_jobs(PREFIX)
    finished = []

    def done(record: JobRun) -> bool:
        if record.job.startswith(PREFIX):
            finished.append(record.pk)
        return len(finished) >= wanted

    def handler(run: Any) -> None:
        with fenced_atomic():
            Row.objects.create(seq=run.fence, note="p4")

    def declare() -> None:
        for i in range(jobs):
            # The jitter is shorter than the interval, as system check E005 requires.
            spread = every - timedelta(milliseconds=100)
            job(every=every, jitter=spread, name=f"{PREFIX}job{i:02d}")(handler)

    common.loop_until(declare, done, seconds=limit)

    records = list(
        JobRun.objects.filter(pk__in=finished).values_list(
            "scheduled_for", "started_at", "outcome", "missed_slots"
        )
    )
    late = [(started - slot).total_seconds() for slot, started, _, _ in records]
    # The first run of each instant shows the loop's own wake-up; the others also wait for
    # the runs of that instant before them (jobs of one loop run one after another).
    first: dict[object, float] = {}
    for slot, started, _, _ in records:
        delay = (started - slot).total_seconds()
        first[slot] = min(first.get(slot, delay), delay)
    wake = list(first.values())
    failed = sum(1 for *_, outcome, _ in records if outcome != Outcome.SUCCEEDED)
    missed = sum(m for *_, m in records)
    p50, p99 = common.percentile(late, 50), common.percentile(late, 99)

    report = common.Report("P4", "loop lateness, `started_at - scheduled_for`")
    report.add(
        f"`loop.loop()` with the database clock and the default `LOOP_MAX_SLEEP`; {jobs} "
        f"jobs every {every.total_seconds():g} s with a {every.total_seconds():g} s jitter, "
        "each run one fenced insert; lateness of each run from its `JobRun` row."
    )
    report.add("")
    for line in common.table(
        ["runs", "p50", "p90", "p99", "max", "not succeeded", "slots coalesced"],
        [
            [
                len(late),
                f"{p50 * 1000:.1f} ms",
                f"{common.percentile(late, 90) * 1000:.1f} ms",
                f"{p99 * 1000:.1f} ms",
                f"{max(late) * 1000:.1f} ms",
                failed,
                missed,
            ]
        ],
    ):
        report.add(line)
    report.add("")
    report.add(
        f"The first run of each of the {len(wake)} instants (the loop's wake-up alone): "
        f"p50 {common.percentile(wake, 50) * 1000:.1f} ms, "
        f"p99 {common.percentile(wake, 99) * 1000:.1f} ms; the rest is waiting for the runs "
        "due at the same instant, which one loop runs one after another."
    )
    report.figures.update(p50=p50, p99=p99, runs=len(late))
    enough = len(late) >= wanted
    report.goal("runs measured", f"≥ {wanted}", str(len(late)), enough)
    report.goal("p50 lateness", "(printed; lower bound 0)", f"{p50 * 1000:.1f} ms", None)
    report.goal("p99 lateness", "≤ 0.5 s", f"{p99 * 1000:.1f} ms", p99 <= 0.5)
    return report


if __name__ == "__main__":
    raise SystemExit(common.main(measure))
