"""The soak's figures: printed as text, and written as JSON or a markdown table on request."""

from __future__ import annotations

import json
import os
import platform
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from soak.check import SLACK, Findings
from soak.driver import Outcomes
from soak.plan import Plan

CATEGORIES = ("safety", "accounting", "liveness")
#: The kinds of fault the soak is meant to inject, as counted by the driver.
FAULT_KINDS = (
    "SIGSTOP",
    "SIGSTOP in a transaction",
    "SIGCONT",
    "SIGKILL",
    "SIGTERM",
    "PostgreSQL restart",
)


def injected(seen: Outcomes) -> dict[str, int]:
    """Faults by kind, as the test and the table count them."""
    return {
        "SIGSTOP": seen.faults["SIGSTOP"],
        "SIGSTOP in a transaction": seen.landed["in a transaction"],
        "SIGCONT": seen.faults["SIGCONT"],
        "SIGKILL": seen.faults["SIGKILL (running)"] + seen.faults["SIGKILL (stopped)"],
        "SIGTERM": seen.faults["SIGTERM"],
        "PostgreSQL restart": seen.faults["PostgreSQL restart"],
    }


def environment(seen: Outcomes) -> dict[str, str]:
    import django
    import psycopg

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return {
        "machine": f"{os.cpu_count()} cores, {platform.system()} {platform.release()}, "
        f"load average at the end {load}",
        "versions": f"{seen.server_version or 'PostgreSQL ?'} (throwaway: fsync off); "
        f"Python {platform.python_version()}, Django {django.get_version()}, "
        f"psycopg {psycopg.__version__}",
        "wall time": f"{seen.wall_seconds / 60:.1f} min",
    }


def summary(plan: Plan, seen: Outcomes, found: Findings, command: str) -> dict[str, Any]:
    return {
        "environment": environment(seen),
        "seed": plan.seed,
        "plan": plan.digest,
        "seconds": plan.seconds,
        "quiet": plan.quiet,
        "command": command,
        "injected": injected(seen),
        "faults": dict(sorted(seen.faults.items())),
        "landed": dict(sorted(seen.landed.items())),
        "skipped": dict(sorted(seen.skipped.items())),
        "restarts": seen.restarts,
        "cron_started": seen.cron_started,
        "cron_skipped": seen.cron_skipped,
        "exits": dict(sorted(seen.exits.items())),
        "final_passes": seen.final_passes,
        "tracebacks": seen.tracebacks,
        "ignored": dict(sorted(seen.ignored.items())),
        "producer_failures": seen.producer_failures,
        "pg_restart_seconds": [round(s, 2) for s in seen.pg_restart_seconds],
        "figures": found.figures,
        "violations": {c: found.total(c) for c in CATEGORIES},
        "by_invariant": {f"{c}: {i}": n for (c, i), n in sorted(found.counts.items())},
        "details": [
            {"category": v.category, "invariant": v.invariant, "detail": v.detail}
            for v in found.violations
        ],
    }


def _counts(counter: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counter.items() if v) or "none"


def text(report: dict[str, Any]) -> str:
    fig = report["figures"]
    lines = [
        f"seed {report['seed']} (plan {report['plan']}): {report['seconds']:.0f}s of faults, "
        f"{report['quiet']:.0f}s quiet",
        "; ".join(report["environment"].values()),
        f"faults injected: {_counts(report['injected'])}",
        f"  SIGSTOPs landed: {_counts(report['landed'])}; aimed inside a transaction: "
        f"{report['faults'].get('SIGSTOP aimed inside a transaction', 0)}; SIGKILLs of a "
        f"stopped process: {report['faults'].get('SIGKILL (stopped)', 0)}",
        f"  not applied (target down or stopped): {sum(report['skipped'].values())}",
        f"runners: {report['restarts']} loop restarts, {report['cron_started']} cron "
        f"`runjobs --once` ({report['cron_skipped']} skipped: 3 still running), "
        f"{report['final_passes']} final pass(es); exits: {_counts(report['exits'])}",
        f"runner logs: {report['tracebacks']} tracebacks; exceptions Python could only "
        f'report ("Exception ignored in"): {_counts(report["ignored"])}',
        f"runs: {fig['runs']}: {_counts(fig['outcomes'])}",
        f"fences: {fig['fence_changes']} changes: {fig['acquisitions']} acquisitions, of which "
        f"{fig['takeovers']} takeovers (from a holder that had not ended its run), "
        f"{fig['run_ends']} run ends",
        f"items: {fig['items_created']} created, {fig['items_done']} done, "
        f"{fig['items_pending']} pending",
        f"windows: {_counts(fig['windows'])}; counter chain: {fig['counter_chain']}",
        f"operations: {_counts(fig['operations'])}",
        f"runs by kind: {_counts(fig['runs_by_kind'])}; retries {fig['retries']}; excluded "
        f"slots {fig.get('excluded_records', 0)}, of which run deferred "
        f"{fig.get('deferred_runs', 0)}; instance "
        f"runs {fig['instance_runs']}; skipped records {fig['skipped_records']}; lease rows "
        f"deleted {fig['lease_rows_deleted']}; slot rows {fig['slot_rows']}; backfill "
        f"windows {fig['backfill_windows']}",
        f"slots: {fig['slots']} ({fig['coalesced_slots']} coalesced); audit rows "
        f"{fig['audit_rows']}; acknowledged commits {fig['acks']}",
        f"after the final SIGCONT (bound: interval + lease_ttl + timeout + "
        f"{SLACK.total_seconds():.0f}s):",
    ]
    for name, gap in fig["liveness_after_calm"].items():
        first = f"{gap['first']:.1f}s" if gap["first"] is not None else "never"
        lines.append(
            f"  {name}: first progress after {first}, max gap {gap['max_gap']:.1f}s "
            f"(bound {gap['bound']:.1f}s), {gap['progress_runs']} runs"
        )
    lines.append(
        "during the faults, longest time without progress: "
        + ", ".join(f"{k} {v:.1f}s" for k, v in fig["max_gap_during_faults"].items())
    )
    v = report["violations"]
    lines.append(
        f"violations: {sum(v.values())} (safety {v['safety']}, accounting "
        f"{v['accounting']}, liveness {v['liveness']})"
    )
    for name, count in report["by_invariant"].items():
        lines.append(f"  {name}: {count}")
    for detail in report["details"]:
        lines.append(f"    [{detail['category']}] {detail['invariant']}: {detail['detail']}")
    lines.append(f"reproduce: {report['command']}")
    return "\n".join(lines)


