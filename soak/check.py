"""The checker: what the soak proves, read from the database after the run.

Three kinds of violation, reported apart (docs/reliability.md states each invariant and
why it is the right one):

``safety``
    The data is wrong: a stale write committed (S1), an item was lost or done twice (S2),
    a window gap or overlap (S3), the counter chain forked (S4), a rolled-back block's write
    is there (S5), an acknowledged commit is missing (S6), data without its audit row (S7),
    a fence that repeats for a name (S8), a one-off's, backfill slot's or scheduled slot's
    work committed twice (S9; a backfill's watermark windows: each window once).
``accounting``
    The record is wrong: a slot neither run nor counted as coalesced (A1), a fence change
    that is neither an acquisition with its run nor a revocation of a timed-out run (A2), a
    write by a fence no run was recorded for (A3), a succeeded run's counts differ from
    what it committed (A4), a finished run without ``finished_at`` (A5), a backfill slot or
    one-off queued and never run (A6), a retry that covers another interval than the attempt
    it retries (A7), a run recorded ``fence_lost`` whose fence nobody took (A8).
``liveness``
    Something did not recover: a run left ``running`` at the end (L1), a job without
    progress for longer than its bound after the final SIGCONT (L2), items left pending
    after the final passes (L3), a loop runner that died by itself or did not stop on
    SIGTERM (L4).
"""

from __future__ import annotations

import json
import re
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
    _repeated_fences(data, found)
    _slot_once(data, found)
    _backfill_windows(data, found)
    _slots(data, found)
    _oneshots(data, found)
    _retry_intervals(data, found)
    _lost_to_nobody(data, found)
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
        SlotRow,
        SlowRow,
        WindowRow,
    )
    from soak.specs import SPECS

    names = list(SPECS)
    runs = list(
        JobRun.objects.filter(job__startswith="soak.")
        .order_by("job", "scheduled_for", "attempt")
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
            "attempt",
            "kind",
            "error",
        )
    )
    return {
        "names": names,
        "runs": runs,
        "run_by_fence": {(r["job"], r["fence"]): r for r in runs},
        "leases": {row.name: row for row in JobLease.objects.filter(name__in=names)},
        "oneshots": list(
            JobLease.objects.exclude(kind="scheduled").values("name", "kind", "run_slot", "paused")
        ),
        "watermarks": {(w.job, w.key): w.value for w in Watermark.objects.filter(job__in=names)},
        "events": list(
            FenceEvent.objects.order_by("job", "tick").values(
                "job",
                "op",
                "old_fence",
                "new_fence",
                "old_owner",
                "new_owner",
                "paused",
                "tick",
                "at",
            )
        ),
        "audits": list(
            Audit.objects.order_by("job", "tick").values(
                "job", "lease", "fence", "kind", "key", "tick", "txid", "at"
            )
        ),
        "items": list(Item.objects.values_list("id", "done_at", "done_fence")),
        "item_logs": list(ItemLog.objects.values_list("item_id", "job", "fence")),
        "windows": list(
            WindowRow.objects.order_by("job", "start", "id").values_list(
                "job", "fence", "start", "end", "lease"
            )
        ),
        "slot_rows": list(
            SlotRow.objects.order_by("id").values(
                "job", "lease", "fence", "kind", "slot", "attempt", "interval_start", "done"
            )
        ),
        "slow": list(SlowRow.objects.values_list("job", "fence", "seq")),
        "fail": list(FailRow.objects.values_list("job", "fence", "doomed")),
    }


def target_of(row: str) -> str:
    """The name a lease row's runs are recorded as: a backfill slot's or one-off's row
    (``target@backfill:<slot>``, ``target@once:<instant>``) runs as its target; a job's or
    an instance's row as itself."""
    return re.sub(r"@(backfill|once):[^\[\]@]*$", "", row)


# -- safety -------------------------------------------------------------------------------------


