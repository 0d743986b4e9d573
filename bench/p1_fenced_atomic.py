"""P1: the cost of the fence: ``fenced_atomic`` against plain ``transaction.atomic``.

One real run of a real ``@job`` (acquired by ``loop.tick()``, with its supervisor
thread) times, inside its handler, on its one connection, blocks of transactions that
write 1 row and 100 rows (``Model.objects.create`` per row), alternating
``with fenced_atomic():`` and ``with transaction.atomic():`` block by block. For the
one-row transactions a third variant is the plain transaction with one more statement
(``SELECT 1`` through the same Django cursor): what one statement round trip costs in
that very transaction, the unit the fence's overhead is measured in. (A round trip costs
far more between two durable commits than in a tight loop of ``SELECT 1``: the processes
go idle while the WAL is flushed.) A fourth is the plain transaction with ``SELECT 1``
sent in BEGIN's round trip, the way the fence's check is sent: the floor of what any check
made by a statement can cost. A fifth sends there the fence's own check without its row
lock (the same lookup of the lease row by name and fence, read only): it splits
what the fence costs above that floor into the lookup and the lock. A sixth sends the
lookup with its lock (the check is an ``UPDATE`` that marks the row with the fence whose
work commits) but without what the fence's check also does in that statement (set the
transaction's idle limit, say which transaction it is): what those cost.

Goals: overhead at most one statement round trip; throughput ratio (fenced / plain)
>= 0.9 at 1 row, >= 0.95 at 100 rows.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bench import common

JOB = "bench.p1.fence_cost"
FAKE_CLOCK = {"CLOCK": "django_fencedjobs.clock.fake_clock"}


def measure(smoke: bool) -> common.Report:
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext, override_settings

    from bench.benchapp.models import Row
    from django_fencedjobs import Run, db, fenced_atomic, job
    from django_fencedjobs.clock import fake_clock
    from django_fencedjobs.loop import tick
    from django_fencedjobs.models import JobLease
    from django_fencedjobs.registry import registry

    repeats = 3 if smoke else 21
    # rows per transaction -> transactions per timed block (a block is ~0.2-0.4 s)
    plan = {1: 5, 100: 2} if smoke else {1: 250, 100: 8}

    def write(rows: int) -> None:
        for i in range(rows):
            Row.objects.create(seq=i, note="p1")

    samples: dict[tuple[str, int], list[float]] = {}
    statements: dict[str, int] = {}

    def handler(run: Run) -> None:
        def fenced(rows: int) -> None:
            with fenced_atomic():
                write(rows)

        def plain(rows: int) -> None:
            with transaction.atomic():
                write(rows)

        def plain_one_more(rows: int) -> None:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("SELECT 1")
                    cursor.fetchone()
                write(rows)

        def plain_with_begin(rows: int) -> None:
            # The least any check made by a statement can cost: a statement that reads
            # nothing, sent in BEGIN's round trip as the fence's check is.
            with transaction.atomic():
                db.first_statement(connection, "SELECT 1", [])
                write(rows)

        def plain_with_read(rows: int) -> None:
            # The fence's check without its lock: what the lookup alone costs. (Not a
            # fence: without the lock a takeover can commit between it and the writes.)
            with transaction.atomic():
                db.first_statement(
                    connection,
                    f"SELECT 1 FROM {table} WHERE name = %s AND fence = %s",
                    [run.job.name, run.fence],
                )
                write(rows)

        def plain_with_lock(rows: int) -> None:
            # The fence's lookup and lock, without the idle limit and the transaction's
            # identity that the fence's check returns with them.
            with transaction.atomic():
                db.first_statement(
                    connection,
                    f"UPDATE {table} SET committed_fence = fence WHERE name = %s AND fence = %s"
                    " RETURNING 1",
                    [run.job.name, run.fence],
                )
                write(rows)

        table = connection.ops.quote_name(JobLease._meta.db_table)
        variants = {
            "fenced": fenced,
            "plain": plain,
            "plain+1": plain_one_more,
            "plain+0": plain_with_begin,
            "plain+read": plain_with_read,
            "plain+lock": plain_with_lock,
        }
        for name in ("plain", "fenced"):
            with CaptureQueriesContext(connection) as captured:
                variants[name](1)
            statements[name] = len(captured.captured_queries)
        for rows, per_block in plan.items():
            names = (
                ["fenced", "plain", "plain+1", "plain+0", "plain+read", "plain+lock"]
                if rows == 1
                else ["fenced", "plain"]
            )
            for name in names:  # warm up: connection, ORM caches
                common.timed(lambda f=variants[name], r=rows: f(r), max(per_block // 4, 1))
            for _, name in common.alternate(repeats, names):
                fn = variants[name]
                value = common.timed(lambda fn=fn, rows=rows: fn(rows), per_block)
                samples.setdefault((name, rows), []).append(value)

    common.clear_jobs("bench.p1.")
    Row.objects.all().delete()
    start = datetime.now(UTC).replace(microsecond=0)
    with registry.isolated(), override_settings(FENCEDJOBS=FAKE_CLOCK):
        fake_clock.set(start)
        job(every=timedelta(hours=1), name=JOB, timeout=timedelta(minutes=30))(handler)
        tick()  # creates the lease row; the first slot is an hour away
        fake_clock.advance(timedelta(hours=1))
        (record,) = tick().runs
        if record.outcome != "succeeded":
            raise RuntimeError(f"P1's run did not succeed: {record.outcome}\n{record.error}")

    report = common.Report("P1", "fenced_atomic against transaction.atomic, same connection")
    report.add(
        f"One run of a `@job` through `loop.tick()`; in its handler, blocks of "
        f"{plan[1]} one-row and {plan[100]} hundred-row transactions "
        "(`Model.objects.create` per row), fenced and plain alternating, "
        f"{repeats} blocks each. *One round trip* is what one more statement (`SELECT 1`) "
        "adds to the plain one-row transaction, measured alongside."
    )
    report.add("")

    def ms(key: tuple[str, int]) -> common.Summary:
        return common.summarize([v * 1000 for v in samples[key]])

    def paired(a: tuple[str, int], b: tuple[str, int]) -> list[float]:
        return [(x - y) * 1000 for x, y in zip(samples[a], samples[b], strict=True)]

    def ratios(a: tuple[str, int], b: tuple[str, int]) -> common.Summary:
        """Throughput of ``b`` over ``a``, block by block: ``a``'s time over ``b``'s."""
        return common.summarize([x / y for x, y in zip(samples[a], samples[b], strict=True)])

    out = []
    for rows in plan:
        plain, fenced = ms(("plain", rows)), ms(("fenced", rows))
        ratio = ratios(("plain", rows), ("fenced", rows))
        overhead = common.summarize(paired(("fenced", rows), ("plain", rows)))
        out.append(
            [
                rows,
                plain.fmt(".3f"),
                fenced.fmt(".3f"),
                overhead.fmt(".3f"),
                ratio.fmt(".3f"),
                f"{1000 / plain.median:,.0f} / {1000 / fenced.median:,.0f}",
            ]
        )
        report.figures[f"plain_tps_{rows}"] = 1000 / plain.median
        report.figures[f"fenced_tps_{rows}"] = 1000 / fenced.median
        report.figures[f"ratio_{rows}"] = ratio.median
        target = 0.9 if rows == 1 else 0.95
        report.goal(
            f"{rows} row{'s' if rows > 1 else ''}: throughput fenced / plain",
            f"≥ {target}",
            f"{ratio.median:.3f}",
            ratio.median >= target,
        )
    for line in common.table(
        [
            "rows",
            "plain ms/tx",
            "fenced ms/tx",
            "fenced - plain, ms",
            "throughput fenced / plain",
            "tx/s plain / fenced",
        ],
        out,
    ):
        report.add(line)

    fence = common.summarize(paired(("fenced", 1), ("plain", 1)))
    trip = common.summarize(paired(("plain+1", 1), ("plain", 1)))
    in_trips = fence.median / trip.median
    report.add("")
    report.add(
        f"One-row transactions: the fence adds {fence.fmt('.3f')} ms; one more statement "
        f"adds {trip.fmt('.3f')} ms (plain + `SELECT 1`: {ms(('plain+1', 1)).fmt('.3f')} "
        f"ms/tx). The fence costs **{in_trips:.2f}** statement round trips."
    )
    report.add("")
    report.add(
        f"Round trips of one one-row transaction, as Django logs them: plain "
        f"{statements['plain']} (BEGIN, INSERT, COMMIT), fenced {statements['fenced']} "
        "(BEGIN, the fence, INSERT, COMMIT)."
    )
    floor = common.summarize(paired(("plain+0", 1), ("plain", 1)))
    ceiling = ratios(("plain", 1), ("plain+0", 1))
    report.add("")
    report.add(
        f"The floor of any check made by a statement: `SELECT 1` sent in BEGIN's round trip "
        f"(as the fence's check is) adds {floor.fmt('.3f')} ms to the plain one-row "
        f"transaction, a throughput ratio of {ceiling.fmt('.3f')}: the server's cost of one "
        "more statement (parse, plan, execute, one more result), with no round trip of its "
        "own. The fence's check is that statement plus an index lookup and a row lock; "
        "what it costs above the floor is "
        f"{fence.median - floor.median:.3f} ms."
    )
    read = common.summarize(paired(("plain+read", 1), ("plain", 1)))
    unlocked = ratios(("plain", 1), ("plain+read", 1))
    report.add("")
    report.add(
        f"The same check without its row lock (the lookup alone, sent the same way) adds "
        f"{read.fmt('.3f')} ms, a throughput ratio of {unlocked.fmt('.3f')}: of the "
        f"fence's {fence.median:.3f} ms, {read.median - floor.median:.3f} ms is the lookup "
        f"and {fence.median - read.median:.3f} ms the lock (the check updates the lease "
        "row, marking the fence whose work commits: a new version of the row, written to "
        "the table and the WAL; it is what makes the check hold until the commit)."
    )
    locked = common.summarize(paired(("plain+lock", 1), ("plain", 1)))
    report.add("")
    report.add(
        f"The lookup with its lock but without the transaction's idle limit and identity "
        f"(the fence's check as it was before they rode in its statement) adds "
        f"{locked.fmt('.3f')} ms, a throughput ratio of "
        f"{ratios(('plain', 1), ('plain+lock', 1)).fmt('.3f')}: the idle limit and the "
        f"identity cost {fence.median - locked.median:.3f} ms of the fence's "
        f"{fence.median:.3f} ms."
    )
    report.figures["locked_ms"] = locked.median
    report.figures["lookup_ms"] = read.median
    report.figures["unlocked_ratio"] = unlocked.median
    report.figures["floor_ms"] = floor.median
    report.figures["ceiling_ratio"] = ceiling.median
    report.figures["overhead_ms"] = fence.median
    report.figures["round_trip_ms"] = trip.median
    report.goal(
        "overhead per transaction",
        "≤ 1 statement round trip",
        f"{fence.median:.3f} ms = {in_trips:.2f} round trips of {trip.median:.3f} ms",
        in_trips <= 1.0,
    )
    report.goal(
        "statements the fence adds per transaction",
        "(printed)",
        str(statements["fenced"] - statements["plain"]),
        None,
    )
    return report


if __name__ == "__main__":
    raise SystemExit(common.main(measure))
