"""P10: a runner's idle tick costs the same with 100,000 instances as with 100.

``loop.Dispatcher(runnable_jobs(["bench.digest"])).tick()`` in this process (what
``runjobs --once --job bench.digest`` does), the database clock, nothing due: the job of
the bench app declared with ``instances=True`` (bench/benchapp/jobs.py), first with 100
instances, then with 100,000. Each instance is yearly (``0 0 1 1 *``) with a jitter of
300 days, so their next fire times are spread over the year after next New Year and
none is due while the benchmark runs.

The instances and their lease rows are made by ``bulk_create`` in batches
(``common.make_instances``: saving 100,000 one by one, each in its own transaction,
would take minutes), each lease row as ``JobInstance.save()`` writes it; then ``VACUUM
ANALYZE``. The two sizes are measured one after the other (the table cannot hold both),
each as alternating samples of a few ticks.

Beside it, a runner of another job with instances (``bench.other``: 100 instances, each
due on 1 December, after every one of ``bench.digest``'s), at both sizes of
``bench.digest``: its idle tick must not read the other job's rows (they come first in
next fire time), so its time must not grow either.

Goals: the same statements at both sizes (the list, parameters cut); time(100,000) /
time(100) <= 1.2, for the runner of ``bench.digest`` and for the runner of the other
job. Shown with them: each statement's plan at 100,000 (``EXPLAIN ANALYZE``:
the index it reads and how many rows), and the plan of the claim statement
(``lease.claim_instances``, four free workers) at 100,000, both with nothing due and with
every instance due (its ``now`` a year and a half later, in a transaction rolled back):
by the partial index ``fencedjobs_instance_due``, reading as many rows as it claims.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

from bench import common

SMALL = 100
YEARLY = "0 0 1 1 *"
SPREAD = timedelta(days=300)
INDEX = "fencedjobs_instance_due"


def sizes(smoke: bool) -> tuple[int, int, int]:
    """(instances, samples per size, ticks per sample)."""
    return (2_000, 3, 5) if smoke else (100_000, 21, 50)


def normalized(sql: str) -> str:
    """A statement with its parameters cut (quoted literals, numbers, savepoints' names)."""
    sql = re.sub(r"'(?:[^']|'')*'", "?", sql)
    sql = re.sub(r'"s\d+_x\d+"', '"s?"', sql)
    return re.sub(r"\b\d+(\.\d+)?\b", "?", sql)


def plan(sql: str, *, analyze: bool = True) -> dict[str, Any]:
    """``EXPLAIN (ANALYZE, FORMAT JSON)`` of ``sql``, in a transaction rolled back."""
    from django.db import connection, transaction

    with transaction.atomic():
        with connection.cursor() as cursor:
            options = "ANALYZE, FORMAT JSON" if analyze else "FORMAT JSON"
            cursor.execute(f"EXPLAIN ({options}) {sql}")
            found = cursor.fetchone()[0]
        transaction.set_rollback(True)
    if isinstance(found, str):
        found = json.loads(found)
    return dict(found[0]["Plan"])


def nodes(node: dict[str, Any], depth: int = 0) -> list[tuple[int, dict[str, Any]]]:
    """The plan's nodes, depth first, with their depth."""
    out = [(depth, node)]
    for child in node.get("Plans", []):
        out += nodes(child, depth + 1)
    return out


def describe(node: dict[str, Any]) -> str:
    """One line per node: its type, the index or table, the rows it returned."""
    parts = []
    for depth, n in nodes(node):
        what = n["Node Type"]
        if "Index Name" in n:
            what += f" using {n['Index Name']}"
        elif "Relation Name" in n:
            what += f" on {n['Relation Name']}"
        rows = int(n.get("Actual Rows", 0)) * int(n.get("Actual Loops", 1))
        parts.append(f"{'  ' * depth}{what} ({rows:,} rows)")
    return "\n".join(parts)


def indexes(node: dict[str, Any]) -> set[str]:
    return {n["Index Name"] for _, n in nodes(node) if "Index Name" in n}


def seq_scans(node: dict[str, Any]) -> set[str]:
    return {n["Relation Name"] for _, n in nodes(node) if n["Node Type"] == "Seq Scan"}


def measure(smoke: bool) -> common.Report:
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from bench.benchapp.jobs import DIGEST, OTHER
    from django_fencedjobs import clock, lease, loop
    from django_fencedjobs.declared import runnable_jobs

    big, repeats, ticks = sizes(smoke)
    jobs = runnable_jobs([DIGEST])
    dispatcher = loop.Dispatcher(jobs)

    other_dispatcher = loop.Dispatcher(runnable_jobs([OTHER]))

    def idle() -> None:
        result = dispatcher.tick()
        if result.runs:
            raise RuntimeError("P10: an instance was due")

    def other_idle() -> None:
        if other_dispatcher.tick().runs:
            raise RuntimeError("P10: an instance of the other job was due")

    def statements() -> list[str]:
        with CaptureQueriesContext(connection) as queries:
            idle()
        return [q["sql"] for q in queries.captured_queries]

    common.drop_instances(DIGEST)
    common.drop_instances(OTHER)
    made = {SMALL: common.make_instances(DIGEST, SMALL, cron=YEARLY, jitter=SPREAD)}
    common.make_instances(OTHER, SMALL, cron="0 0 1 12 *")
    samples: dict[int, list[float]] = {}
    other_samples: dict[int, list[float]] = {}
    captured: dict[int, list[str]] = {}

    def measure_size(size: str | int) -> None:
        n = int(size)
        common.vacuum("fencedjobs_jobinstance", "fencedjobs_joblease")
        for _ in range(ticks):  # warm
            idle()
        captured[n] = statements()
        for _ in range(repeats):
            samples.setdefault(n, []).append(common.timed(idle, ticks))
            other_samples.setdefault(n, []).append(common.timed(other_idle, ticks))

    measure_size(SMALL)
    made[big] = common.make_instances(DIGEST, big - SMALL, cron=YEARLY, jitter=SPREAD, start=SMALL)
    measure_size(big)

    # The plans at 100,000: each statement of the idle tick, and the claim of four due
    # instances with nothing due and with every instance due.
    tick_plans = [
        plan(sql) if sql.lstrip().upper().startswith("SELECT") else None for sql in captured[big]
    ]
    claims: dict[str, dict[str, Any]] = {}
    for label, at in (("nothing due", timedelta(0)), ("every instance due", timedelta(days=550))):
        with transaction.atomic(), CaptureQueriesContext(connection) as queries:
            claimed = lease.claim_instances([DIGEST], clock.now() + at, 4)
            transaction.set_rollback(True)
        (sql,) = [q["sql"] for q in queries.captured_queries if "FOR UPDATE" in q["sql"]]
        claims[label] = {"sql": sql, "plan": plan(sql), "claimed": len(claimed)}

    report = common.Report("P10", "a runner's idle tick: 100 against 100,000 instances")
    report.add(
        f"`loop.Dispatcher(runnable_jobs(['{DIGEST}'])).tick()` in-process, database clock, "
        f"nothing due; {SMALL:,} then {big:,} instances (yearly, spread over a year by "
        f"jitter), made by `bulk_create` in {made[SMALL]:.1f} s and {made[big]:.0f} s, then "
        f"`VACUUM ANALYZE`; {repeats} samples of {ticks} ticks at each size."
    )
    report.add("")
    ms = {n: common.summarize([s * 1000 for s in values]) for n, values in samples.items()}
    for line in common.table(
        ["instances", "statements", "ms per idle tick"],
        [[f"{n:,}", len(captured[n]), ms[n].fmt(".3f")] for n in (SMALL, big)],
    ):
        report.add(line)
    same = [normalized(s) for s in captured[SMALL]] == [normalized(s) for s in captured[big]]
    report.add("")
    report.add(
        f"The statements of one idle tick at {big:,} instances (the same list at {SMALL:,}: "
        f"{'yes' if same else 'NO'}), with their plans (`EXPLAIN ANALYZE`):"
    )
    report.add("")
    for sql, found in zip(captured[big], tick_plans, strict=True):
        report.add(f"- `{_shorten(sql)}`")
        if found is not None:
            report.add("")
            report.add("  ```")
            report.add("\n".join("  " + line for line in describe(found).splitlines()))
            report.add("  ```")
    report.add("")
    for label, claim in claims.items():
        tail = _shorten(claim["sql"][claim["sql"].index(" FROM ") :], 400)
        report.add(
            f"The claim statement at {big:,} instances, {label} ({claim['claimed']} claimed "
            f"of 4 asked for): `SELECT …{tail}`"
        )
        report.add("")
        report.add("```")
        report.add(describe(claim["plan"]))
        report.add("```")
        report.add("")
    other_ms = {n: common.summarize([s * 1000 for s in v]) for n, v in other_samples.items()}
    report.add(
        f"A runner of `{OTHER}` ({SMALL} instances, due after all of `{DIGEST}`'s) beside "
        f"{SMALL:,} and {big:,} of `{DIGEST}`: {other_ms[SMALL].fmt('.3f')} ms and "
        f"{other_ms[big].fmt('.3f')} ms per idle tick."
    )
    report.add("")
    ratio = ms[big].median / ms[SMALL].median
    other_ratio = other_ms[big].median / other_ms[SMALL].median
    report.figures.update(
        ms_small=ms[SMALL].median,
        ms_big=ms[big].median,
        ratio=ratio,
        other_ratio=other_ratio,
    )
    report.goal(
        f"statements of an idle tick, {SMALL:,} and {big:,} instances",
        "the same list",
        f"{len(captured[SMALL])} and {len(captured[big])}, " + ("the same" if same else "differ"),
        same,
    )
    report.goal(
        f"time of an idle tick, {big:,} / {SMALL:,} instances",
        "≤ 1.2",
        f"{ratio:.2f} ({ms[big].median:.3f} ms against {ms[SMALL].median:.3f} ms)",
        ratio <= 1.2,
    )
    report.goal(
        f"time of another job's runner's idle tick, beside {big:,} / {SMALL:,} instances",
        "≤ 1.2",
        f"{other_ratio:.2f} ({other_ms[big].median:.3f} ms against "
        f"{other_ms[SMALL].median:.3f} ms)",
        other_ratio <= 1.2,
    )
    for label, claim in claims.items():
        used = INDEX in indexes(claim["plan"])
        scanned = seq_scans(claim["plan"])
        report.goal(
            f"the claim's plan at {big:,} instances, {label}",
            f"by `{INDEX}`, no sequential scan",
            (f"by `{INDEX}`" if used else f"indexes {sorted(indexes(claim['plan']))}")
            + (f"; sequential scan of {', '.join(sorted(scanned))}" if scanned else ""),
            used and not scanned,
        )
    common.drop_instances(DIGEST)
    common.drop_instances(OTHER)
    return report


def _shorten(sql: str, limit: int = 160) -> str:
    sql = " ".join(sql.split())
    return sql if len(sql) <= limit else sql[: limit - 1] + "…"


if __name__ == "__main__":
    raise SystemExit(common.main(measure))
