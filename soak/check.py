"""The checker: what the soak proves, read from the database after the run.

Three kinds of violation, reported apart (docs/reliability.md states each invariant and
why it is the right one):

``safety``
    The data is wrong: a stale write committed (S1), an item was lost or done twice (S2),
    a window gap or overlap (S3), the counter chain forked (S4), a rolled-back block's write
    is there (S5), an acknowledged commit is missing (S6), data without its audit row (S7).
``accounting``
    The record is wrong: a slot neither run nor counted as coalesced (A1), a fence change
    that is neither an acquisition with its run nor a revocation of a timed-out run (A2), a
    write by a fence no run was recorded for (A3), a succeeded run's counts differ from
    what it committed (A4), a finished run without ``finished_at`` (A5).
``liveness``
    Something did not recover: a run left ``running`` at the end (L1), a job without
    progress for longer than its bound after the final SIGCONT (L2), items left pending
    after the final passes (L3), a loop runner that died by itself or did not stop on
    SIGTERM (L4).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

from soak.driver import TERM_WAIT, Outcomes

#: Added to every job's ``interval + lease_ttl + timeout`` for the liveness bound L2: a
#: runner's start-up (1 to 2 s of Python and Django on a loaded two-core machine), the
#: loop's wake-up, the clock read.
SLACK = timedelta(seconds=5)
#: Findings of one kind listed in full up to this many; the rest are counted.
LISTED = 10
INF = float("inf")


@dataclass
class Violation:
    category: str
    invariant: str
    detail: str


@dataclass
class Findings:
    violations: list[Violation] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    #: Counts per invariant, including those past the LISTED ones.
    counts: Counter[tuple[str, str]] = field(default_factory=Counter)

    def add(self, category: str, invariant: str, detail: str) -> None:
        self.counts[(category, invariant)] += 1
        if self.counts[(category, invariant)] <= LISTED:
            self.violations.append(Violation(category, invariant, detail))

    def total(self, category: str | None = None) -> int:
        return sum(n for (c, _), n in self.counts.items() if category in (None, c))


def bound(name: str) -> timedelta:
    """L2's bound for a job: how long it may go without progress after the faults end."""
    from soak.specs import SPECS

    spec = SPECS[name]
    return spec.every + spec.lease_ttl + spec.timeout + SLACK


def check(seen: Outcomes, acks_dir: Path) -> Findings:
    found = Findings()
    data = _load()
    data["origin"] = seen.origin
    intervals = _fence_history(data, found)
    _stale_writes(data, intervals, found)
    _fence_order(data, found)
    _audit_matches_data(data, found)
    _items(data, seen, found)
    _windows(data, found)
    _chain(data, found)
    _acks(data, acks_dir, found)
    _slots(data, found)
    _fences_recorded(data, found)
    _records(data, found)
    _liveness(data, seen, found)
    _figures(data, seen, found)
    return found


# -- loading ------------------------------------------------------------------------------------


def _load() -> dict[str, Any]:
    from django_fencedjobs.models import JobLease, JobRun, Watermark
    from soak.soakapp.models import (
        Audit,
        FailRow,
        FenceEvent,
        Item,
        ItemLog,
        SlowRow,
        WindowRow,
    )
    from soak.specs import SPECS

    names = list(SPECS)
    runs = list(
        JobRun.objects.filter(job__in=names)
        .order_by("job", "scheduled_for")
        .values(
            "job",
            "scheduled_for",
            "started_at",
            "finished_at",
            "outcome",
            "fence",
            "owner",
            "items",
            "missed_slots",
            "watermark_after",
            "capped",
        )
    )
    return {
        "names": names,
        "runs": runs,
        "run_by_fence": {(r["job"], r["fence"]): r for r in runs},
        "leases": {row.name: row for row in JobLease.objects.filter(name__in=names)},
        "watermarks": {(w.job, w.key): w.value for w in Watermark.objects.filter(job__in=names)},
        "events": list(
            FenceEvent.objects.order_by("job", "tick").values(
                "job", "old_fence", "new_fence", "old_owner", "new_owner", "tick", "at"
            )
        ),
        "audits": list(
            Audit.objects.order_by("job", "tick").values(
                "job", "fence", "kind", "key", "tick", "txid", "at"
            )
        ),
        "items": list(Item.objects.values_list("id", "done_at", "done_fence")),
        "item_logs": list(ItemLog.objects.values_list("item_id", "job", "fence")),
        "windows": list(
            WindowRow.objects.order_by("job", "start", "id").values_list(
                "job", "fence", "start", "end"
            )
        ),
        "slow": list(SlowRow.objects.values_list("job", "fence", "seq")),
        "fail": list(FailRow.objects.values_list("job", "fence", "doomed")),
    }


