"""Where the benchmarks' figures are written, and in what form: the one owner of the format
of ``docs/benchmarks.md`` and ``docs/benchmarks-history.md``.

A run of ``bench/run.py`` (or of one module alone) writes one dated section, the whole
record of that run (machine, command, every figure with its spread), at the top of the
history, newest first. The page of current figures is then rewritten from the history:
for each benchmark, the goals of the newest section that ran it, with that section's
date and command. Only the part between :data:`BEGIN` and :data:`END` is written; the
text around it is the page's own, edited by hand. Nothing on that page is measured
twice: every figure on it is read back from the history.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.common import Report

REPO = Path(__file__).resolve().parent.parent
SUMMARY = REPO / "docs" / "benchmarks.md"
HISTORY = REPO / "docs" / "benchmarks-history.md"

BEGIN = "<!-- current figures: written by bench/run.py from the history; edit around them -->"
END = "<!-- end of the current figures -->"
SMOKE = " (smoke sizes: not a measurement)"
GOALS_HEADER = "| goal | target | measured | |"

HISTORY_PREAMBLE = """# Benchmarks: history

Every run of `make bench` (bench/run.py), newest first: one dated section per run, as
the run wrote it, with the machine, the command and every figure with its spread. The
[current figures](benchmarks.md) are the newest of each benchmark here. A run starts a
throwaway PostgreSQL with its durable defaults (fsync and synchronous commit on). Every
comparison is measured side by side in one run: the variants alternate (A B, B A, ...)
and each figure is the median over the repeats, with the spread (min to max) and the
number of repeats in parentheses. The ceiling, where a run has one, is what the same
PostgreSQL does at all for one client committing single-row updates
(`pgbench -b simple-update`), so every rate can be read as a fraction of it.

Figures from a busy machine are noisy; the load average is printed with each section.
The sections up to 2026-12-02 19:43 were written when this file ran oldest first: where
one says "above" of another run, that run is now below it.
"""

SUMMARY_TEMPLATE = f"""# Benchmarks

{BEGIN}
{END}
"""


# -- writing a run ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GoalRow:
    label: str
    target: str
    measured: str
    verdict: str  # met, **MISSED**, or — (a figure with no goal)


def verdict(met: bool | None) -> str:
    return {True: "met", False: "**MISSED**", None: "—"}[met]


def report_markdown(report: Report) -> str:
    """One benchmark's part of a section (a ``common.Report``): its heading, its lines,
    its goals."""
    out = [f"### {report.key}: {report.title}", "", *report.lines]
    if report.goals:
        out += ["", GOALS_HEADER, "| --- | --- | --- | --- |"]
        out += [
            f"| {g.label} | {g.target} | {g.measured} | {verdict(g.met)} |" for g in report.goals
        ]
    out += ["", f"_{report.seconds:.0f} s_", ""]
    return "\n".join(out)


def section(
    reports: Sequence[Report],
    *,
    started: datetime,
    seconds: float,
    smoke: bool,
    machine: dict[str, str],
    command: str,
    notes: Sequence[str] = (),
) -> str:
    """The dated section of one run: what it ran on, the goals of all its reports, then
    each report; ``notes`` (lines) go between the goals and the reports."""
    lines = [
        f"## {started:%Y-%m-%d %H:%M} UTC" + (SMOKE if smoke else ""),
        "",
        f"- command: `{command}`",
        f"- machine: {machine['cores']} cores ({machine['cpu']}), {machine['os']}, "
        f"load average at the end {machine['load']}",
        f"- PostgreSQL {machine['postgresql']}",
        f"- Python {machine['python']}, Django {machine['django']}, psycopg {machine['psycopg']}",
        f"- wall time: {seconds / 60:.1f} min",
        "",
    ]
    goals = [(r.key, g) for r in reports for g in r.goals if g.met is not None]
    if goals:
        lines += ["| # | goal | target | measured | |", "| --- | --- | --- | --- | --- |"]
        lines += [
            f"| {k} | {g.label} | {g.target} | {g.measured} | {verdict(g.met)} |" for k, g in goals
        ]
        lines.append("")
    lines += list(notes)
    for report in reports:
        lines.append(report_markdown(report))
    return "\n".join(lines)


def add_to_history(path: Path, text: str) -> None:
    """Put a run's section at the top of the history (below its preamble)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    existing = path.read_text() if path.exists() else HISTORY_PREAMBLE
    first = re.search(r"^## ", existing, flags=re.MULTILINE)
    head, rest = (existing[: first.start()], existing[first.start() :]) if first else (existing, "")
    parts = [head.rstrip("\n") + "\n", text.strip("\n") + "\n"]
    if rest:
        parts.append(rest.rstrip("\n") + "\n")
    path.write_text("\n".join(parts))


