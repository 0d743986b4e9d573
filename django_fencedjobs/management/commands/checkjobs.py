"""``manage.py checkjobs``: every job's health, and an exit status to alert on (``help``).

The deciding is :mod:`django_fencedjobs.health`'s; the exit status, the table and the JSON
are this command's. Codes 1, 3 and 4 come with one line on stderr.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from django_fencedjobs import baseline, clock, health, notify, preflight, runners
from django_fencedjobs.db import lease_db
from django_fencedjobs.exceptions import UnknownJob
from django_fencedjobs.instants import format_instant, iso_utc
from django_fencedjobs.models import Watermark
from django_fencedjobs.registry import registry
from django_fencedjobs.text import one_line

#: The exit status when the job state cannot be read at all: every command's.
UNREACHABLE = preflight.DATABASE_UNAVAILABLE
#: The exit status when ``FENCEDJOBS`` is invalid: not 2, nothing was judged; fix the settings.
BAD_SETTINGS = 4

COLUMNS = ("JOB", "STATE", "LAST SUCCESS", "NEXT RUN", "FAILURES", "REASON")


class Command(BaseCommand):
    help = (
        "Report every scheduled job's health. Exit 0 when all are healthy, 2 when any is "
        "late, failing, invalid or without a live runner (1 with --strict for warnings: "
        "paused, capped, failing now and then), 3 when the database cannot be read "
        "(unreachable, or not migrated), 4 when the FENCEDJOBS setting is invalid."
    )
    # Report even when the configuration is broken: an invalid job is reported as such.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--json", action="store_true", dest="as_json", help="Print JSON instead of a table."
        )
        parser.add_argument(
            "--strict",
            action="store_true",
            help="Exit 1 on warnings (paused, capped, not yet picked up by a runner).",
        )
        parser.add_argument(
            "--job",
            action="append",
            dest="jobs",
            metavar="NAME",
            help="Only this job (repeatable). Default: every job.",
        )

    def handle(
        self, *args: Any, as_json: bool, strict: bool, jobs: list[str] | None, **options: Any
    ) -> None:
        try:
            preflight.check_settings()
            preflight.check_tables()
            now = clock.now()
            baseline.record_first_sightings(now)  # a job seen for the first time: its baseline
            seen = runners.read(now)
            healths, summaries = _judged(jobs, now, seen)
        except UnknownJob as exc:
            raise CommandError(str(exc)) from None
        except ImproperlyConfigured as exc:
            raise CommandError(
                f"FENCEDJOBS is invalid: {one_line(exc)}", returncode=BAD_SETTINGS
            ) from None
        except preflight.NotMigrated as exc:
            raise CommandError(
                f"cannot read the job state: {exc}", returncode=UNREACHABLE
            ) from None
        except DatabaseError as exc:
            raise CommandError(
                f"cannot read the job state, database unavailable: {one_line(exc)}",
                returncode=UNREACHABLE,
            ) from None
        try:
            # With NOTIFY on: tell each change once (the instances' together).
            notify.evaluate(healths, now=now, summaries=summaries)
        except DatabaseError as exc:  # e.g. a user that may only read: still report
            self.stderr.write(
                f"could not record the jobs' changes of state (NOTIFY): {one_line(exc)}"
            )
        status = _exit_code([*healths, *summaries], strict=strict)
        if as_json:
            self.stdout.write(_json(healths, status, seen, summaries, now))
        else:
            if healths or not summaries:  # jobs with instances only: their counts say it all
                self.stdout.write(_table(healths))
            for summary in summaries:
                self.stdout.write(_summary_line(summary))
            if any(h.state is health.State.NO_RUNNER for h in healths):
                self.stdout.write(_runners_line(seen))
        if status:
            bad = [h for h in healths if h.severity is health.Severity.CRITICAL] or [
                h for h in healths if h.severity is health.Severity.WARNING
            ]
            named = [f"{h.name} ({h.state})" for h in bad] + [
                f"{s.job}[*] ({s.worst})"
                for s in summaries
                if s.severity is health.Severity.CRITICAL
            ]
            raise CommandError(
                f"{len(named)} of {len(healths) + len(summaries)} job(s) need attention: "
                f"{', '.join(named)}",
                returncode=status,
            )


def _judged(
    jobs: list[str] | None, now: datetime, seen: runners.Coverage
) -> tuple[list[health.JobHealth], list[health.InstanceSummary]]:
    """What to report: every job and every job's instances counted, or the named ones. A
    job declared with ``instances=True`` has no schedule of its own: named, it is reported
    as its instances (those that may not be ok, listed; all of them, counted), so that a
    per-job alert on it follows its instances."""
    if not jobs:
        healths = health.all_health(None, now=now, coverage=seen)
        return healths, health.instance_summaries(healths, coverage=seen, now=now)
    declared = [registry.get(name) for name in jobs if name in registry]
    parents = [job.name for job in declared if job.instances and job.valid]
    others = [name for name in jobs if name not in parents]
    healths = health.all_health(others, now=now, coverage=seen) if others else []
    if not parents:
        return healths, []
    named = {h.name for h in healths}
    listed = [
        h
        for h in health.all_health(None, now=now, coverage=seen)
        if h.job is not None and h.job.parent in parents and h.name not in named
    ]
    summaries = health.instance_summaries(listed, coverage=seen, now=now)
    return [*healths, *listed], [s for s in summaries if s.job in parents]


def _summary_line(summary: health.InstanceSummary) -> str:
    """One line per job with instances: the instances are listed above only when they may
    not be ok (the first ones by name, when many are); this counts them all."""
    if summary.no_runner is not None and summary.total > summary.disabled:
        enabled = summary.total - summary.disabled
        return (
            f"{summary.job}: {summary.total} instance(s): {enabled} NO_RUNNER: {summary.no_runner}"
        )
    counts = [f"{summary.ok} ok"]
    if summary.disabled:
        counts.append(f"{summary.disabled} disabled")
    counts += [f"{count} {state}" for state, count in sorted(summary.states.items())]
    line = f"{summary.job}: {summary.total} instance(s): {', '.join(counts)}"
    if summary.counted is not None:
        line += (
            f" (counted by their lease rows: more may not be ok than the "
            f"{health.INSTANCES_JUDGED} judged one by one, listed above)"
        )
    return line


def _json(
    healths: list[health.JobHealth],
    status: int,
    seen: runners.Coverage,
    summaries: list[health.InstanceSummary],
    now: datetime,
) -> str:
    return json.dumps(
        {
            "healthy": status == 0,
            "exit_code": status,
            "checked_at": now.isoformat(),
            "jobs": [
                {**_as_dict(h), "watermarks": marks.get(h.name, {})}
                for marks in [_watermarks([h.name for h in healths])]
                for h in healths
            ],
            # Jobs with instances: every instance counted; "jobs" lists those that may not
            # be ok (and any named with --job).
            "instances": [
                {
                    "job": s.job,
                    "total": s.total,
                    "ok": s.ok,
                    "disabled": s.disabled,
                    "listed": s.listed,
                    "states": s.states,
                    "counted": s.counted is not None,
                    "no_runner": s.no_runner,
                }
                for s in summaries
            ],
            "runners": [
                {
                    "owner": r.owner,
                    "mode": r.mode,
                    "live": r.live(seen.now),
                    "started_at": iso_utc(r.started_at),
                    "last_seen_at": iso_utc(r.last_beat_at),
                    "stopped_at": _iso(r.stopped_at),
                    "jobs": sorted(r.jobs),
                }
                for r in sorted(seen.runners, key=lambda r: r.last_beat_at, reverse=True)
            ],
        },
        indent=2,
    )


def _runners_line(seen: runners.Coverage) -> str:
    """One line on the runners, below a table with a ``no_runner`` job: the live loops,
    else the last runner seen."""
    live = sorted(seen.live(), key=lambda r: r.last_beat_at, reverse=True)
    if live:
        listed = ", ".join(
            f"{r.owner} (seen {runners.duration_text(seen.now - r.last_beat_at)} ago)" for r in live
        )
        return f"\nRunners: {len(live)} live: {listed}"
    last = max(seen.runners, key=lambda r: r.last_beat_at)
    return (
        f"\nRunners: none live; last seen {last.label} at {format_instant(last.last_beat_at, UTC)}"
    )


def _table(healths: list[health.JobHealth]) -> str:
    if not healths:
        return "No jobs are declared or recorded."
    rows = [
        (
            h.name,
            h.state.value.upper() if not h.healthy else h.state.value,
            h.at(h.last_success_at) if h.last_success_at else "never",
            _next_run(h),
            str(h.consecutive_failures),
            h.reason,
        )
        for h in healths
    ]
    widths = [max(len(row[i]) for row in [COLUMNS, *rows]) for i in range(len(COLUMNS) - 1)]
    lines = []
    for row in [COLUMNS, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append("  ".join([*cells, row[-1]]))
    return "\n".join(lines)


def _next_run(h: health.JobHealth) -> str:
    if h.paused:
        return "paused"
    if h.next_run_at is None or h.state is health.State.REMOVED:
        return "-"
    if h.next_run_at <= h.checked_at:
        return f"due since {h.at(h.next_run_at)}"
    return h.at(h.next_run_at)


def _exit_code(
    healths: Iterable[health.JobHealth | health.InstanceSummary], *, strict: bool = False
) -> int:
    """2 if any job is critical (late, failing, invalid); with ``strict``, 1 if any is a
    warning (paused, capped, failed before its first success, not recorded yet); else 0."""
    severities = {h.severity for h in healths}
    if health.Severity.CRITICAL in severities:
        return 2
    if strict and health.Severity.WARNING in severities:
        return 1
    return 0


def _iso(value: datetime | None) -> str | None:
    return None if value is None else iso_utc(value)


def _watermarks(names: list[str]) -> dict[str, dict[str, str | int | None]]:
    """Each job's stored watermarks by key ("" the default), as JSON values: one query."""
    found: dict[str, dict[str, str | int | None]] = {}
    for mark in Watermark.objects.using(lease_db()).filter(job__in=names):
        value = mark.value
        found.setdefault(mark.job, {})[mark.key] = (
            iso_utc(value) if isinstance(value, datetime) else value
        )
    return found