# -- safety -------------------------------------------------------------------------------------


def _fence_history(data: dict[str, Any], found: Findings) -> dict[str, dict[int, list[float]]]:
    """Per job and fence, ``[tick it became current, tick it was superseded]``."""
    intervals: dict[str, dict[int, list[float]]] = {name: {0: [0, INF]} for name in data["names"]}
    current = dict.fromkeys(data["names"], 0)
    for event in data["events"]:
        job, old, new = event["job"], event["old_fence"], event["new_fence"]
        if job not in intervals:
            continue
        if old != current[job]:
            found.add(
                "accounting",
                "A2 fence history",
                f"{job}: fence changed from {old} at tick {event['tick']}, but the last "
                f"recorded change left it at {current[job]}",
            )
        if new <= old:
            found.add(
                "safety",
                "S1 stale write",
                f"{job}: the fence went down from {old} to {new} at tick {event['tick']}",
            )
        intervals[job].setdefault(old, [0, INF])[1] = event["tick"]
        intervals[job][new] = [event["tick"], INF]
        current[job] = new
    return intervals


def _stale_writes(
    data: dict[str, Any], intervals: dict[str, dict[int, list[float]]], found: Findings
) -> None:
    """S1: every write committed while its fence was current: after the fence change that
    made it current, before the one that superseded it (in tick order: commit order)."""
    superseded_by = {(e["job"], e["old_fence"]): e for e in data["events"]}
    for row in data["audits"]:
        job, fence, tick = row["job"], row["fence"], row["tick"]
        span = intervals.get(job, {}).get(fence)
        if span is None:
            found.add(
                "safety",
                "S1 stale write",
                f"{job}: a write under fence {fence}, which was never current "
                f"({row['kind']} {row['key']}, tick {tick})",
            )
        elif not span[0] < tick < span[1]:
            event = superseded_by.get((job, fence))
            how = (
                f"superseded at tick {span[1]} by fence {event['new_fence']} "
                f"({'revocation' if not event['new_owner'] else 'taken by ' + event['new_owner']}"
                f", at {event['at']:%H:%M:%S.%f})"
                if event
                else f"current from tick {span[0]}"
            )
            found.add(
                "safety",
                "S1 stale write",
                f"{job}: {row['kind']} {row['key']} of fence {fence} committed at tick {tick} "
                f"({row['at']:%H:%M:%S.%f}), but fence {fence} was {how}",
            )


def _fence_order(data: dict[str, Any], found: Findings) -> None:
    """S1, cross-checked without the fence history: per job, in commit (tick) order, the
    writes' fences never go down. Implied by S1 (fence spans are disjoint and ordered);
    kept apart so that a fault in the fence-history trigger could not hide a stale write."""
    highest: dict[str, tuple[int, int]] = {}
    for row in data["audits"]:  # ordered by job, tick
        job, fence, tick = row["job"], row["fence"], row["tick"]
        top = highest.get(job)
        if top is not None and fence < top[0]:
            found.add(
                "safety",
                "S1 fence order",
                f"{job}: {row['kind']} {row['key']} of fence {fence} committed at tick {tick}, "
                f"after a write of fence {top[0]} (tick {top[1]})",
            )
        if top is None or fence > top[0]:
            highest[job] = (fence, tick)


