"""P5: the admin's changelists over 1,000,000 runs.

``JobRun`` is filled with 1,000,000 rows of 50 jobs (``INSERT ... SELECT`` over
``generate_series``; ``VACUUM ANALYZE`` after, as autovacuum would do), the jobs are
declared and their lease rows exist. A staff user (not a superuser: view permissions on
runs and jobs) opens the runs changelist and the jobs changelist through Django's test
client. Side by side, alternating, the same page is read with a plain ``SELECT`` through
the same connection (``SELECT * ... ORDER BY <the changelist's order> LIMIT 100``).

Two ratios are graded against the plain ``SELECT``: the whole request, as the goal is
written (Django's view, template rendering and all: a cost that does not depend on the
table's size), and the SQL time of the request (executing every statement and fetching
its rows, as the plain ``SELECT`` is timed), the part that a million rows could make slow.
To show that the table's size does not matter, the runs changelist is also timed with the
first 1,000 rows only, before the rest is loaded. Every statement of one request of each
page is captured and ``EXPLAIN ANALYZE``d: the rows it read from ``fencedjobs_jobrun`` are
printed, and a ``COUNT`` over the whole table fails the goal.

Goal: <= 3x the plain SELECT; no full-table ``COUNT(*)`` in the captured queries.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from bench import common

PREFIX = "bench.p5."
JOBS = 50


def load(start: int, end: int) -> None:
    """Runs ``start`` < g <= ``end`` of 50 jobs, one a minute back from now."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO fencedjobs_jobrun (job, scheduled_for, started_at, finished_at, outcome,
                capped, items, batches, fence, owner, missed_slots, watermark_before,
                watermark_after, error)
            SELECT %s || lpad((g %% %s)::text, 2, '0'),
                   t,
                   CASE WHEN g %% 97 = 0 THEN NULL ELSE t + interval '1 second' END,
                   t + interval '3 seconds',
                   CASE WHEN g %% 97 = 0 THEN 'missed'
                        WHEN g %% 23 = 0 THEN 'failed' ELSE 'succeeded' END,
                   false, g %% 1000, 1 + g %% 5, g, 'bench-host:4242', 0, '', '',
                   CASE WHEN g %% 23 = 0 AND g %% 97 <> 0
                        THEN 'Traceback (most recent call last):' || repeat(' frame', 40)
                             || E'\\nRuntimeError: the upstream API answered 503'
                        ELSE '' END
            FROM generate_series(%s, %s) AS g,
                 LATERAL (SELECT date_trunc('minute', now()) - g * interval '1 minute') AS s(t)
            """,
            [PREFIX + "job", JOBS, start + 1, end],
        )


@contextmanager
def db_timer() -> Iterator[list[float]]:
    """Seconds spent executing statements on the default connection and fetching their
    rows (psycopg converts the values when they are fetched): the same work as the plain
    ``SELECT`` and its ``fetchall()``."""
    from django.db import connection
    from django.db.backends.postgresql import base as postgresql

    spent: list[float] = []

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any):
        start = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            spent.append(time.perf_counter() - start)

    def timing(method: Callable[..., Any]) -> Callable[..., Any]:
        def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                spent.append(time.perf_counter() - start)

        return timed

    patched = []
    for cls in (postgresql.Cursor, postgresql.ServerBindingCursor):
        for name in ("fetchone", "fetchmany", "fetchall"):
            if name not in vars(cls):
                setattr(cls, name, timing(getattr(cls, name)))
                patched.append((cls, name))
    try:
        with connection.execute_wrapper(wrapper):
            yield spent
    finally:
        for cls, name in patched:
            delattr(cls, name)


def rows_read(sql: str) -> int:
    """Rows that ``sql`` reads from fencedjobs_jobrun, by ``EXPLAIN ANALYZE``."""
    from django.db import connection

    def walk(node: dict[str, Any]) -> int:
        own = 0
        if node.get("Relation Name") == "fencedjobs_jobrun" or str(
            node.get("Index Name", "")
        ).startswith("fencedjobs_run"):
            own = int(node.get("Actual Rows", 0)) * int(node.get("Actual Loops", 1))
        return own + sum(walk(child) for child in node.get("Plans", []))

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        import json

        plan = json.loads(plan)
    return walk(plan[0]["Plan"])


FULL_COUNT = re.compile(r"COUNT\(", re.IGNORECASE)


def full_table_counts(sqls: list[str]) -> list[str]:
    """Statements that COUNT fencedjobs_jobrun without a LIMIT bounding what they read."""
    return [
        sql
        for sql in sqls
        if "fencedjobs_jobrun" in sql and FULL_COUNT.search(sql) and "LIMIT" not in sql.upper()
    ]


def measure(smoke: bool) -> common.Report:
    from django.contrib.auth.models import Permission, User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.urls import reverse

    from django_fencedjobs import job
    from django_fencedjobs.models import JobLease, JobRun
    from django_fencedjobs.registry import registry

    total = 20_000 if smoke else 1_000_000
    small = 1_000
    repeats = 3 if smoke else 15
    per_sample = 1 if smoke else 3

    common.clear_jobs(PREFIX)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE fencedjobs_jobrun")
    User.objects.filter(username="bench-staff").delete()
    staff = User.objects.create_user("bench-staff", is_staff=True)
    staff.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="fencedjobs", codename__in=["view_jobrun", "view_joblease"]
        )
    )
    client = Client()
    client.force_login(staff)

    runs_url = reverse(f"admin:{JobRun._meta.app_label}_jobrun_changelist")
    jobs_url = reverse(f"admin:{JobLease._meta.app_label}_joblease_changelist")
    plain_sql = {
        runs_url: "SELECT * FROM fencedjobs_jobrun ORDER BY scheduled_for DESC, id DESC LIMIT 100",
        jobs_url: "SELECT * FROM fencedjobs_joblease ORDER BY name LIMIT 100",
    }

    def page(url: str) -> None:
        response = client.get(url)
        if response.status_code != 200:
            raise RuntimeError(f"P5: GET {url} answered {response.status_code}")

    def plain(url: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(plain_sql[url])
            cursor.fetchall()

    def admin_sample(url: str) -> tuple[float, float]:
        with db_timer() as spent:
            elapsed = common.timed(lambda: page(url), per_sample)
        return elapsed, sum(spent) / per_sample

    with registry.isolated():
        for i in range(JOBS):
            job(
                every=timedelta(minutes=JOBS),
                name=f"{PREFIX}job{i:02d}",
                timeout=timedelta(minutes=10),
            )(lambda run: None)
        from django_fencedjobs.loop import tick

        tick()  # the lease rows

        # The same changelist over 1,000 rows: what the page costs whatever the table.
        load(0, small)
        common.vacuum("fencedjobs_jobrun")
        for _ in range(2):
            page(runs_url)
        small_samples = [admin_sample(runs_url)[0] for _ in range(repeats)]

        start = time.monotonic()
        load(small, total)
        common.vacuum("fencedjobs_jobrun")
        load_seconds = time.monotonic() - start

        for url in (runs_url, jobs_url):  # warm
            page(url)
            plain(url)
        samples: dict[tuple[str, str], list[float]] = {}
        for _, url in common.alternate(repeats, [runs_url, jobs_url]):
            for _, variant in common.alternate(1, ["admin", "plain"]):
                if variant == "admin":
                    elapsed, db = admin_sample(url)
                    samples.setdefault((url, "admin"), []).append(elapsed)
                    samples.setdefault((url, "db"), []).append(db)
                else:
                    samples.setdefault((url, "plain"), []).append(
                        common.timed(lambda url=url: plain(url), per_sample * 5)
                    )

        captured: dict[str, list[str]] = {}
        for url in (runs_url, jobs_url):
            with CaptureQueriesContext(connection) as queries:
                page(url)
            captured[url] = [q["sql"] for q in queries.captured_queries]
        reads = {
            url: [rows_read(sql) if "fencedjobs_jobrun" in sql else 0 for sql in sqls]
            for url, sqls in captured.items()
        }
    rows_total = JobRun.objects.count()

    report = common.Report("P5", "admin changelists over 1,000,000 runs")
    report.add(
        f"`fencedjobs_jobrun` holds {rows_total:,} rows of {JOBS} jobs (loaded in "
        f"{load_seconds:.0f} s with `INSERT ... SELECT generate_series`, then `VACUUM ANALYZE`); "
        "a staff user with view permissions, Django's test client; the plain SELECT reads "
        f"the same page through the same connection. {repeats} alternating samples of "
        f"{per_sample} request(s)."
    )
    report.add("")
    rows_out = []
    names = {runs_url: "runs", jobs_url: "jobs"}
    for url in (runs_url, jobs_url):
        admin_ms = common.summarize([s * 1000 for s in samples[(url, "admin")]])
        db_ms = common.summarize([s * 1000 for s in samples[(url, "db")]])
        plain_ms = common.summarize([s * 1000 for s in samples[(url, "plain")]])
        whole = common.summarize(
            [a / p for a, p in zip(samples[(url, "admin")], samples[(url, "plain")], strict=True)]
        )
        dbr = common.summarize(
            [d / p for d, p in zip(samples[(url, "db")], samples[(url, "plain")], strict=True)]
        )
        rows_out.append(
            [
                names[url],
                admin_ms.fmt(".1f"),
                db_ms.fmt(".2f"),
                f"{len(captured[url])}",
                plain_ms.fmt(".2f"),
                f"{dbr.median:.2f}x",
                f"{whole.median:.0f}x",
            ]
        )
        report.figures[f"{names[url]}_db_ratio"] = dbr.median
        report.figures[f"{names[url]}_request_ratio"] = whole.median
        report.goal(
            f"{names[url]} changelist: whole request / plain SELECT",
            "≤ 3x",
            f"{whole.median:.0f}x ({admin_ms.median:.1f} ms against {plain_ms.median:.2f} ms)",
            whole.median <= 3,
        )
        report.goal(
            f"{names[url]} changelist: its SQL time / plain SELECT",
            "≤ 3x",
            f"{dbr.median:.2f}x ({db_ms.median:.2f} ms in {len(captured[url])} statements)",
            dbr.median <= 3,
        )
    for line in common.table(
        [
            "changelist",
            "request ms",
            "its SQL ms",
            "statements",
            "plain SELECT ms",
            "SQL / plain",
            "request / plain",
        ],
        rows_out,
    ):
        report.add(line)
    small_ms = common.summarize([s * 1000 for s in small_samples])
    big_ms = common.summarize([s * 1000 for s in samples[(runs_url, "admin")]])
    report.add("")
    report.add(
        f"The runs changelist over {small:,} rows: {small_ms.fmt('.1f')} ms; over "
        f"{rows_total:,}: {big_ms.median:.1f} ms ({big_ms.median / small_ms.median:.2f}x)."
    )
    report.add("")
    counts = []
    for url in (runs_url, jobs_url):
        report.add(
            f"Statements of one {names[url]} changelist request, and the rows each read "
            "from `fencedjobs_jobrun` (EXPLAIN ANALYZE):"
        )
        report.add("")
        for sql, read in zip(captured[url], reads[url], strict=True):
            report.add(f"- {read:,} rows: `{_shorten(sql)}`")
        report.add("")
        counts += full_table_counts(captured[url])
    report.goal(
        "full-table COUNT(*) of the runs in the captured statements",
        "none",
        str(len(counts)) if counts else "none",
        not counts,
    )
    most = max(max(r) for r in reads.values())
    report.goal("most rows any one statement read", "(printed)", f"{most:,}", None)
    return report


def _shorten(sql: str, limit: int = 160) -> str:
    sql = " ".join(sql.split())
    return sql if len(sql) <= limit else sql[: limit - 1] + "…"


if __name__ == "__main__":
    raise SystemExit(common.main(measure))