def _fence_history(
    data: dict[str, Any], found: Findings
) -> dict[str, dict[int, list[list[float]]]]:
    """Per lease row name and fence, the spans ``[tick it became current, tick it was
    superseded]`` (a name's row deleted and created again: one span per row). A row's
    first fence change that is not an acquisition, from the fence it was created with,
    sets its first fence (``data["inits"]``: not a run's end)."""
    intervals: dict[str, dict[int, list[list[float]]]] = defaultdict(dict)
    current: dict[str, int | None] = {}
    fresh: set[str] = set()
    data["inits"] = inits = set()
    for event in data["events"]:
        row, op, tick = event["job"], event.get("op", "changed"), event["tick"]
        old, new = event["old_fence"], event["new_fence"]
        if op == "created":
            if current.get(row) is not None:
                found.add("accounting", "A2 fence history", f"{row}: created twice (tick {tick})")
            current[row] = new
            intervals[row].setdefault(new, []).append([tick, INF])
            fresh.add(row)
            continue
        if row not in current:  # no creation recorded: a row that existed at fence old
            current[row] = old
            intervals[row].setdefault(old, []).append([0, INF])
        if op == "deleted":
            if current[row] is not None:
                intervals[row][current[row]][-1][1] = tick
            current[row] = None
            continue
        if old != current[row]:
            found.add(
                "accounting",
                "A2 fence history",
                f"{row}: fence changed from {old} at tick {tick}, but the last recorded change "
                f"left it at {current[row]}",
            )
        if new <= old:
            found.add(
                "safety",
                "S1 stale write",
                f"{row}: the fence went down from {old} to {new} at tick {tick}",
            )
        if row in fresh and not event["old_owner"] and not event["new_owner"]:
            inits.add((row, tick))
        fresh.discard(row)
        spans = intervals[row].setdefault(old, [[0, INF]])
        spans[-1][1] = tick
        intervals[row].setdefault(new, []).append([tick, INF])
        current[row] = new
    return intervals


def _stale_writes(
    data: dict[str, Any], intervals: dict[str, dict[int, list[list[float]]]], found: Findings
) -> None:
    """S1: every write committed while its fence was current on the lease row its run
    held: after the fence change that made it current, before the one that superseded it
    or the row's deletion (in tick order: commit order)."""
    superseded_by = {
        (e["job"], e["old_fence"]): e for e in data["events"] if e.get("op") != "created"
    }
    for row in data["audits"]:
        lease, fence, tick = row.get("lease") or row["job"], row["fence"], row["tick"]
        spans = intervals.get(lease, {}).get(fence)
        if spans is None:
            found.add(
                "safety",
                "S1 stale write",
                f"{lease}: a write under fence {fence}, which was never current "
                f"({row['kind']} {row['key']}, tick {tick})",
            )
        elif not any(a < tick < b for a, b in spans):
            event = superseded_by.get((lease, fence))
            if event is None:
                how = f"current from tick {spans[0][0]}"
            elif event.get("op") == "deleted":
                how = f"deleted with its row at tick {event['tick']} ({event['at']:%H:%M:%S.%f})"
            else:
                by = "revocation" if not event["new_owner"] else "taken by " + event["new_owner"]
                how = (
                    f"superseded at tick {event['tick']} by fence {event['new_fence']} "
                    f"({by}, at {event['at']:%H:%M:%S.%f})"
                )
            found.add(
                "safety",
                "S1 stale write",
                f"{lease}: {row['kind']} {row['key']} of fence {fence} committed at tick {tick} "
                f"({row['at']:%H:%M:%S.%f}), but fence {fence} was {how}",
            )


def _fence_order(data: dict[str, Any], found: Findings) -> None:
    """S1, cross-checked without the fence history: per lease row name, in commit (tick)
    order, the writes' fences never go down (a row deleted and created again included).
    Implied by S1 (fence spans are disjoint and ordered); kept apart so that a fault in the
    fence-history trigger could not hide a stale write."""
    highest: dict[str, tuple[int, int]] = {}
    for row in sorted(data["audits"], key=lambda a: (a.get("lease") or a["job"], a["tick"])):
        lease, fence, tick = row.get("lease") or row["job"], row["fence"], row["tick"]
        top = highest.get(lease)
        if top is not None and fence < top[0]:
            found.add(
                "safety",
                "S1 fence order",
                f"{lease}: {row['kind']} {row['key']} of fence {fence} committed at tick {tick}, "
                f"after a write of fence {top[0]} (tick {top[1]})",
            )
        if top is None or fence > top[0]:
            highest[lease] = (fence, tick)


