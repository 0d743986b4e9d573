"""Where the benchmarks write: a run's dated section goes on top of the history, and the
page of current figures is that history read back, each benchmark from its newest run.
No database: the sections are made from reports as the benchmarks make them."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bench import common, results

MACHINE = {
    "cores": "2",
    "cpu": "Test CPU",
    "os": "Linux 6.1",
    "load": "0.10 0.20 0.30",
    "postgresql": "15.18 (fsync=on)",
    "python": "3.11.7",
    "django": "5.2",
    "psycopg": "3.3",
}

PAGE = """# Benchmarks

Written by hand, above.

{begin}
{end}

## Notes

Written by hand, below.
"""


def report(key: str, title: str, *goals: tuple[str, str, str, bool | None]) -> common.Report:
    made = common.Report(key, title)
    made.add("What was measured.")
    for goal in goals:
        made.goal(*goal)
    return made


def ceiling(tps: str) -> common.Report:
    made = common.Report("Ceiling", "what this PostgreSQL does at all, one client")
    made.lines += ["", "| what | transactions/s | ms |", "| --- | --- | --- |"]
    made.lines += [f"| `pgbench` | {tps} | 0.5 |"]
    return made


def section(
    at: str, *reports: common.Report, smoke: bool = False, command: str = "make bench"
) -> str:
    return results.section(
        reports,
        started=datetime.fromisoformat(at).replace(tzinfo=UTC),
        seconds=60,
        smoke=smoke,
        machine=MACHINE,
        command=command,
    )


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    history, page = tmp_path / "history.md", tmp_path / "page.md"
    page.write_text(PAGE.format(begin=results.BEGIN, end=results.END))
    return history, page


def rows(page: Path) -> list[list[str]]:
    block = page.read_text().partition(results.BEGIN)[2].partition(results.END)[0]
    table = block.strip("\n").split("\n\n")[0].splitlines()[2:]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in table]


def test_a_run_goes_on_top_of_the_history_and_its_figures_onto_the_page(files):
    history, page = files
    first = section(
        "2026-12-01 07:51",
        ceiling("1,780"),
        report("P1", "the fence", ("1 row: fenced / plain", "≥ 0.9", "0.93", True)),
        report("P7", "a fleet", ("p99 lateness", "≤ 2 s", "6.41 s", False)),
    )
    results.publish(first, history=history, summary=page)
    second = section(
        "2026-12-02 19:43",
        report("P1", "the fence", ("1 row: fenced / plain", "≥ 0.9", "0.78", False)),
        command="make bench BENCH_ARGS=--only P1",
    )
    results.publish(second, history=history, summary=page)

    text = history.read_text()
    assert text.startswith(results.HISTORY_PREAMBLE)
    assert text.index("## 2026-12-02 19:43 UTC") < text.index("## 2026-12-01 07:51 UTC")
    assert first.strip() in text and second.strip() in text, "each section whole"

    assert rows(page) == [
        [
            "**Ceiling** what this PostgreSQL does at all, one client",
            "`pgbench`",
            "(no goal)",
            "1,780 transactions/s",
            "—",
            "[2026-12-01 07:51](history.md#2026-12-01-0751-utc)",
        ],
        [
            "**P1** the fence",
            "1 row: fenced / plain",
            "≥ 0.9",
            "0.78",
            "**MISSED**",
            "[2026-12-02 19:43](history.md#2026-12-02-1943-utc)",
        ],
        [
            "**P7** a fleet",
            "p99 lateness",
            "≤ 2 s",
            "6.41 s",
            "**MISSED**",
            "[2026-12-01 07:51](history.md#2026-12-01-0751-utc)",
        ],
    ]
    shown = page.read_text()
    assert "| `make bench BENCH_ARGS=--only P1` | P1 |" in shown
    assert "| `make bench` | Ceiling, P7 |" in shown
    assert "Written by hand, above." in shown and "Written by hand, below." in shown


def test_a_smoke_run_never_becomes_a_current_figure(files):
    history, page = files
    measured = report("P3", "one pass", ("time 200 jobs / 5 jobs", "≤ 1.5", "1.24", True))
    results.publish(section("2026-12-01 08:45", measured), history=history, summary=page)
    smoke = report("P3", "one pass", ("time 200 jobs / 5 jobs", "≤ 1.5", "9.99", False))
    results.publish(section("2026-12-02 09:00", smoke, smoke=True), history=history, summary=page)
    assert "9.99" in history.read_text()
    assert [row[3] for row in rows(page)] == ["1.24"]


def test_a_page_without_its_markers_is_refused_not_overwritten(files):
    history, page = files
    page.write_text("# Benchmarks\n\nA page someone wrote.\n")
    with pytest.raises(SystemExit, match="must hold the lines"):
        results.publish(
            section("2026-12-01 08:45", ceiling("1,629")), history=history, summary=page
        )
    assert page.read_text() == "# Benchmarks\n\nA page someone wrote.\n"


@pytest.mark.parametrize(
    ("argv", "history", "summary"),
    [
        ([], results.HISTORY, results.SUMMARY),
        (["--smoke"], None, None),
        (["--smoke", "--output", "/tmp/h.md"], Path("/tmp/h.md"), None),
        (["--output", "/tmp/h.md", "--summary", "/tmp/s.md"], Path("/tmp/h.md"), Path("/tmp/s.md")),
    ],
)
def test_a_run_writes_the_docs_unless_it_is_told_otherwise(argv, history, summary):
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true")
    results.add_arguments(parser)
    assert results.destinations(parser.parse_args(argv)) == (history, summary)


def test_the_page_of_current_figures_is_its_history_read_back():
    """docs/benchmarks.md holds no figure of its own: rewriting it from
    docs/benchmarks-history.md changes nothing."""
    page = results.SUMMARY.read_text()
    shown = page.partition(results.BEGIN)[2].partition(results.END)[0]
    runs = results.parse_history(results.HISTORY.read_text())
    assert shown == "\n\n" + results.current_figures(runs, link="benchmarks-history.md") + "\n"
