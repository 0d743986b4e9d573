"""P3: one ``runjobs --once`` pass with nothing due costs the same with 5 or 200 jobs.

``call_command("runjobs", "--once", verbosity=0)`` in this process (``-v 0``, as the crontab
recipe runs it), with the database clock (the default), against 5 and against 200
registered jobs whose next slot is months away. The
lease rows exist (a first pass created them). The two registries alternate pass by pass;
each timed sample is the mean of a few passes.

Goals: the same number of queries; time(200) / time(5) <= 1.5.
"""

from __future__ import annotations

import time
from datetime import timedelta

from bench import common

PREFIX = "bench.p3."


def measure(smoke: bool) -> common.Report:
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_fencedjobs import job
    from django_fencedjobs.registry import Job, registry

    repeats = 3 if smoke else 31
    passes = 2 if smoke else 20

    def handler(run: object) -> None:
        raise AssertionError("P3's jobs are never due")

    declared: list[Job] = []
    with registry.isolated():
        for i in range(200):
            # Yearly, spread over the year by the hour of day and the day of month:
            # never due within a benchmark, and not all on one schedule.
            cron = f"{i % 60} {i % 24} {1 + i % 28} {1 + i % 12} *"
            func = job(cron, name=f"{PREFIX}job{i:03d}", timeout=timedelta(minutes=10))(
                lambda run: handler(run)
            )
            declared.append(func.job)  # type: ignore[attr-defined]
    sets = {5: declared[:5], 200: declared}

    def once(jobs: list[Job], n: int) -> float:
        with registry.isolated():
            for j in jobs:
                registry.register(j)
            start = time.perf_counter()
            for _ in range(n):
                call_command("runjobs", "--once", verbosity=0)
            return (time.perf_counter() - start) / n

    common.clear_jobs(PREFIX)
    once(declared, 1)  # creates every lease row
    queries: dict[int, list[str]] = {}
    for size, jobs in sets.items():
        once(jobs, 3)  # warm
        with CaptureQueriesContext(connection) as captured:
            once(jobs, 1)
        queries[size] = [q["sql"] for q in captured.captured_queries]

    samples: dict[int, list[float]] = {5: [], 200: []}
    for _, size in common.alternate(repeats, [5, 200]):
        samples[size].append(once(sets[size], passes))

    report = common.Report("P3", "one `runjobs --once` pass, nothing due: 5 against 200 jobs")
    t5 = common.summarize([s * 1000 for s in samples[5]])
    t200 = common.summarize([s * 1000 for s in samples[200]])
    ratios = [b / a for a, b in zip(samples[5], samples[200], strict=True)]
    ratio = common.summarize(ratios)
    report.add(
        f"`call_command('runjobs', '--once', verbosity=0)` in-process, database clock; {repeats} "
        f"alternating samples of {passes} passes each."
    )
    report.add("")
    for line in common.table(
        ["jobs", "queries", "ms per pass"],
        [[5, len(queries[5]), t5.fmt(".3f")], [200, len(queries[200]), t200.fmt(".3f")]],
    ):
        report.add(line)
    report.add("")
    report.add("The queries of one pass (200 jobs, parameters cut):")
    report.add("")
    for sql in queries[200]:
        report.add(f"- `{_shorten(sql)}`")
    report.figures.update(ms_5=t5.median, ms_200=t200.median, ratio=ratio.median)
    report.goal(
        "query count, 5 and 200 jobs",
        "identical",
        f"{len(queries[5])} and {len(queries[200])}",
        len(queries[5]) == len(queries[200]),
    )
    report.goal("time 200 jobs / 5 jobs", "≤ 1.5", ratio.fmt(".2f"), ratio.median <= 1.5)
    return report


def _shorten(sql: str, limit: int = 110) -> str:
    cut = sql.split(" IN (", 1)
    if len(cut) == 2:
        sql = cut[0] + " IN (…)" + cut[1].split(")", 1)[1]
    return sql if len(sql) <= limit else sql[: limit - 1] + "…"


if __name__ == "__main__":
    raise SystemExit(common.main(measure))