def write_summary(path: Path, history: Path) -> None:
    """Rewrite the current figures on ``path`` from ``history``; the page's other text
    stays as it is. A page without the two markers is refused, not overwritten."""
    page = path.read_text() if path.exists() else SUMMARY_TEMPLATE
    if page.count(BEGIN) != 1 or page.count(END) != 1 or page.index(BEGIN) > page.index(END):
        raise SystemExit(f"bench: {path} must hold the lines {BEGIN!r} and {END!r}, once each")
    link = Path(os.path.relpath(history, path.parent)).as_posix()
    block = current_figures(parse_history(history.read_text()), link=link)
    before, _, after = page.partition(BEGIN)
    _, _, after = after.partition(END)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{before}{BEGIN}\n\n{block}\n{END}{after}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that say where a run is written (``bench/run.py`` and every module)."""
    parser.add_argument(
        "--output",
        metavar="PATH",
        help=f"add the dated section at the top of this history "
        f"(default {HISTORY.relative_to(REPO)}; none with --smoke)",
    )
    parser.add_argument(
        "--summary",
        metavar="PATH",
        help=f"then rewrite the current figures of this page from that history "
        f"(default {SUMMARY.relative_to(REPO)} when the history is the default one)",
    )


def destinations(args: argparse.Namespace) -> tuple[Path | None, Path | None]:
    """The history to add the run's section to, and the page of current figures to rewrite
    from it; None: not written. Smoke runs write nothing unless told where."""
    history = Path(args.output) if args.output else None if args.smoke else HISTORY
    if history is None:
        return None, None
    if args.summary:
        return history, Path(args.summary)
    return history, SUMMARY if history.resolve() == HISTORY else None


def publish(text: str, *, history: Path, summary: Path | None) -> None:
    add_to_history(history, text)
    print(f"added the section to {history}")
    if summary is not None:
        write_summary(summary, history)
        print(f"rewrote the current figures in {summary}")


# -- reading the history back -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Measured:
    """One benchmark in one run: its title and its goals (or, for a benchmark without
    goals, the figures of its first table)."""

    key: str
    title: str
    goals: tuple[GoalRow, ...]


@dataclasses.dataclass(frozen=True)
class Run:
    heading: str
    command: str
    machine: str
    benchmarks: tuple[Measured, ...]

    @property
    def anchor(self) -> str:
        """The heading's anchor as GitHub and most Markdown renderers make it."""
        slug = re.sub(r"[^\w\- ]", "", self.heading.lower())
        return slug.replace(" ", "-")

    @property
    def when(self) -> str:
        return self.heading.removesuffix(" UTC")


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split(" | ")]


def _tables(lines: Sequence[str]) -> Iterable[tuple[list[str], list[list[str]]]]:
    """Each Markdown table in ``lines``: its header cells and its rows' cells."""
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("| ---"):
            header, rows = _cells(lines[i]), []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            yield header, rows
        else:
            i += 1