def markdown(report: dict[str, Any]) -> str:
    fig = report["figures"]
    v = report["violations"]
    rows = [
        ("seed", f"`{report['seed']}` (plan `{report['plan']}`)"),
        ("command", f"`{report['command']}`"),
        ("duration", f"{report['seconds']:.0f} s of faults, then {report['quiet']:.0f} s quiet"),
        *report["environment"].items(),
    ]
    rows += [(f"faults: {k}", str(n)) for k, n in report["injected"].items()]
    rows += [
        ("SIGSTOPs landed", _counts(report["landed"])),
        ("SIGKILLs of a stopped process", str(report["faults"].get("SIGKILL (stopped)", 0))),
        ("loop restarts", str(report["restarts"])),
        ("cron `runjobs --once` started", str(report["cron_started"])),
        ("tracebacks in the runners' logs", str(report["tracebacks"])),
        ('"Exception ignored in" (by where)', _counts(report["ignored"])),
        ("runs", str(fig["runs"])),
    ]
    rows += [(f"runs: {k}", str(n)) for k, n in fig["outcomes"].items()]
    rows += [
        ("takeovers", str(fig["takeovers"])),
        ("fence changes: acquisitions / run ends", f"{fig['acquisitions']} / {fig['run_ends']}"),
        (
            "items created / done / pending",
            f"{fig['items_created']} / {fig['items_done']} / {fig['items_pending']}",
        ),
        ("windows", _counts(fig["windows"])),
        ("operations", _counts(fig["operations"])),
        ("runs by kind", _counts(fig["runs_by_kind"])),
        (
            "retries / instance runs / skipped records / lease rows deleted",
            f"{fig['retries']} / {fig['instance_runs']} / {fig['skipped_records']} / "
            f"{fig['lease_rows_deleted']}",
        ),
        (
            "slots excluded by a calendar / of which run deferred",
            f"{fig.get('excluded_records', 0)} / {fig.get('deferred_runs', 0)}",
        ),
        ("backfill windows", str(fig["backfill_windows"])),
        ("slots (coalesced)", f"{fig['slots']} ({fig['coalesced_slots']})"),
        ("acknowledged commits checked", str(fig["acks"])),
        ("violations: safety", str(v["safety"])),
        ("violations: accounting", str(v["accounting"])),
        ("violations: liveness", str(v["liveness"])),
    ]
    out = ["| figure | value |", "| --- | --- |"]
    out += [f"| {k} | {val} |" for k, val in rows]
    out += [
        "",
        "| job | first progress after the final SIGCONT | max gap | bound | "
        "longest gap during the faults |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, gap in fig["liveness_after_calm"].items():
        first = f"{gap['first']:.1f} s" if gap["first"] is not None else "never"
        out.append(
            f"| `{name}` | {first} | {gap['max_gap']:.1f} s | {gap['bound']:.1f} s | "
            f"{fig['max_gap_during_faults'][name]:.1f} s |"
        )
    if report["details"]:
        out += ["", "Violations:", ""]
        out += [f"- [{d['category']}] {d['invariant']}: {d['detail']}" for d in report["details"]]
    return "\n".join(out) + "\n"


def write(report: dict[str, Any], *, json_path: Path | None, markdown_path: Path | None) -> None:
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if markdown_path is not None:
        stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        markdown_path.write_text(f"Soak of {stamp}\n\n" + markdown(report))


__all__ = ["FAULT_KINDS", "injected", "markdown", "summary", "text", "write"]