def _audit_matches_data(data: dict[str, Any], found: Findings) -> None:
    """S7: each unit of work and its audit row committed together (the same transaction)."""
    audited = Counter((a["job"], a["fence"], a["kind"], a["key"]) for a in data["audits"])
    written: Counter[tuple[str, int, str, str]] = Counter()
    for job, fence, start, _ in data["windows"]:
        written[(job, fence, "window", start.isoformat())] += 1
    for item_id, job, fence in data["item_logs"]:
        written[(job, fence, "item", str(item_id))] += 1
    for job, fence, seq in data["slow"]:
        written[(job, fence, "slow", str(seq))] += 1
    for job, fence, doomed in data["fail"]:
        written[(job, fence, "doomed" if doomed else "fail", "doomed" if doomed else "ok")] += 1
    for key in sorted(set(audited) | set(written), key=str):
        if audited[key] != written[key]:
            found.add(
                "safety",
                "S7 data and audit",
                f"{key[0]} fence {key[1]} {key[2]} {key[3]}: {written[key]} data row(s), "
                f"{audited[key]} audit row(s)",
            )
    for job, fence, doomed in data["fail"]:
        if doomed:
            found.add(
                "safety",
                "S5 rolled-back write",
                f"{job}: a write of fence {fence} made in a block that raised is committed",
            )


def _items(data: dict[str, Any], seen: Outcomes, found: Findings) -> None:
    """S2: every item the driver created exists; each done item was processed exactly once,
    in the transaction that marked it done; no pending item was processed."""
    logs: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for item_id, job, fence in data["item_logs"]:
        logs[item_id].append((job, fence))
    items = {pk: (done_at, fence) for pk, done_at, fence in data["items"]}
    for pk in seen.items_created:
        if pk not in items:
            found.add("safety", "S2 items", f"item {pk} was created and is gone")
    for pk, (done_at, fence) in items.items():
        processed = logs.get(pk, [])
        if len(processed) > 1:
            found.add("safety", "S2 items", f"item {pk} done {len(processed)} times: {processed}")
        elif done_at is not None and not processed:
            found.add(
                "safety", "S2 items", f"item {pk} marked done (fence {fence}), never processed"
            )
        elif done_at is None and processed:
            found.add(
                "safety", "S2 items", f"item {pk} processed ({processed}) but not marked done"
            )
        elif processed and processed[0][1] != fence:
            found.add(
                "safety",
                "S2 items",
                f"item {pk} marked done by fence {fence}, processed by {processed[0][1]}",
            )
    for pk in set(logs) - set(items):
        found.add("safety", "S2 items", f"item {pk} processed but does not exist")


def _windows(data: dict[str, Any], found: Findings) -> None:
    """S3: per windows job, the windows tile ``[origin, watermark)``: each of one step, each
    starting where the previous one ended, none twice, and the stored watermark at the last
    one's end; and no window ends after its run's ``now`` (the run's start)."""
    from soak.specs import WINDOW_STEPS

    by_job: dict[str, list[tuple[int, datetime, datetime]]] = defaultdict(list)
    for job, fence, start, end in data["windows"]:
        by_job[job].append((fence, start, end))
    for job, (step, key) in WINDOW_STEPS.items():
        rows = by_job.get(job, [])
        expected = data["origin"]
        for fence, start, end in rows:
            if end - start != step:
                found.add("safety", "S3 windows", f"{job}: window [{start}, {end}) is not {step}")
            if start < expected:
                found.add(
                    "safety",
                    "S3 windows",
                    f"{job}: window [{start:%H:%M:%S}, {end:%H:%M:%S}) of fence {fence} "
                    f"overlaps what was covered up to {expected:%H:%M:%S}",
                )
            elif start > expected:
                found.add(
                    "safety",
                    "S3 windows",
                    f"{job}: gap [{expected:%H:%M:%S}, {start:%H:%M:%S}) before fence {fence}'s "
                    "window",
                )
            expected = max(expected, end)
            run = data["run_by_fence"].get((job, fence))
            if run is not None and run["started_at"] is not None and end > run["started_at"]:
                found.add(
                    "safety",
                    "S3 windows",
                    f"{job}: window ending {end} processed by a run that started at "
                    f"{run['started_at']}",
                )
        watermark = data["watermarks"].get((job, key))
        if rows and watermark != expected:
            found.add(
                "safety",
                "S3 windows",
                f"{job}: the watermark is {watermark}, the windows end at {expected}",
            )
        if not rows and watermark is not None:
            found.add("safety", "S3 windows", f"{job}: a watermark ({watermark}) but no window")