def _as_dict(h: health.JobHealth) -> dict[str, Any]:
    """One job in ``--json``: times in ISO 8601, UTC."""

    def run(summary: health.RunSummary | None) -> dict[str, Any] | None:
        if summary is None:
            return None
        return {
            "scheduled_for": _iso(summary.scheduled_for),
            "started_at": _iso(summary.started_at),
            "finished_at": _iso(summary.finished_at),
            "outcome": summary.outcome,
            "capped": summary.capped,
            "items": summary.items,
            "error": summary.error_excerpt,
        }

    def slot(summary: health.TaskSlot | None) -> dict[str, Any] | None:
        if summary is None:
            return None
        return {
            "scheduled_for": _iso(summary.scheduled_for),
            "pending": summary.pending,
            "ready": summary.ready,
            "running": summary.running,
            "successful": summary.successful,
            "failed": summary.failed,
            "running_since": _iso(summary.running_since),
            "failed_task": summary.failed_task,
            "error": summary.error_excerpt,
        }

    tasks = h.tasks
    return {
        "name": h.name,
        "state": h.state.value,
        "severity": h.severity.value,
        "reason": h.reason,
        "checked_at": _iso(h.checked_at),
        "timezone": h.timezone,
        "schedule": h.schedule,
        "last_success_at": _iso(h.last_success_at),
        "next_run_at": _iso(h.next_run_at),
        "expected_by": _iso(h.expected_by),
        "consecutive_failures": h.consecutive_failures,
        "failure_threshold": h.failure_threshold,
        "runners": list(h.runners),
        "failure_rate": {
            "runs": h.recent_runs,
            "failures": h.recent_failures,
            "rate": h.failure_rate,
        },
        "paused": h.paused,
        "running": h.running,
        "owner": h.owner,
        "fence": h.fence,
        "lease_until": _iso(h.lease_until),
        "last_run": run(h.last_run),
        "last_finished_run": run(h.last_finished_run),
        "tasks": None
        if tasks is None
        else {"unfinished": slot(tasks.unfinished), "last_outcome": slot(tasks.last_outcome)},
    }
