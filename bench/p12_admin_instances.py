"""P12: the admin's instances pages cost the same with 100,000 instances as with 100.

The instances list and one instance's change page (with its preview of the next fire
times and its recent runs) are read through Django's test client by a staff user (not a
superuser: view and change permissions on instances, view on jobs and runs), first with
100 instances of the bench app's job declared with ``instances=True``
(bench/benchapp/jobs.py), then with 100,000. Beside them, as figures without a goal: the
list filtered by job (every instance is of that one job) and by state ("enabled"), and a
search by key; a filtered list counts its rows up to a bound, not the whole table.

The instances and their lease rows are made as P10 makes them (``common.make_instances``:
``bulk_create`` in batches, each lease row as ``JobInstance.save()`` writes it), then
``VACUUM ANALYZE``. The two sizes are measured one after the other, each as alternating
samples of the pages. Every statement of one request of each page at 100,000 is captured
and ``EXPLAIN ANALYZE``d: the rows each read from the instances and lease tables are
printed (index entries and table rows both count, and rows a scan's filter removed).

Goals: the list and the change page at 100,000 <= 1.2x the same page at 100; no full
``COUNT`` of the instances in their statements.
"""

from __future__ import annotations

import functools
import re

from bench import common
from bench.p10_idle_instances import SMALL, SPREAD, YEARLY

KEY = "i000050"
TABLES = ("fencedjobs_jobinstance", "fencedjobs_joblease")
#: The pages with a goal; the others are printed.
GOALS = ("list", "change page")


def sizes(smoke: bool) -> tuple[int, int, int]:
    """(instances, samples per size, requests per sample)."""
    return (2_000, 3, 1) if smoke else (100_000, 15, 3)


def rows_read(sql: str) -> int:
    """Rows that ``sql`` reads from the instances and lease tables, by ``EXPLAIN
    ANALYZE``: those each scan returned and those its filter removed."""
    from bench.p10_idle_instances import nodes, plan

    total = 0
    for _, node in nodes(plan(sql)):
        if node.get("Relation Name") in TABLES or str(node.get("Index Name", "")).startswith(
            ("fencedjobs_instance", "fencedjobs_jobinstance", "fencedjobs_joblease")
        ):
            kept = int(node.get("Actual Rows", 0)) + int(node.get("Rows Removed by Filter", 0))
            total += kept * int(node.get("Actual Loops", 1))
    return total


FULL_COUNT = re.compile(r"COUNT\(", re.IGNORECASE)


def full_counts(sqls: list[str]) -> list[str]:
    """Statements that COUNT the instances without a LIMIT bounding what they read."""
    return [
        sql
        for sql in sqls
        if "fencedjobs_jobinstance" in sql and FULL_COUNT.search(sql) and "LIMIT" not in sql.upper()
    ]


def measure(smoke: bool) -> common.Report:
    from django.contrib.auth.models import Permission, User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.urls import reverse

    from bench.benchapp.jobs import DIGEST
    from django_fencedjobs.models import JobInstance

    big, repeats, per_sample = sizes(smoke)
    User.objects.filter(username="bench-p12").delete()
    staff = User.objects.create_user("bench-p12", is_staff=True)
    staff.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="fencedjobs",
            codename__in=[
                "view_jobinstance",
                "change_jobinstance",
                "view_joblease",
                "view_jobrun",
            ],
        )
    )
    client = Client()
    client.force_login(staff)

    common.drop_instances(DIGEST)
    made = common.make_instances(DIGEST, SMALL, cron=YEARLY, jitter=SPREAD)
    listing = reverse("admin:fencedjobs_jobinstance_changelist")
    pk = JobInstance.objects.get(job=DIGEST, key=KEY).pk
    pages = {
        "list": listing,
        "change page": reverse("admin:fencedjobs_jobinstance_change", args=[pk]),
        "list by job": f"{listing}?job={DIGEST}",
        "list by state": f"{listing}?state=enabled",
        "search by key": f"{listing}?q={KEY}",
    }

    def page(url: str) -> None:
        response = client.get(url)
        if response.status_code != 200:
            raise RuntimeError(f"P12: GET {url} answered {response.status_code}")

    samples: dict[tuple[int, str], list[float]] = {}
    captured: dict[tuple[int, str], list[str]] = {}

    def measure_size(n: int) -> None:
        common.vacuum(*TABLES)
        for url in pages.values():  # warm
            page(url)
        for _, name in common.alternate(repeats, list(pages)):
            url = pages[name]
            samples.setdefault((n, name), []).append(
                common.timed(functools.partial(page, url), per_sample)
            )
        for name, url in pages.items():
            with CaptureQueriesContext(connection) as queries:
                page(url)
            captured[n, name] = [q["sql"] for q in queries.captured_queries]

    measure_size(SMALL)
    made += common.make_instances(DIGEST, big - SMALL, cron=YEARLY, jitter=SPREAD, start=SMALL)
    measure_size(big)
    reads = {
        name: [
            rows_read(sql) if sql.lstrip().upper().startswith("SELECT") else 0
            for sql in captured[big, name]
        ]
        for name in pages
    }
    common.drop_instances(DIGEST)

    report = common.Report("P12", "the admin's instances pages: 100 against 100,000 instances")
    report.add(
        f"{SMALL:,} then {big:,} instances of one job (made by `bulk_create` in {made:.0f} s, "
        "then `VACUUM ANALYZE`). A staff user with view and change permissions on instances, "
        "Django's test client, whole requests (view, queries, template). "
        f"{repeats} alternating samples of {per_sample} request(s) per page and size."
    )
    report.add("")
    ms = {key: common.summarize([s * 1000 for s in values]) for key, values in samples.items()}
    rows_out = []
    for name in pages:
        small, large = ms[SMALL, name], ms[big, name]
        ratio = large.median / small.median
        rows_out.append(
            [
                name,
                small.fmt(".1f"),
                large.fmt(".1f"),
                f"{ratio:.2f}x",
                f"{len(captured[SMALL, name])} / {len(captured[big, name])}",
                f"{max(reads[name], default=0):,}",
            ]
        )
        report.figures[f"{name.replace(' ', '_')}_ratio"] = ratio
        if name in GOALS:
            report.goal(
                f"{name} at {big:,} instances / at {SMALL:,}",
                "≤ 1.2x",
                f"{ratio:.2f}x ({large.median:.1f} ms against {small.median:.1f} ms)",
                ratio <= 1.2,
            )
    for line in common.table(
        [
            "page",
            f"ms at {SMALL:,}",
            f"ms at {big:,}",
            "ratio",
            "statements",
            f"most rows a statement read at {big:,}",
        ],
        rows_out,
    ):
        report.add(line)
    report.add("")
    counts = []
    for name in pages:
        report.add(
            f"Statements of one {name} request at {big:,} instances, and the rows each read "
            "from the instances and lease tables (EXPLAIN ANALYZE):"
        )
        report.add("")
        for sql, read in zip(captured[big, name], reads[name], strict=True):
            report.add(f"- {read:,} rows: `{_shorten(sql)}`")
        report.add("")
        counts += full_counts(captured[big, name])
    report.goal(
        "full COUNT of the instances in these pages' statements",
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