def _chain(data: dict[str, Any], found: Findings) -> None:
    """S4: ``soak.slow``'s counter chain is 1, 2, ..., n, each number once."""
    seqs = Counter(seq for _, _, seq in data["slow"])
    for seq, count in sorted(seqs.items()):
        if count > 1:
            found.add("safety", "S4 counter chain", f"soak.slow: seq {seq} written {count} times")
    if seqs:
        missing = set(range(1, max(seqs) + 1)) - set(seqs)
        for seq in sorted(missing):
            found.add("safety", "S4 counter chain", f"soak.slow: seq {seq} missing")


def _acks(data: dict[str, Any], acks_dir: Path, found: Findings) -> None:
    """S6: every unit of work a handler saw commit is in the database."""
    acked: Counter[tuple[str, int, str, str]] = Counter()
    for path in sorted(acks_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.endswith("}"):
                ack = json.loads(line)
                acked[(ack["job"], ack["fence"], ack["kind"], ack["key"])] += 1
    audited = Counter((a["job"], a["fence"], a["kind"], a["key"]) for a in data["audits"])
    for key, count in sorted(acked.items(), key=str):
        if audited[key] < count:
            found.add(
                "safety",
                "S6 acknowledged commits",
                f"{key[0]} fence {key[1]} {key[2]} {key[3]}: acknowledged {count} time(s), "
                f"{audited[key]} in the database",
            )
    data["acks"] = sum(acked.values())


# -- accounting ---------------------------------------------------------------------------------


def _slots(data: dict[str, Any], found: Findings) -> None:
    """A1: per job, every fire time from the job's first slot to its last run's slot is that
    run's slot or counted in a run's ``missed_slots``, and the next slot is the one after."""
    from django_fencedjobs.registry import registry

    runs_by_job: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in data["runs"]:
        runs_by_job[run["job"]].append(run)
    slots = coalesced = 0
    for name in data["names"]:
        schedule = registry.get(name).valid_schedule
        lease = data["leases"].get(name)
        runs = runs_by_job.get(name, [])
        if lease is None or not runs:
            found.add("accounting", "A1 slots", f"{name}: no lease row or no run at all")
            continue
        previous = lease.created_at
        for run in runs:
            fired = len(schedule.fire_times(previous, run["scheduled_for"]))
            slots += fired
            coalesced += run["missed_slots"]
            if fired - 1 != run["missed_slots"]:
                found.add(
                    "accounting",
                    "A1 slots",
                    f"{name}: {fired} slot(s) in ({previous:%H:%M:%S}, "
                    f"{run['scheduled_for']:%H:%M:%S}], but the run for the last one counts "
                    f"{run['missed_slots']} coalesced",
                )
            previous = run["scheduled_for"]
        if lease.next_run_at != schedule.next_after(previous):
            found.add(
                "accounting",
                "A1 slots",
                f"{name}: next slot {lease.next_run_at:%H:%M:%S}, but the slot after the last "
                f"run's ({previous:%H:%M:%S}) is {schedule.next_after(previous):%H:%M:%S}",
            )
    data["slots"], data["coalesced"] = slots, coalesced


def _fences_recorded(data: dict[str, Any], found: Findings) -> None:
    """A2: every fence change is either an acquisition, recorded as a run with that fence
    and owner, or the end of a run (owner cleared: finished, timed out, given up on), whose
    run is recorded with its outcome. A3: every write's fence is a recorded run's."""
    for event in data["events"]:
        job = event["job"]
        if job not in data["leases"]:
            continue
        if event["new_owner"]:
            run = data["run_by_fence"].get((job, event["new_fence"]))
            if run is None or run["owner"] != event["new_owner"]:
                other = f" (a run of owner {run['owner']})" if run else ""
                found.add(
                    "accounting",
                    "A2 fence history",
                    f"{job}: fence {event['new_fence']} taken by {event['new_owner']} has no "
                    f"run recorded for it{other}",
                )
        else:
            run = data["run_by_fence"].get((job, event["old_fence"]))
            if run is None or run["outcome"] in ("running", "abandoned"):
                found.add(
                    "accounting",
                    "A2 fence history",
                    f"{job}: the run of fence {event['old_fence']} ended (at "
                    f"{event['at']:%H:%M:%S.%f}), but it is recorded "
                    f"{run['outcome'] if run else 'nowhere'}",
                )
    for job, fence in sorted({(a["job"], a["fence"]) for a in data["audits"]}):
        if (job, fence) not in data["run_by_fence"]:
            found.add("accounting", "A3 writes by runs", f"{job}: fence {fence} wrote, no run")


def _records(data: dict[str, Any], found: Findings) -> None:
    """A4: a succeeded run recorded the items it committed; A5: finished runs have an end."""
    from soak.specs import ITEMS, WINDOW_STEPS, WINDOWS

    committed: Counter[tuple[str, int]] = Counter()
    last_end: dict[tuple[str, int], datetime] = {}
    for job, fence, _, end in data["windows"]:
        committed[(job, fence)] += 1
        last_end[(job, fence)] = max(end, last_end.get((job, fence), end))
    for _, job, fence in data["item_logs"]:
        committed[(job, fence)] += 1
    for run in data["runs"]:
        key = (run["job"], run["fence"])
        if run["outcome"] not in ("running",) and run["finished_at"] is None:
            found.add("accounting", "A5 run records", f"{key}: {run['outcome']} without an end")
        if run["outcome"] != "succeeded" or (
            run["job"] not in WINDOW_STEPS and run["job"] != ITEMS
        ):
            continue
        if run["items"] != committed[key]:
            found.add(
                "accounting",
                "A4 run records",
                f"{run['job']} fence {run['fence']} succeeded with items={run['items']}, "
                f"committed {committed[key]}",
            )
        if run["job"] == WINDOWS and key in last_end:
            if run["watermark_after"] != last_end[key].isoformat():
                found.add(
                    "accounting",
                    "A4 run records",
                    f"{run['job']} fence {run['fence']}: watermark_after "
                    f"{run['watermark_after']!r}, its last window ends {last_end[key]}",
                )


# -- liveness -----------------------------------------------------------------------------------


def _liveness(data: dict[str, Any], seen: Outcomes, found: Findings) -> None:
    for run in data["runs"]:
        if run["outcome"] == "running":
            found.add(
                "liveness",
                "L1 runs left running",
                f"{run['job']} fence {run['fence']} ({run['owner']}) still running at the end",
            )
    from soak.specs import SPECS

    gaps: dict[str, dict[str, Any]] = {}
    if seen.calm_at is None or seen.quiet_end is None:
        raise RuntimeError("the soak did not reach its quiet period")
    for name, spec in SPECS.items():
        times = _progress(data, name, spec.progress, seen.calm_at, seen.quiet_end)
        points = [seen.calm_at, *times, seen.quiet_end]
        widest = max(b - a for a, b in pairwise(points))
        first = (times[0] - seen.calm_at) if times else None
        limit = bound(name)
        gaps[name] = {
            "max_gap": widest.total_seconds(),
            "first": first.total_seconds() if first is not None else None,
            "bound": limit.total_seconds(),
            "progress_runs": len(times),
        }
        if widest > limit:
            found.add(
                "liveness",
                "L2 stuck after the faults",
                f"{name}: {widest.total_seconds():.1f}s without progress after the final "
                f"SIGCONT (bound {limit.total_seconds():.1f}s = interval + lease_ttl + "
                f"timeout + {SLACK.total_seconds():.0f}s)",
            )
    data["gaps"] = gaps
    pending = sum(1 for _, done_at, _ in data["items"] if done_at is None)
    if pending:
        found.add(
            "liveness",
            "L3 backlog",
            f"{pending} item(s) still pending after {seen.final_passes} final pass(es)",
        )
    for label, code, tail in seen.loop_deaths:
        found.add(
            "liveness",
            "L4 runners",
            f"loop runner {label} exited by itself (exit {code}): {tail.splitlines()[-1:]}",
        )
    for label, stopped, tail in seen.bad_stops:
        what = f"exit {stopped}" if stopped is not None else f"still running after {TERM_WAIT:.0f}s"
        found.add("liveness", "L4 runners", f"{label} on SIGTERM: {what}: {tail[-300:]}")


# -- figures ------------------------------------------------------------------------------------


def _figures(data: dict[str, Any], seen: Outcomes, found: Findings) -> None:
    from soak.specs import SPECS, WINDOW_STEPS

    outcomes = Counter(run["outcome"] for run in data["runs"])
    per_job = {
        name: dict(Counter(r["outcome"] for r in data["runs"] if r["job"] == name))
        for name in SPECS
    }
    events = [e for e in data["events"] if e["job"] in SPECS]
    windows = Counter(job for job, *_ in data["windows"])
    gaps_during_faults: dict[str, float] = {}
    if seen.calm_at is None or seen.started_at is None:
        raise RuntimeError("the soak did not reach its quiet period")
    for name, spec in SPECS.items():
        times = _progress(data, name, spec.progress, None, seen.calm_at)
        points = [seen.started_at, *times, seen.calm_at]
        gaps_during_faults[name] = max((b - a).total_seconds() for a, b in pairwise(points))
    found.figures.update(
        runs=sum(outcomes.values()),
        outcomes=dict(sorted(outcomes.items())),
        outcomes_by_job=per_job,
        fence_changes=len(events),
        acquisitions=sum(1 for e in events if e["new_owner"]),
        takeovers=sum(1 for e in events if e["old_owner"] and e["new_owner"]),
        run_ends=sum(1 for e in events if not e["new_owner"]),
        items_created=len(data["items"]),
        items_done=sum(1 for _, done_at, _ in data["items"] if done_at is not None),
        items_pending=sum(1 for _, done_at, _ in data["items"] if done_at is None),
        windows={name: windows.get(name, 0) for name in WINDOW_STEPS},
        counter_chain=len(data["slow"]),
        audit_rows=len(data["audits"]),
        acks=data.get("acks", 0),
        slots=data.get("slots", 0),
        coalesced_slots=data.get("coalesced", 0),
        liveness_after_calm=data.get("gaps", {}),
        max_gap_during_faults=gaps_during_faults,
    )


def dump(directory: Path) -> None:
    """Write the tables the checker read to ``<directory>/tables/*.csv``, for a post-mortem
    (the throwaway server is gone by the time anyone looks)."""
    import csv

    from django_fencedjobs.models import JobLease, JobRun, Watermark
    from soak.soakapp.models import Audit, FailRow, FenceEvent, Item, ItemLog, SlowRow, WindowRow

    target = directory / "tables"
    target.mkdir(exist_ok=True)
    for model in (
        JobLease,
        JobRun,
        Watermark,
        Audit,
        FenceEvent,
        Item,
        ItemLog,
        WindowRow,
        SlowRow,
        FailRow,
    ):
        names = [f.attname for f in model._meta.concrete_fields]
        with open(target / f"{model._meta.db_table}.csv", "w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(names)
            writer.writerows(model.objects.order_by("pk").values_list(*names))


def _progress(data: dict[str, Any], job: str, outcomes: Any, since: Any, until: Any) -> list[Any]:
    """When ``job``'s runs that count as progress finished, in ``[since, until]`` (no lower
    bound for None), in order."""
    return sorted(
        r["finished_at"]
        for r in data["runs"]
        if r["job"] == job
        and r["outcome"] in outcomes
        and r["finished_at"] is not None
        and (since is None or since <= r["finished_at"])
        and r["finished_at"] <= until
    )