def _audit_matches_data(data: dict[str, Any], found: Findings) -> None:
    """S7: each unit of work and its audit row committed together (the same transaction)."""
    audited = Counter((a["job"], a["fence"], a["kind"], a["key"]) for a in data["audits"])
    written: Counter[tuple[str, int, str, str]] = Counter()
    for job, fence, start, *_ in data["windows"]:
        written[(job, fence, "window", start.isoformat())] += 1
    for slot in data.get("slot_rows", []):
        key = f"{slot['slot'].isoformat()}#{slot['attempt']}"
        written[(slot["job"], slot["fence"], "slot" if slot["done"] else "attempt", key)] += 1
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
    for job, fence, start, end, *lease in data["windows"]:
        if lease and lease[0] not in ("", job):  # a backfill slot's: _backfill_windows
            continue
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
    runs: dict[tuple[str, int], set[str]] = defaultdict(set)
    for path in sorted(acks_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.endswith("}"):
                ack = json.loads(line)
                acked[(ack["job"], ack["fence"], ack["kind"], ack["key"])] += 1
                runs[(ack["job"], ack["fence"])].add(ack.get("run", ""))
    data["ack_runs"] = runs
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


#: Outcomes of runs that never held a fence (a skipped slot's record, a missed one's).
FENCELESS = ("skipped", "missed")


def _repeated_fences(data: dict[str, Any], found: Findings) -> None:
    """S8: a fence never repeats for a name. Per name (a job, an instance; a backfill
    slot's or one-off's row counts as its target's), every fence acquired is acquired
    once, whichever lease row (deleted and created again or not) gave it; no two recorded
    runs of a name hold the same fence; no two runs acknowledged writes under one."""
    acquired: dict[tuple[str, int], list[str]] = defaultdict(list)
    for event in data["events"]:
        if event.get("op", "changed") == "changed" and event["new_owner"]:
            acquired[(target_of(event["job"]), event["new_fence"])].append(event["job"])
    for (name, fence), rows in sorted(acquired.items()):
        if len(rows) > 1:
            found.add(
                "safety",
                "S8 fence repeated",
                f"{name}: fence {fence} acquired {len(rows)} times (lease rows {sorted(rows)})",
            )
    held: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for run in data["runs"]:
        if run["outcome"] not in FENCELESS:
            held[(run["job"], run["fence"])].append(run)
    for (name, fence), runs in sorted(held.items(), key=str):
        if len(runs) > 1:
            which = ", ".join(
                f"{r['scheduled_for']:%H:%M:%S.%f} #{r['attempt']} {r['kind']} {r['outcome']}"
                for r in runs
            )
            found.add(
                "safety", "S8 fence repeated", f"{name}: {len(runs)} runs of fence {fence}: {which}"
            )
    for (name, fence), idents in sorted(data.get("ack_runs", {}).items(), key=str):
        if len(idents) > 1:
            found.add(
                "safety",
                "S8 fence repeated",
                f"{name}: writes of fence {fence} acknowledged by {len(idents)} runs: "
                f"{sorted(idents)}",
            )


def _slot_once(data: dict[str, Any], found: Findings) -> None:
    """S9: a slot's work (a done :class:`SlotRow`) commits once: per lease row of a
    backfill slot or one-off, and per slot of a job's or instance's schedule (its
    retries included), at most one fence commits it."""
    from soak.specs import OPERATOR_KINDS

    fences: dict[tuple[str, Any], set[int]] = defaultdict(set)
    for row in data.get("slot_rows", []):
        if row["done"]:
            where = row["lease"] if row["kind"] in OPERATOR_KINDS else row["job"]
            fences[(where, row["slot"])].add(row["fence"])
    for (where, slot), committed in sorted(fences.items(), key=str):
        if len(committed) > 1:
            found.add(
                "safety",
                "S9 slot once",
                f"{where}: slot {slot:%H:%M:%S.%f} committed by {len(committed)} fences "
                f"{sorted(committed)}",
            )


def _backfill_windows(data: dict[str, Any], found: Findings) -> None:
    """S9 for work tracked by a watermark: a backfill slot's windows (under its row's own
    watermark) follow each other, each once, whichever attempts wrote them."""
    by_row: dict[str, list[tuple[int, datetime, datetime]]] = defaultdict(list)
    for job, fence, start, end, *lease in data["windows"]:
        if lease and lease[0] not in ("", job):
            by_row[lease[0]].append((fence, start, end))
    for row, windows in sorted(by_row.items()):
        for (f1, _, end1), (f2, start2, _) in pairwise(sorted(windows, key=lambda w: w[1])):
            if start2 != end1:
                what = "overlaps the one before" if start2 < end1 else "leaves a gap after"
                found.add(
                    "safety",
                    "S9 slot once",
                    f"{row}: window at {start2:%H:%M:%S} of fence {f2} {what} "
                    f"(ending {end1:%H:%M:%S}, fence {f1})",
                )
    data["backfill_windows"] = sum(len(w) for w in by_row.values())


# -- accounting ---------------------------------------------------------------------------------


def _slots(data: dict[str, Any], found: Findings) -> None:
    """A1: per job, every fire time from the job's first slot to its last run's slot is a
    slot with a record (run, retried, or skipped by an operator, who is named) or counted
    in a record's ``missed_slots`` (the first attempt's, for a slot tried again), and the
    next slot is the one after (or that slot's retry is pending). Runs an operator asked
    for (backfills, one-offs) are not the schedule's: :func:`_oneshots`."""
    from django_fencedjobs.registry import registry
    from soak.specs import OPERATOR_KINDS

    first_attempts: dict[str, dict[datetime, dict[str, Any]]] = defaultdict(dict)
    # A slot an operator's backfill or one-off ran before the schedule's run took it (a
    # "missing" slot just due): the schedule's run finds it recorded and skips it.
    operated: dict[str, set[datetime]] = defaultdict(set)
    for run in data["runs"]:
        if run["job"] not in data["names"]:
            continue
        if run.get("kind", "scheduled") in OPERATOR_KINDS:
            operated[run["job"]].add(run["scheduled_for"])
        else:
            first_attempts[run["job"]].setdefault(run["scheduled_for"], run)  # attempt order
    slots = coalesced = 0
    for name in data["names"]:
        schedule = registry.get(name).valid_schedule
        lease = data["leases"].get(name)
        runs = sorted(first_attempts.get(name, {}).values(), key=lambda r: r["scheduled_for"])
        if lease is None or not runs:
            found.add("accounting", "A1 slots", f"{name}: no lease row or no run at all")
            continue
        previous = lease.created_at
        for run in runs:
            times = schedule.fire_times(previous, run["scheduled_for"])
            fired = len(times)
            slots += fired
            coalesced += run["missed_slots"]
            unoperated = sum(1 for t in times[:-1] if t not in operated[name])
            if run["missed_slots"] not in (fired - 1, unoperated):
                found.add(
                    "accounting",
                    "A1 slots",
                    f"{name}: {fired} slot(s) in ({previous:%H:%M:%S}, "
                    f"{run['scheduled_for']:%H:%M:%S}], but the {run['outcome']} run for the "
                    f"last one counts {run['missed_slots']} coalesced",
                )
            previous = run["scheduled_for"]
        retry = getattr(lease, "run_slot", None) is not None and lease.run_slot == previous
        if not retry and lease.next_run_at != schedule.next_after(previous):
            found.add(
                "accounting",
                "A1 slots",
                f"{name}: next slot {lease.next_run_at:%H:%M:%S}, but the slot after the last "
                f"run's ({previous:%H:%M:%S}) is {schedule.next_after(previous):%H:%M:%S}",
            )
    data["slots"], data["coalesced"] = slots, coalesced


def _oneshots(data: dict[str, Any], found: Findings) -> None:
    """A6: every backfill slot and one-off queued was run: its target has a run of its
    kind for its slot."""
    ran = {(r["job"], r["scheduled_for"], r.get("kind")) for r in data["runs"]}
    for row in data.get("oneshots", []):
        if (target_of(row["name"]), row["run_slot"], row["kind"]) not in ran:
            found.add(
                "accounting",
                "A6 one-shots run",
                f"{row['name']}: queued, no {row['kind']} run recorded"
                f"{'' if row['paused'] else ' (still due)'}",
            )


def _retry_intervals(data: dict[str, Any], found: Findings) -> None:
    """A7: every attempt at a slot (a retry, a backfill slot's or one-off's next attempt)
    saw the data interval the slot's first attempt saw."""
    from soak.specs import OPERATOR_KINDS

    starts: dict[tuple[str, Any], dict[int, datetime]] = defaultdict(dict)
    for row in data.get("slot_rows", []):
        where = row["lease"] if row["kind"] in OPERATOR_KINDS else row["job"]
        starts[(where, row["slot"])][row["attempt"]] = row["interval_start"]
    for (where, slot), by_attempt in sorted(starts.items(), key=str):
        if len(set(by_attempt.values())) > 1:
            seen = ", ".join(f"#{a} from {t:%H:%M:%S}" for a, t in sorted(by_attempt.items()))
            found.add(
                "accounting",
                "A7 retry interval",
                f"{where}: the attempts at slot {slot:%H:%M:%S} covered different intervals: "
                f"{seen}",
            )


def _lost_to_nobody(data: dict[str, Any], found: Findings) -> None:
    """A8: a run recorded ``fence_lost`` lost its fence to someone: the change that
    superseded its fence is a takeover (another owner) or a revocation (a paused row's
    fence moved on under a holder paused past its lease: ``lease.end_orphans``), not its
    own end while the fence was still its own."""
    superseded = {
        (target_of(e["job"]), e["old_fence"]): e
        for e in data["events"]
        if e.get("op", "changed") == "changed"
    }
    for run in data["runs"]:
        if run["outcome"] != "fence_lost":
            continue
        event = superseded.get((run["job"], run["fence"]))
        if (
            event is not None
            and not event["new_owner"]
            and event["old_owner"] == run["owner"]
            and not event["paused"]
        ):
            found.add(
                "accounting",
                "A8 fence lost to nobody",
                f"{run['job']} fence {run['fence']} ({run.get('kind')} attempt "
                f"{run.get('attempt')}, {run['owner']}) recorded fence_lost, but its fence "
                f"was current until its own end at {event['at']:%H:%M:%S.%f}",
            )


def _ended_for_it(run: dict[str, Any]) -> bool:
    """An abandoned run whose end was recorded for it, under its own fence, by the package:
    a run of a job deleted or paused since (django_fencedjobs.outcomes)."""
    from django_fencedjobs import outcomes

    return run.get("error") == outcomes.ABANDONED_ORPHAN


def _fences_recorded(data: dict[str, Any], found: Findings) -> None:
    """A2: every fence change is either an acquisition, recorded as a run with that fence
    and owner, or the end of a run (owner cleared: finished, timed out, given up on), whose
    run is recorded with its outcome (a new row's first fence, set where it is created, is
    neither). A3: every write's fence is a recorded run's."""
    inits = data.get("inits", set())
    for event in data["events"]:
        row = event["job"]
        if event.get("op", "changed") != "changed" or (row, event["tick"]) in inits:
            continue
        job = target_of(row)
        if event["new_owner"]:
            run = data["run_by_fence"].get((job, event["new_fence"]))
            if run is None or run["owner"] != event["new_owner"]:
                other = f" (a run of owner {run['owner']})" if run else ""
                found.add(
                    "accounting",
                    "A2 fence history",
                    f"{row}: fence {event['new_fence']} taken by {event['new_owner']} has no "
                    f"run recorded for it{other}",
                )
        else:
            run = data["run_by_fence"].get((job, event["old_fence"]))
            if (
                run is None
                or run["outcome"] == "running"
                or (run["outcome"] == "abandoned" and not _ended_for_it(run))
            ):
                found.add(
                    "accounting",
                    "A2 fence history",
                    f"{row}: the run of fence {event['old_fence']} ended (at "
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
    for job, fence, _, end, *_ in data["windows"]:
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
    excluded = {(r["job"], r["scheduled_for"]) for r in data["runs"] if r["outcome"] == "excluded"}
    later_attempts = [r for r in data["runs"] if r["attempt"] > 1 and r["kind"] == "scheduled"]
    deferred = [r for r in later_attempts if (r["job"], r["scheduled_for"]) in excluded]
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
        runs_by_kind=dict(sorted(Counter(r.get("kind", "") for r in data["runs"]).items())),
        # A deferred slot's attempts after its first (recorded excluded) are not retries.
        retries=len(later_attempts) - len(deferred),
        deferred_runs=sum(1 for r in deferred if r["attempt"] == 2),
        excluded_records=len(excluded),
        instance_runs=sum(1 for r in data["runs"] if "[" in r["job"]),
        skipped_records=sum(1 for r in data["runs"] if r["outcome"] == "skipped"),
        lease_rows_deleted=sum(1 for e in data["events"] if e.get("op") == "deleted"),
        slot_rows=len(data.get("slot_rows", [])),
        backfill_windows=data.get("backfill_windows", 0),
        operations=dict(sorted(seen.ops.items())),
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
