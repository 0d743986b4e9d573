"""P2: ``run.batches()`` per-item claims against a raw ``select_for_update(skip_locked=True)``.

A queue of 20,000 ``Task`` rows is consumed by 1, 2 and 4 worker processes, in batches of
1 and of 100, two ways:

* **fenced**: each worker owns a ``@job`` (one job per worker: a job's lease lets one run
  at a time, so parallel consumers of one queue are separate jobs) whose handler is
  ``for batch in run.batches(queue, size): mark them; run.add_items(...)``, run through
  ``loop.tick()``: lease acquisition, supervisor thread, a fenced transaction per batch,
  the run's record;
* **raw**: the same loop written by hand, ``with transaction.atomic():`` around
  ``list(queue.select_for_update(skip_locked=True, of=("self",))[:size])``.

Both mark a batch with one ``UPDATE ... SET processed_at, processed_by,
times_processed = times_processed + 1 WHERE id IN (...)``. With batches of 100 the workers
drain the whole queue; with batches of 1 they stop (``break``) after 2,500 claims between
them, so that five repeats fit in the time ``make bench`` has. The rate is items over the
wall time from the first worker's start to the last one's end; the workers are started and
connected beforehand and wait for a go. The fenced rate is that of the handler's loop (the
run's own cost, its lease and record, is printed apart: it is per run, not per item).
Fenced and raw alternate, pair by pair; the queue is refilled before every drain. After
every drain the benchmark asserts that no item was processed twice and none was lost
(``times_processed`` is 1 on exactly as many rows as the workers counted, 0 on the rest),
and prints how many were processed twice.

Goal: fenced >= 0.9 x the raw rate in every configuration; zero items processed twice.
"""

from __future__ import annotations

import multiprocessing
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from bench import common

PREFIX = "bench.p2."
FAKE_CLOCK = {"CLOCK": "django_fencedjobs.clock.fake_clock"}


def worker(index: int, conn: Any) -> None:
    """A worker process: one job of its own, drains the queue when told to."""
    common.setup_django()
    from django.db import connection, transaction
    from django.db.models import F
    from django.test.utils import override_settings

    from bench.benchapp.models import Task
    from django_fencedjobs import job
    from django_fencedjobs.clock import fake_clock
    from django_fencedjobs.loop import tick
    from django_fencedjobs.registry import registry

    name = f"{PREFIX}worker{index}"
    state: dict[str, Any] = {"size": 1, "limit": None}
    queue = Task.objects.filter(processed_at=None).order_by("id")

    def mark(batch: list[Task], stamp: datetime) -> None:
        Task.objects.filter(pk__in=[task.pk for task in batch]).update(
            processed_at=stamp, processed_by=index, times_processed=F("times_processed") + 1
        )

    def drain(run: Any) -> None:
        state["claims_start"] = time.monotonic()
        batches = run.batches(queue, size=state["size"])
        done = 0
        for batch in batches:
            mark(batch, run.now)
            run.add_items(len(batch))
            done += len(batch)
            if state["limit"] is not None and done >= state["limit"]:
                break
        batches.close()  # after a break: commits the last batch now, inside the timing
        state["claims_end"] = time.monotonic()

    def raw(size: int, limit: int | None) -> int:
        stamp = datetime.now(UTC)
        claim = queue.select_for_update(skip_locked=True, of=("self",))
        done = 0
        while limit is None or done < limit:
            with transaction.atomic():
                batch = list(claim[:size])
                if not batch:
                    return done
                mark(batch, stamp)
            done += len(batch)
        return done

    with registry.isolated(), override_settings(FENCEDJOBS=FAKE_CLOCK):
        fake_clock.set(datetime.now(UTC).replace(microsecond=0))
        job(
            every=timedelta(hours=1),
            name=name,
            max_batches=1_000_000_000,
            timeout=timedelta(minutes=30),
        )(drain)
        tick([name])  # creates the lease row
        connection.ensure_connection()
        conn.send("ready")
        while True:
            command = conn.recv()
            if command == "stop":
                return
            variant, size, limit = command
            state["size"], state["limit"] = size, limit
            fake_clock.advance(timedelta(hours=1))  # the job's next slot is due
            conn.send("ready")
            conn.recv()  # go
            start = time.monotonic()
            if variant == "fenced":
                (record,) = tick([name]).runs
                if record.outcome != "succeeded":
                    raise RuntimeError(f"{name}: {record.outcome}: {record.error}")
                done = record.items
                end = time.monotonic()
                conn.send((state["claims_start"], state["claims_end"], done, start, end))
            else:
                done = raw(size, limit)
                end = time.monotonic()
                conn.send((start, end, done, start, end))


def refill(rows: int) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE benchapp_task RESTART IDENTITY")
        cursor.execute(
            "INSERT INTO benchapp_task (processed_at, processed_by, times_processed)"
            " SELECT NULL, NULL, 0 FROM generate_series(1, %s)",
            [rows],
        )
        cursor.execute("ANALYZE benchapp_task")