def _measured(key: str, title: str, lines: Sequence[str]) -> Measured:
    tables = list(_tables(lines))
    for header, rows in tables:
        if _cells(GOALS_HEADER) == header:
            goals = tuple(GoalRow(*row) for row in rows if len(row) == 4)
            return Measured(key, title, goals)
    if tables:  # no goals (the ceiling): the figures of its first table
        header, rows = tables[0]
        unit = header[1] if len(header) > 1 else ""
        goals = tuple(GoalRow(row[0], "(no goal)", f"{row[1]} {unit}", "—") for row in rows)
        return Measured(key, title, goals)
    return Measured(key, title, ())


def parse_history(text: str) -> list[Run]:
    """The measured runs of a history, in its order (newest first); smoke runs are left
    out."""
    runs = []
    for chunk in re.split(r"^(?=## )", text, flags=re.MULTILINE)[1:]:
        lines = chunk.splitlines()
        heading = lines[0][3:].strip()
        if heading.endswith(SMOKE):
            continue
        facts: dict[str, str] = {}
        for line in lines:
            fact = re.match(r"- (command|machine): (.*)", line)
            if fact:
                facts.setdefault(fact.group(1), fact.group(2))
        starts = [i for i, line in enumerate(lines) if re.match(r"### \S+: ", line)]
        benchmarks = []
        for n, start in enumerate(starts):
            end = starts[n + 1] if n + 1 < len(starts) else len(lines)
            key, title = lines[start][4:].split(": ", 1)
            benchmarks.append(_measured(key, title, lines[start + 1 : end]))
        runs.append(
            Run(
                heading=heading,
                command=facts.get("command", "").strip("`"),
                machine=facts.get("machine", ""),
                benchmarks=tuple(benchmarks),
            )
        )
    return runs


def latest(runs: Sequence[Run]) -> list[tuple[Run, Measured]]:
    """Each benchmark's newest figures, with the run that measured them: the ceiling first,
    then P1, P2, ... in their numbers' order."""
    found: dict[str, tuple[Run, Measured]] = {}
    for run in runs:
        for measured in run.benchmarks:
            found.setdefault(measured.key, (run, measured))

    def order(key: str) -> tuple[int, int, str]:
        match = re.fullmatch(r"P(\d+)(.*)", key)
        return (1, int(match.group(1)), match.group(2)) if match else (0, 0, key)

    return [found[key] for key in sorted(found, key=order)]


def _short_machine(machine: str) -> str:
    match = re.fullmatch(r"(.*), \S+ \S+, load average at the end (.*)", machine)
    return f"{match.group(1)}, load {match.group(2)}" if match else machine


def current_figures(runs: Sequence[Run], *, link: str) -> str:
    """The block of the page of current figures: one row per goal of each benchmark's
    newest run, then the runs those figures come from, with their commands."""
    newest = latest(runs)
    if not newest:
        return "No measured run in the history yet.\n"
    lines = [
        "| benchmark | goal | target | current | | measured |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for run, measured in newest:
        goals = measured.goals or (GoalRow("(no figures)", "", "", ""),)
        for n, goal in enumerate(goals):
            what = f"**{measured.key}** {measured.title}" if n == 0 else ""
            when = f"[{run.when}]({link}#{run.anchor})" if n == 0 else ""
            lines.append(
                f"| {what} | {goal.label} | {goal.target} | {goal.measured} | {goal.verdict} "
                f"| {when} |"
            )
    used = [run for run in runs if any(r is run for r, _ in newest)]
    lines += [
        "",
        "The runs these figures come from, and the commands that produced them (times UTC):",
        "",
        "| run | command | benchmarks | machine |",
        "| --- | --- | --- | --- |",
    ]
    for run in used:
        keys = ", ".join(m.key for r, m in newest if r is run)
        lines.append(
            f"| [{run.when}]({link}#{run.anchor}) | `{run.command}` | {keys} "
            f"| {_short_machine(run.machine)} |"
        )
    return "\n".join(lines) + "\n"
