"""P1: the cost of the fence: ``fenced_atomic`` against plain ``transaction.atomic``.

One real run of a real ``@job`` (acquired by ``runner.tick()``, with its supervisor
thread) times, inside its handler, on its one connection, blocks of transactions that
write 1 row and 100 rows (``Model.objects.create`` per row), alternating
``with fenced_atomic():`` and ``with transaction.atomic():`` block by block. A third
variant times one statement round trip (``SELECT 1`` through the same Django cursor), the
unit the fence's overhead is measured in.

Goals: overhead at most one statement round trip; throughput ratio (fenced / plain)
>= 0.75 at 1 row, >= 0.95 at 100 rows.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bench import common

JOB = "bench.p1.fence_cost"
FAKE_CLOCK = {"CLOCK": "django_fencedjobs.clock.fake_clock"}


def measure(smoke: bool) -> common.Report:
    from django.db import connection, transaction
    from django.test.utils import override_settings

    from bench.benchapp.models import Row
    from django_fencedjobs import fenced_atomic, job
    from django_fencedjobs.clock import fake_clock
    from django_fencedjobs.registry import registry
    from django_fencedjobs.runner import tick

    repeats = 3 if smoke else 21
    # rows per transaction -> transactions per timed block (a block is ~0.2-0.4 s)
    plan = {1: 5, 100: 2} if smoke else {1: 200, 100: 8}
    rtt_block = 5 if smoke else 400

    def write(rows: int) -> None:
        for i in range(rows):
            Row.objects.create(seq=i, note="p1")

    def round_trip() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()

    samples: dict[tuple[str, int], list[float]] = {}

    def handler(run: object) -> None:
        def fenced(rows: int) -> None:
            with fenced_atomic():
                write(rows)

        def plain(rows: int) -> None:
            with transaction.atomic():
                write(rows)

        variants = {"fenced": fenced, "plain": plain}
        for rows, per_block in plan.items():
            for name, fn in variants.items():  # warm up: connection, ORM caches
                common.timed(lambda fn=fn, rows=rows: fn(rows), max(per_block // 4, 1))
            for _, name in common.alternate(repeats, ["fenced", "plain", "rtt"]):
                if name == "rtt":
                    value = common.timed(round_trip, rtt_block)
                    samples.setdefault(("rtt", rows), []).append(value)
                    continue
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
        f"One run of a `@job` through `runner.tick()`; in its handler, blocks of "
        f"{plan[1]} one-row and {plan[100]} hundred-row transactions "
        "(`Model.objects.create` per row), fenced and plain alternating, "
        f"{repeats} blocks each; a statement round trip is `SELECT 1` through the same "
        "Django cursor."
    )
    report.add("")
    rows_out = []
    for rows in plan:
        plain = common.summarize([s * 1000 for s in samples[("plain", rows)]])
        fenced = common.summarize([s * 1000 for s in samples[("fenced", rows)]])
        rtt = common.summarize([s * 1000 for s in samples[("rtt", rows)]])
        ratios = [
            p / f for p, f in zip(samples[("plain", rows)], samples[("fenced", rows)], strict=True)
        ]
        extra = [
            (f - p) * 1000
            for p, f in zip(samples[("plain", rows)], samples[("fenced", rows)], strict=True)
        ]
        ratio = common.summarize(ratios)
        overhead = common.summarize(extra)
        in_rtt = overhead.median / rtt.median
        rows_out.append(
            [
                rows,
                plain.fmt(".3f"),
                fenced.fmt(".3f"),
                overhead.fmt(".3f"),
                rtt.fmt(".3f"),
                f"{in_rtt:.2f}",
                ratio.fmt(".3f"),
                f"{1000 / plain.median:,.0f} / {1000 / fenced.median:,.0f}",
            ]
        )
        report.figures[f"plain_tps_{rows}"] = 1000 / plain.median
        report.figures[f"fenced_tps_{rows}"] = 1000 / fenced.median
        report.figures[f"ratio_{rows}"] = ratio.median
        target = 0.75 if rows == 1 else 0.95
        report.goal(
            f"{rows} row{'s' if rows > 1 else ''}: throughput fenced / plain",
            f"≥ {target}",
            f"{ratio.median:.3f}",
            ratio.median >= target,
        )
        report.goal(
            f"{rows} row{'s' if rows > 1 else ''}: overhead per transaction",
            "≤ 1 statement round trip",
            f"{overhead.median:.3f} ms = {in_rtt:.2f} round trips",
            in_rtt <= 1.0,
        )
    for line in common.table(
        [
            "rows",
            "plain ms/tx",
            "fenced ms/tx",
            "overhead ms",
            "round trip ms",
            "overhead in round trips",
            "throughput ratio",
            "tx/s plain / fenced",
        ],
        rows_out,
    ):
        report.add(line)
    return report


if __name__ == "__main__":
    raise SystemExit(common.main(measure))