def check(rows: int, counted: int) -> int:
    """Items processed more than once; raises if any was, or if the rows marked processed
    are not exactly the ones the workers counted."""
    from django.db.models import Count, Q

    from bench.benchapp.models import Task

    tally = Task.objects.aggregate(
        twice=Count("id", filter=Q(times_processed__gt=1)),
        once=Count("id", filter=Q(times_processed=1)),
        total=Count("id"),
    )
    if tally["twice"] or tally["once"] != counted or tally["total"] != rows:
        raise AssertionError(
            f"P2: {tally['twice']} item(s) processed twice, {tally['once']} once, "
            f"{counted} counted by the workers, of {rows}"
        )
    return int(tally["twice"])


def measure(smoke: bool) -> common.Report:
    rows = 200 if smoke else 20_000
    single_claims = 40 if smoke else 2_500  # per drain with batches of 1, all workers
    repeats = 1 if smoke else 5
    sizes = [1, 100]
    worker_counts = [1, 2, 4]

    common.clear_jobs(PREFIX)
    context = multiprocessing.get_context("spawn")
    pipes = []
    procs = []
    for index in range(max(worker_counts)):
        parent, child = context.Pipe()
        proc = context.Process(target=worker, args=(index, child), daemon=True)
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    for pipe in pipes:
        if pipe.recv() != "ready":
            raise RuntimeError("a P2 worker failed to start")

    rates: dict[tuple[int, int, str], list[float]] = {}
    whole_rates: dict[tuple[int, int], list[float]] = {}
    fixed: list[float] = []  # seconds of a run outside its claims loop
    twice = 0
    drains = 0
    items = 0
    try:
        for repeat in range(repeats):
            for size in sizes:
                for count in worker_counts:
                    # Each pair back to back, which one first alternating: drift cancels.
                    order = ["fenced", "raw"] if repeat % 2 == 0 else ["raw", "fenced"]
                    for variant in order:
                        refill(rows)
                        active = pipes[:count]
                        limit = -(-single_claims // count) if size == 1 else None
                        for pipe in active:
                            pipe.send((variant, size, limit))
                        for pipe in active:
                            pipe.recv()
                        for pipe in active:
                            pipe.send("go")
                        results = [pipe.recv() for pipe in active]
                        wall = max(r[1] for r in results) - min(r[0] for r in results)
                        done = sum(r[2] for r in results)
                        twice += check(rows, done)
                        drains += 1
                        items += done
                        rates.setdefault((size, count, variant), []).append(done / wall)
                        if variant == "fenced":
                            whole = max(r[4] for r in results) - min(r[3] for r in results)
                            whole_rates.setdefault((size, count), []).append(done / whole)
                            fixed.extend((r[4] - r[3]) - (r[1] - r[0]) for r in results)
    finally:
        for pipe in pipes:
            pipe.send("stop")
        for proc in procs:
            proc.join(timeout=30)

    report = common.Report("P2", "`run.batches()` against a raw `SKIP LOCKED` loop")
    report.add(
        f"A queue of {rows:,} rows, 1, 2 and 4 worker processes; batches of 100 drain it, "
        f"batches of 1 stop after {single_claims:,} claims; fenced (a `@job` per worker, "
        f"through `loop.tick()`) and raw alternating, {repeats} repeat(s) each. Items "
        "per second of the claims loops (the handler's loop; the raw loop), over the wall "
        "time from the first worker's start to the last one's end."
    )
    report.add("")
    out = []
    for size in sizes:
        for count in worker_counts:
            fenced = rates[(size, count, "fenced")]
            raw = rates[(size, count, "raw")]
            ratio = common.summarize([f / r for f, r in zip(fenced, raw, strict=True)])
            whole = common.summarize(
                [w / r for w, r in zip(whole_rates[(size, count)], raw, strict=True)]
            )
            out.append(
                [
                    size,
                    count,
                    common.summarize(raw).fmt(",.0f"),
                    common.summarize(fenced).fmt(",.0f"),
                    ratio.fmt(".3f"),
                    f"{whole.median:.3f}",
                ]
            )
            report.figures[f"ratio_{size}_{count}"] = ratio.median
            report.figures[f"fenced_rate_{size}_{count}"] = common.summarize(fenced).median
            report.goal(
                f"batch {size}, {count} worker{'s' if count > 1 else ''}: fenced / raw rate",
                "≥ 0.9",
                f"{ratio.median:.3f}",
                ratio.median >= 0.9,
            )
    for line in common.table(
        [
            "batch",
            "workers",
            "raw items/s",
            "fenced items/s",
            "fenced / raw",
            "with the run's own cost",
        ],
        out,
    ):
        report.add(line)
    run_cost = common.summarize([f * 1000 for f in fixed])
    report.add("")
    report.add(
        "The last column counts each fenced worker from the start of its `tick()` to its "
        "end: the run's own cost, outside the claims (lease, run record, supervisor thread), "
        f"is {run_cost.fmt('.1f')} ms per run, whatever the number of items."
    )
    report.add("")
    report.add(
        f"Items processed twice, over all {drains} drains ({items:,} items): "
        f"**{twice}** (asserted after every drain)."
    )
    report.figures["run_cost_ms"] = run_cost.median
    report.goal("items processed twice", "0", str(twice), twice == 0)
    return report


if __name__ == "__main__":
    raise SystemExit(common.main(measure))
