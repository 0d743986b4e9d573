"""P5: the admin's pages cost what a user feels, whatever the number of runs.

The runs page and the jobs page are read through Django's test client by a staff user
(not a superuser: view permissions on runs and jobs), first with 1,000 runs in
``fencedjobs_jobrun``, then with 1,000,000: the same pages must cost about the same
(within 1.2x), because nothing on them grows with the table: no full ``COUNT(*)`` (the
runs list pages by the ``(-scheduled_for, -id)`` index and its total is bounded or the
planner's estimate), and no query per row (each row's health is decided once per request;
the jobs list's slot timelines are read in one query, one index range scan per job).

Side by side, alternating, the same 1,000,000-row table is listed by a stock
``ModelAdmin`` (``AdminSite.register(JobRun)`` and nothing else), on a second admin site:
it counts every row on every page (the paginator's count, and the unfiltered total).

The runs are those of 40 jobs declared ``every=timedelta(minutes=40)``, one run per job
per slot going back from the latest slot (``INSERT ... SELECT`` over ``generate_series``;
``VACUUM ANALYZE`` after each load, as autovacuum would do): 1,000 runs are 25 slots of
each job, enough to fill the jobs list's timelines (24 slots), so both sizes draw the
same marks. Every statement of one request of each page, at each size, is captured and
``EXPLAIN ANALYZE``d: the rows each read from ``fencedjobs_jobrun`` are printed (index
entries and table rows both count, so a row found through an index counts twice or more).

Goals: each page at 1,000,000 runs ≤ 1.2x the same page at 1,000; no more statements at
1,000,000 runs than at 1,000 (none per row, none that grows); no full-table ``COUNT`` of
the runs in this app's pages' statements.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta
from types import ModuleType
from typing import Any

from bench import common

PREFIX = "bench.p5."
JOBS = 40
EVERY_MINUTES = 40
SMALL = 1_000


def latest_slot() -> int:
    """The latest slot now, in seconds since the epoch (slots are whole multiples of the
    interval since the epoch, as for ``every=``): read once, so that loads made on either
    side of a slot boundary still give each run its own slot."""
    every = EVERY_MINUTES * 60
    return int(time.time() // every * every)


def load(start: int, end: int, latest: int) -> None:
    """Runs ``start`` < g <= ``end``: job ``g % JOBS``, at its slot ``(g - 1) // JOBS`` slots
    back from the slot ``latest`` (:func:`latest_slot`)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO fencedjobs_jobrun (job, scheduled_for, started_at, finished_at, outcome,
                capped, items, batches, fence, owner, missed_slots, watermark_before,
                watermark_after, error)
            SELECT %(prefix)s || lpad((g %% %(jobs)s)::text, 2, '0'),
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
            FROM generate_series(%(start)s, %(end)s) AS g,
                 LATERAL (
                     SELECT to_timestamp(%(latest)s - ((g - 1) / %(jobs)s) * %(every)s)
                 ) AS s(t)
            """,
            {
                "prefix": PREFIX + "job",
                "jobs": JOBS,
                "every": EVERY_MINUTES * 60,
                "start": start + 1,
                "end": end,
                "latest": latest,
            },
        )


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
    from django.contrib import admin
    from django.contrib.auth.models import Permission, User
    from django.db import connection
    from django.test import Client, override_settings
    from django.test.utils import CaptureQueriesContext
    from django.urls import path, reverse

    from django_fencedjobs import job
    from django_fencedjobs.loop import tick
    from django_fencedjobs.models import JobLease, JobRun
    from django_fencedjobs.registry import registry

    total = 20_000 if smoke else 1_000_000
    repeats = 3 if smoke else 15
    per_sample = 1 if smoke else 3

    # A second admin site with a stock ModelAdmin over the same table.
    stock_site = admin.AdminSite(name="stock")
    stock_site.register(JobRun)
    urlconf = ModuleType("bench_p5_urls")
    urlconf.urlpatterns = [path("admin/", admin.site.urls), path("stock/", stock_site.urls)]  # type: ignore[attr-defined]

    common.clear_jobs(PREFIX)
    with connection.cursor() as cursor:
        # A run's tasks point at it: both tables go together.
        cursor.execute("TRUNCATE fencedjobs_runtask, fencedjobs_jobrun")
    User.objects.filter(username="bench-staff").delete()
    staff = User.objects.create_user("bench-staff", is_staff=True)
    staff.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="fencedjobs", codename__in=["view_jobrun", "view_joblease"]
        )
    )
    client = Client()
    client.force_login(staff)

    pages: dict[str, str] = {}

    def page(url: str) -> None:
        response = client.get(url)
        if response.status_code != 200:
            raise RuntimeError(f"P5: GET {url} answered {response.status_code}")

    def sample(url: str) -> float:
        return common.timed(lambda: page(url), per_sample)

    def statements(url: str) -> list[str]:
        with CaptureQueriesContext(connection) as queries:
            page(url)
        return [q["sql"] for q in queries.captured_queries]

    samples: dict[tuple[str, str], list[float]] = {}
    captured: dict[tuple[str, str], list[str]] = {}
    reads: dict[tuple[str, str], list[int]] = {}

    def measure_size(size: str) -> None:
        for url in pages.values():  # warm
            page(url)
        for _, url in common.alternate(repeats, list(pages.values())):
            samples.setdefault((size, url), []).append(sample(url))
        for url in pages.values():
            sqls = statements(url)
            captured[size, url] = sqls
            reads[size, url] = [rows_read(sql) if "fencedjobs_jobrun" in sql else 0 for sql in sqls]

    with registry.isolated(), override_settings(ROOT_URLCONF=urlconf):
        pages = {
            "runs": reverse("admin:fencedjobs_jobrun_changelist"),
            "jobs": reverse("admin:fencedjobs_joblease_changelist"),
            "stock runs": reverse("stock:fencedjobs_jobrun_changelist"),
        }
        for i in range(JOBS):
            job(
                every=timedelta(minutes=EVERY_MINUTES),
                name=f"{PREFIX}job{i:02d}",
                timeout=timedelta(minutes=10),
            )(lambda run: None)
        tick()  # the lease rows

        latest = latest_slot()
        load(0, SMALL, latest)
        common.vacuum("fencedjobs_jobrun")
        measure_size("small")

        start = time.monotonic()
        load(SMALL, total, latest)
        common.vacuum("fencedjobs_jobrun")
        load_seconds = time.monotonic() - start
        measure_size("big")
        rows_total = JobRun.objects.count()
        lease_rows = JobLease.objects.filter(name__startswith=PREFIX).count()

    report = common.Report("P5", "admin pages at 1,000 and at 1,000,000 runs")
    report.add(
        f"`fencedjobs_jobrun` holds {SMALL:,}, then {rows_total:,} runs of {lease_rows} jobs "
        f"(every {EVERY_MINUTES} minutes, one run per slot; the rest loaded in "
        f"{load_seconds:.0f} s with `INSERT ... SELECT generate_series`, then "
        "`VACUUM ANALYZE`). A staff user with view permissions, Django's test client, whole "
        "requests (view, queries, template). The stock page is `AdminSite.register(JobRun)` "
        f"over the same table. {repeats} alternating samples of {per_sample} request(s)."
    )
    report.add("")
    rows_out = []
    ms = {key: common.summarize([s * 1000 for s in values]) for key, values in samples.items()}
    for name, url in pages.items():
        small, big = ms["small", url], ms["big", url]
        ratio = big.median / small.median
        rows_out.append(
            [
                name,
                small.fmt(".1f"),
                big.fmt(".1f"),
                f"{ratio:.2f}x",
                f"{len(captured['small', url])} / {len(captured['big', url])}",
                f"{max(reads['big', url], default=0):,}",
            ]
        )
        report.figures[f"{name.replace(' ', '_')}_ratio"] = ratio
        report.figures[f"{name.replace(' ', '_')}_big_ms"] = big.median
        if name != "stock runs":
            report.goal(
                f"{name} page at {rows_total:,} runs / at {SMALL:,}",
                "≤ 1.2x",
                f"{ratio:.2f}x ({big.median:.1f} ms against {small.median:.1f} ms)",
                ratio <= 1.2,
            )
            # At 1,000 runs the runs page counts them (a bounded COUNT); past 10,000 it
            # takes the planner's estimate instead: one statement fewer, never more.
            small_n, big_n = len(captured["small", url]), len(captured["big", url])
            report.goal(
                f"{name} page: statements at {rows_total:,} runs (at {SMALL:,})",
                f"no more than at {SMALL:,}",
                f"{big_n} ({small_n})",
                big_n <= small_n,
            )
    for line in common.table(
        [
            "page",
            f"ms at {SMALL:,} runs",
            f"ms at {rows_total:,}",
            "ratio",
            "statements",
            "most rows a statement read",
        ],
        rows_out,
    ):
        report.add(line)
    runs_big, stock_big = ms["big", pages["runs"]].median, ms["big", pages["stock runs"]].median
    report.add("")
    report.add(
        f"At {rows_total:,} runs the stock `ModelAdmin` takes {stock_big:.1f} ms a page, "
        f"{stock_big / runs_big:.1f}x this app's runs page ({runs_big:.1f} ms): it counts "
        "every row, twice."
    )
    report.goal(
        f"stock ModelAdmin / this app's runs page, at {rows_total:,} runs",
        "(printed)",
        f"{stock_big / runs_big:.1f}x ({stock_big:.1f} ms against {runs_big:.1f} ms)",
        None,
    )
    report.add("")
    counts = []
    for name, url in pages.items():
        report.add(
            f"Statements of one {name} page request at {rows_total:,} runs, and the rows each "
            "read from `fencedjobs_jobrun` (EXPLAIN ANALYZE):"
        )
        report.add("")
        for sql, read in zip(captured["big", url], reads["big", url], strict=True):
            report.add(f"- {read:,} rows: `{_shorten(sql)}`")
        report.add("")
        if name != "stock runs":
            counts += full_table_counts(captured["big", url])
    report.goal(
        "full-table COUNT of the runs in this app's pages' statements",
        "none",
        str(len(counts)) if counts else "none",
        not counts,
    )
    return report


def _shorten(sql: str, limit: int = 160) -> str:
    sql = " ".join(sql.split())
    return sql if len(sql) <= limit else sql[: limit - 1] + "…"


if __name__ == "__main__":
    raise SystemExit(common.main(measure))
