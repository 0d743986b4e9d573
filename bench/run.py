"""``make bench``: every benchmark, each in a process of its own, and one dated section for
all of them.

    python3 scripts/throwaway_postgres.py --durable -- .venv/bin/python bench/run.py
        [--smoke] [--only P1,P3] [--output HISTORY] [--summary PAGE]

Creates a database of its own on the ``DATABASE_URL`` server (dropped at the end), runs
the ceiling, P1 ... P15 (see each module's docstring; P11, about 20 minutes, only when
``--only`` names it), prints every figure as it comes, then adds the run's section
(machine, versions, the command, a table of the goals, each benchmark's figures) at the top
of ``docs/benchmarks-history.md`` and rewrites the current figures of
``docs/benchmarks.md`` from that history (``bench/results.py``). ``--smoke`` runs every
benchmark at tiny sizes to show that it works (the test suite does that); its
figures mean nothing, and it writes nothing unless ``--output`` is given. Exits non-zero
if a benchmark failed to run (a missed goal is reported, not an error).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common, results

#: Run order (P5's million rows last); the section lists them in this order too.
MODULES = [
    ("Ceiling", "bench.ceiling"),
    ("P1", "bench.p1_fenced_atomic"),
    ("P2", "bench.p2_batches"),
    ("P3", "bench.p3_once"),
    ("P4", "bench.p4_lateness"),
    ("P4L", "bench.p4_under_load"),
    ("P15", "bench.p15_buffer_one"),
    ("P6", "bench.p6_memory"),
    ("P7", "bench.p7_fleet"),
    ("P8", "bench.p8_tasks"),
    ("P9", "bench.p9_run_cost"),
    ("P10", "bench.p10_idle_instances"),
    ("P13", "bench.p13_edit"),
    ("P11", "bench.p11_population"),
    ("P12", "bench.p12_admin_instances"),
    ("P5", "bench.p5_admin"),
    ("P14", "bench.p14_history"),
]

#: Run only when named by ``--only`` (or at smoke sizes): P11's two populations take about
#: 20 minutes, P14's 20 million runs about as long.
NAMED_ONLY = {"P11", "P14"}


def run_module(module: str, *, smoke: bool) -> common.Report:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", module, "--json", str(out)] + (["--smoke"] if smoke else [])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(common.REPO), env.get("PYTHONPATH", "")) if p
        )
        started = time.monotonic()
        proc = subprocess.run(cmd, cwd=common.REPO, env=env, check=False)
        if proc.returncode != 0 or not out.exists():
            report = common.Report(module, "FAILED TO RUN")
            report.add(f"`{' '.join(cmd[1:])}` exited with status {proc.returncode}.")
            report.goal("ran to the end", "exit 0", f"exit {proc.returncode}", False)
            report.seconds = time.monotonic() - started
            report.figures["failed"] = 1.0
            return report
        return common.Report.from_json(json.loads(out.read_text()))


def against_ceiling(reports: dict[str, common.Report]) -> list[str]:
    """Figures as fractions of what the database does at all."""
    ceiling = reports.get("Ceiling")
    if ceiling is None or "ceiling_tps" not in ceiling.figures:
        return []
    tps = ceiling.figures["ceiling_tps"]
    lines = []
    p1 = reports.get("P1")
    if p1 and "plain_tps_1" in p1.figures:
        lines.append(
            f"- P1, one-row transactions through Django: plain `atomic` "
            f"{p1.figures['plain_tps_1']:,.0f}/s ({p1.figures['plain_tps_1'] / tps:.0%} of "
            f"the ceiling), `fenced_atomic` {p1.figures['fenced_tps_1']:,.0f}/s "
            f"({p1.figures['fenced_tps_1'] / tps:.0%})."
        )
    p2 = reports.get("P2")
    if p2 and "fenced_rate_1_1" in p2.figures:
        lines.append(
            f"- P2, one fenced claim transaction per item, one worker: "
            f"{p2.figures['fenced_rate_1_1']:,.0f}/s ({p2.figures['fenced_rate_1_1'] / tps:.0%} "
            "of the ceiling)."
        )
    if lines:
        lines = [
            f"Against the ceiling ({tps:,.0f} single-row update transactions/s, one client, "
            "measured at the start of the run):",
            "",
            *lines,
            "",
        ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks that it runs")
    parser.add_argument(
        "--only",
        help="comma-separated: Ceiling,P1,...,P13 (P11 runs only when named here)",
    )
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    wanted = {k.strip().lower() for k in args.only.split(",")} if args.only else None
    selected = [
        (k, m)
        for k, m in MODULES
        if (k.lower() in wanted if wanted is not None else k not in NAMED_ONLY or args.smoke)
    ]
    if not selected:
        parser.error(f"--only {args.only!r} names none of {', '.join(k for k, _ in MODULES)}")

    started = datetime.now(UTC)
    t0 = time.monotonic()
    with common.bench_database():
        common.setup_django()
        common.migrate()
        reports: dict[str, common.Report] = {}
        for key, module in selected:
            print(f"\n==> {key} ({module})", flush=True)
            reports[key] = run_module(module, smoke=args.smoke)
            print(f"<== {key}: {reports[key].seconds:.0f} s", flush=True)
        seconds = time.monotonic() - t0
        ordered = [reports[k] for k, _ in MODULES if k in reports]
        text = results.section(
            ordered,
            started=started,
            seconds=seconds,
            smoke=args.smoke,
            machine=common.machine(),
            command=common.command_line(),
            notes=against_ceiling(reports),
        )
    print("\n" + text)
    history, summary = results.destinations(args)
    if history is not None:
        results.publish(text, history=history, summary=summary)
    failed = [r.key for r in ordered if r.figures.get("failed")]
    if failed:
        print(f"bench: failed to run: {', '.join(failed)}", file=sys.stderr)
        return 1
    missed = [f"{r.key}: {g.label}" for r in ordered for g in r.goals if g.met is False]
    print(f"bench: {len(missed)} goal(s) missed" + (": " + "; ".join(missed) if missed else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
