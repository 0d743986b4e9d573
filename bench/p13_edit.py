"""P13: changing one instance's schedule costs the same with 100,000 instances as with 100.

``digest.instances.upsert(key, cron=..., kwargs=...)`` in this process (read the instance,
check it as the system checks do, save it and recompute its lease row's next fire time,
in one transaction), for one instance of the bench app's job declared with
``instances=True`` (bench/benchapp/jobs.py), first among 100 instances, then among
100,000. Every edit gives a cron expression not given before (``m h 1 1 *``), so each
is checked afresh, as a user's edit is, and each changes the next fire time.

The instances are made as P10 makes them (``common.make_instances``: ``bulk_create`` in
batches, each lease row as ``JobInstance.save()`` writes it), then ``VACUUM ANALYZE``. The
two sizes are measured one after the other, each as samples of a few edits.

Goals: the same statements at both sizes (the list, parameters cut); time(100,000) /
time(100) <= 1.2. Shown with them: the CPU time of checking a new schedule alone (the
instance's job built and its shortest interval found, what ``full_clean()`` does), a
constant part of every edit; and the same for P11's two schedules, which a runner pays
for every run of an instance it claims.
"""

from __future__ import annotations

import itertools
import time
from datetime import timedelta

from bench import common
from bench.p10_idle_instances import SMALL, SPREAD, YEARLY, normalized

KEY = "i000050"
#: Schedules whose check is timed alone: an edit's (a new yearly expression each time,
#: cron None), and P11's two populations'.
SCHEDULES = [
    ("an edit's (m h 1 1 *)", None, timedelta(0)),
    ("P11's hourly (0 * * * *, jitter 59 min)", "0 * * * *", timedelta(minutes=59)),
    (
        "P11's every 5 minutes (*/5 * * * *, jitter 4 min 59 s)",
        "*/5 * * * *",
        timedelta(minutes=4, seconds=59),
    ),
]


def sizes(smoke: bool) -> tuple[int, int, int]:
    """(instances, samples per size, edits per sample)."""
    return (2_000, 3, 2) if smoke else (100_000, 21, 10)


def measure(smoke: bool) -> common.Report:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from bench.benchapp.jobs import DIGEST, digest
    from django_fencedjobs import instances
    from django_fencedjobs.models import JobInstance
    from django_fencedjobs.registry import registry

    big, repeats, edits = sizes(smoke)
    # Never the same expression twice: a new definition is checked, not found in a cache.
    crons = (f"{m} {h} 1 1 *" for h, m in itertools.product(range(24), range(60)))

    def edit() -> None:
        digest.instances.upsert(KEY, cron=next(crons), kwargs={"tenant": 50})  # type: ignore[attr-defined]

    samples: dict[int, list[float]] = {}
    captured: dict[int, list[str]] = {}

    def measure_size(n: int) -> None:
        common.vacuum("fencedjobs_jobinstance", "fencedjobs_joblease")
        for _ in range(3):  # warm
            edit()
        with CaptureQueriesContext(connection) as queries:
            edit()
        captured[n] = [q["sql"] for q in queries.captured_queries]
        for _ in range(repeats):
            samples.setdefault(n, []).append(common.timed(edit, edits))

    common.drop_instances(DIGEST)
    made = common.make_instances(DIGEST, SMALL, cron=YEARLY, jitter=SPREAD)
    measure_size(SMALL)
    made += common.make_instances(DIGEST, big - SMALL, cron=YEARLY, jitter=SPREAD, start=SMALL)
    measure_size(big)

    # Checking a new schedule alone: the instance's job built and found valid. Also for
    # P11's schedules, where a runner builds it for every run (a new key each time).
    base = registry.get(DIGEST)
    builds: dict[str, list[float]] = {}
    keys = itertools.count()
    for _ in range(repeats):
        for label, cron, jitter in SCHEDULES:
            candidate = JobInstance(
                job=DIGEST,
                key=f"c{next(keys)}",
                cron=cron or next(crons),
                jitter=jitter,
                kwargs={"tenant": 50},
            )
            start = time.process_time()
            if not instances.instance_job(base, candidate).valid:
                raise RuntimeError(f"P13: {candidate.cron} is refused")
            builds.setdefault(label, []).append(time.process_time() - start)
    checks = builds[SCHEDULES[0][0]]
    common.drop_instances(DIGEST)

    report = common.Report("P13", "one edit of an instance's schedule: 100 against 100,000")
    report.add(
        f"`digest.instances.upsert({KEY!r}, cron=<a new one each time>, kwargs=...)` "
        f"in-process; {SMALL:,} then {big:,} instances (made by `bulk_create` in "
        f"{made:.0f} s, then `VACUUM ANALYZE`); {repeats} samples of {edits} edits at each "
        "size."
    )
    report.add("")
    ms = {n: common.summarize([s * 1000 for s in values]) for n, values in samples.items()}
    for line in common.table(
        ["instances", "statements", "ms per edit"],
        [[f"{n:,}", len(captured[n]), ms[n].fmt(".2f")] for n in (SMALL, big)],
    ):
        report.add(line)
    same = [normalized(s) for s in captured[SMALL]] == [normalized(s) for s in captured[big]]
    check = common.summarize([c * 1000 for c in checks])
    report.add("")
    report.add(
        f"Checking the new schedule alone (the instance's job built and found valid, as "
        f"`full_clean()` does): {check.fmt('.2f')} CPU ms, most of it the shortest "
        "interval between fire times, found from a year of them."
    )
    report.add("")
    report.add(
        "The same check alone for a new instance of other schedules (CPU ms; a runner "
        "builds the job of each instance it claims, and its cache of 4,096 instance jobs "
        "holds none of 100,000 instances between their runs):"
    )
    report.add("")
    for line in common.table(
        ["schedule", "CPU ms to build and check"],
        [
            [label, common.summarize([b * 1000 for b in builds[label]]).fmt(".2f")]
            for label in builds
        ],
    ):
        report.add(line)
    report.add("")
    report.add(
        f"The statements of one edit at {big:,} instances (the same list at {SMALL:,}: "
        f"{'yes' if same else 'NO'}):"
    )
    report.add("")
    for sql in captured[big]:
        report.add(f"- `{_shorten(sql)}`")
    ratio = ms[big].median / ms[SMALL].median
    report.figures.update(
        ms_small=ms[SMALL].median, ms_big=ms[big].median, ratio=ratio, check_ms=check.median
    )
    report.goal(
        f"statements of one edit, {SMALL:,} and {big:,} instances",
        "the same list",
        f"{len(captured[SMALL])} and {len(captured[big])}, " + ("the same" if same else "differ"),
        same,
    )
    report.goal(
        f"time of one edit, {big:,} / {SMALL:,} instances",
        "≤ 1.2",
        f"{ratio:.2f} ({ms[big].median:.2f} ms against {ms[SMALL].median:.2f} ms)",
        ratio <= 1.2,
    )
    report.goal(
        "of which checking the new schedule (CPU)",
        "(printed)",
        f"{check.median:.2f} ms",
        None,
    )
    return report


def _shorten(sql: str, limit: int = 160) -> str:
    sql = " ".join(sql.split())
    return sql if len(sql) <= limit else sql[: limit - 1] + "…"


if __name__ == "__main__":
    raise SystemExit(common.main(measure))
