"""The soak (docs/reliability.md): random faults, nobody chose by hand, and a checker that
proves from the data that none of them broke an invariant.

``test_two_minutes_of_random_faults_break_no_invariant`` runs ``scripts/soak.py`` for two
minutes of faults (SIGSTOP inside and outside transactions, SIGCONT, SIGKILL, SIGTERM,
server restarts) against three runner processes on this suite's throwaway PostgreSQL
server, in a database of its own: straight to the server, and again through PgBouncer in
transaction pooling. The seed is new each time and printed; a failure says
how to replay it (``FENCEDJOBS_SOAK_SEED=<seed>`` here, or ``make soak SOAK_SEED=<seed>``).

The other tests feed the checker made-up facts and show that it sees each kind of
violation it claims to: a checker that cannot fail proves nothing.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from soak import check
from soak.driver import Outcomes
from soak.plan import KINDS, make_plan
from soak.report import FAULT_KINDS
from tests.conftest import REPO_ROOT

SOAK_SECONDS = 120


@pytest.mark.postgres_only
@pytest.mark.throwaway_server
@pytest.mark.timeout(900)
@pytest.mark.parametrize("via", ["direct", pytest.param("pgbouncer", marks=pytest.mark.pgbouncer)])
def test_two_minutes_of_random_faults_break_no_invariant(tmp_path, via):
    """``pgbouncer``: every process of the soak reaches the server through PgBouncer in
    transaction pooling (``scripts/soak.py --pgbouncer``), which the restarts go behind."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        pytest.fail("the soak needs DATABASE_URL to name a PostgreSQL server")
    seed = int(os.environ.get("FENCEDJOBS_SOAK_SEED") or random.SystemRandom().randrange(10**6))
    print(f"soak seed {seed}")  # shown with pytest -rP, and in the failure message
    out = tmp_path / "soak.json"
    env = dict(os.environ)
    env.pop("MAKELEVEL", None)
    env.pop("DJANGO_SETTINGS_MODULE", None)  # the soak uses soak.settings
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    argv = [sys.executable, "scripts/soak.py", "--seconds", str(SOAK_SECONDS), "--seed", str(seed)]
    if via == "pgbouncer":
        from tests.faults.harness import pgbouncer_url

        pgbouncer_url()  # fails here, saying why, when there is no PgBouncer
        argv.append("--pgbouncer")
    try:
        proc = subprocess.run(
            [*argv, "--dir", str(tmp_path / "soak"), "--json", str(out)],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=840,
            check=False,
        )
    finally:
        # The server restarted under this process's connections too.
        from django.db import connections

        connections.close_all()
    target = "soak-pgbouncer" if via == "pgbouncer" else "soak"
    replay = (
        f"replay: FENCEDJOBS_SOAK_SEED={seed}, or make {target} SOAK_SECONDS=120 SOAK_SEED={seed}"
    )
    output = f"{replay}\n{proc.stdout[-8000:]}\n{proc.stderr[-4000:]}"
    assert out.exists(), output
    report = json.loads(out.read_text())
    assert report["violations"] == {"safety": 0, "accounting": 0, "liveness": 0}, output
    assert proc.returncode == 0, output
    missing = [kind for kind in FAULT_KINDS if not report["injected"][kind]]
    assert not missing, f"no fault of kind {missing} was injected\n{output}"
    # Not vacuous: the jobs did their work under the faults, and runs were taken over.
    figures = report["figures"]
    assert figures["items_done"] > 100 and all(n > 20 for n in figures["windows"].values())
    assert figures["takeovers"] > 0, output
    # The operations ran under the faults: instances' runs, a row deleted (and created
    # again), backfill runs, one-offs, retries, skipped slots and slots a calendar excluded.
    kinds = figures["runs_by_kind"]
    assert figures["instance_runs"] > 0 and figures["lease_rows_deleted"] > 0, output
    assert kinds.get("backfill") and kinds.get("once") and figures["retries"] > 0, output
    assert figures["skipped_records"] > 0, output
    assert figures["excluded_records"] > 0, output  # soak.retrying's calendar


# -- the plan ---------------------------------------------------------------------------------


def test_a_seed_gives_the_same_plan_and_another_seed_another():
    assert make_plan(7, 120, 40) == make_plan(7, 120, 40)
    assert make_plan(7, 120, 40).digest == make_plan(7, 120, 40).digest
    assert make_plan(8, 120, 40).digest != make_plan(7, 120, 40).digest
    assert make_plan(7, 120, 40).digest == make_plan(7, 120.0, 40.0).digest


@pytest.mark.parametrize("seed", range(20))
def test_every_kind_of_fault_is_planned_in_two_minutes(seed):
    counts = make_plan(seed, SOAK_SECONDS, 40).counts()
    assert all(counts[kind] > 0 for kind in KINDS), counts


def test_every_two_minute_plan_backfills_all_slots_of_a_window_at_least_once():
    # Seed 72463 planned three backfills of the missing slots only: with none missing, the
    # soak ran no backfill, and the test above found it vacuous.
    for seed in [72463, *range(200)]:
        ops = make_plan(seed, SOAK_SECONDS, 40).ops
        backfills = [op for op in ops if op.kind == "backfill"]
        assert any(op.selection == "all" and op.span >= 6 for op in backfills), (seed, backfills)


# -- the checker, on made-up facts -------------------------------------------------------------

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
JOB = "soak.windows"


def event(old: int, new: int, tick: int, owner: str = "A1:1") -> dict:
    return {
        "job": JOB,
        "old_fence": old,
        "new_fence": new,
        "old_owner": "",
        "new_owner": owner,
        "tick": tick,
        "at": T0,
    }


def write(fence: int, tick: int, key: str = "k") -> dict:
    return {"job": JOB, "fence": fence, "kind": "window", "key": key, "tick": tick, "at": T0}


def stale_writes(events: list[dict], audits: list[dict]) -> list[str]:
    found = check.Findings()
    data = {"names": [JOB], "events": events, "audits": audits}
    check._stale_writes(data, check._fence_history(data, found), found)
    return [v.detail for v in found.violations if v.invariant == "S1 stale write"]


def test_a_write_while_its_fence_is_current_is_not_stale():
    # Fence 1 taken at tick 1, ended at tick 4; fence 2 taken at tick 5.
    events = [event(0, 1, 1), event(1, 2, 4, owner=""), event(2, 3, 5)]
    assert stale_writes(events, [write(1, 2), write(1, 3), write(3, 6)]) == []


def test_a_write_committed_after_its_fence_was_superseded_is_stale():
    events = [event(0, 1, 1), event(1, 2, 3)]  # fence 2 took over at tick 3
    (found,) = stale_writes(events, [write(1, 2), write(1, 4), write(2, 5)])
    assert "of fence 1 committed at tick 4" in found and "superseded at tick 3" in found


def test_a_write_of_an_older_fence_after_a_newer_one_breaks_the_fence_order():
    found = check.Findings()
    check._fence_order({"audits": [write(2, 1), write(3, 2), write(2, 3)]}, found)
    assert [v.invariant for v in found.violations] == ["S1 fence order"]


def test_a_write_under_a_fence_never_issued_is_stale():
    (found,) = stale_writes([event(0, 1, 1)], [write(2, 2)])
    assert "never current" in found


def windows_findings(rows: list[tuple[int, datetime, datetime]], watermark: datetime) -> list[str]:
    found = check.Findings()
    data = {
        "windows": [(JOB, fence, start, end) for fence, start, end in rows],
        "origin": T0,
        "run_by_fence": {},
        "watermarks": {(JOB, ""): watermark, ("soak.windows_keyed", "k"): None},
    }
    check._windows(data, found)
    return [v.detail for v in found.violations]


def test_windows_that_tile_from_the_origin_to_the_watermark_pass():
    s = timedelta(seconds=1)
    rows = [(1, T0, T0 + s), (1, T0 + s, T0 + 2 * s), (2, T0 + 2 * s, T0 + 3 * s)]
    assert windows_findings(rows, T0 + 3 * s) == []


def test_a_window_done_twice_a_gap_and_a_watermark_past_the_windows_are_seen():
    s = timedelta(seconds=1)
    twice = [(1, T0, T0 + s), (2, T0, T0 + s)]
    assert any("overlaps" in f for f in windows_findings(twice, T0 + s))
    gap = [(1, T0, T0 + s), (2, T0 + 2 * s, T0 + 3 * s)]
    assert any("gap" in f for f in windows_findings(gap, T0 + 3 * s))
    assert any("watermark" in f for f in windows_findings([(1, T0, T0 + s)], T0 + 2 * s))


def test_an_item_done_twice_or_lost_is_seen():
    found = check.Findings()
    seen = Outcomes(items_created=[1, 2, 3, 4])
    data = {
        "items": [(1, T0, 5), (2, T0, 5), (3, None, None)],  # 4 is gone
        "item_logs": [(1, "soak.items", 5), (1, "soak.items", 6)],  # 1 twice, 2 never
    }
    check._items(data, seen, found)
    details = " | ".join(v.detail for v in found.violations)
    assert "item 1 done 2 times" in details
    assert "item 2 marked done (fence 5), never processed" in details
    assert "item 4 was created and is gone" in details
    assert "item 3" not in details


def test_a_forked_counter_chain_is_seen():
    found = check.Findings()
    check._chain({"slow": [("soak.slow", 1, 1), ("soak.slow", 1, 2), ("soak.slow", 2, 2)]}, found)
    assert [v.detail for v in found.violations] == ["soak.slow: seq 2 written 2 times"]


# -- the new operations: instances, one-shots, retries, skips ----------------------------------

INST = "soak.inst[k0]"


def lease_event(
    row: str, op: str, old: int, new: int, tick: int, old_owner="", new_owner="", paused=False
):
    return {
        "job": row,
        "op": op,
        "old_fence": old,
        "new_fence": new,
        "old_owner": old_owner,
        "new_owner": new_owner,
        "paused": paused,
        "tick": tick,
        "at": T0,
    }


def run_record(job: str, fence: int, slot: datetime, **fields) -> dict:
    record = {
        "job": job,
        "fence": fence,
        "scheduled_for": slot,
        "attempt": 1,
        "kind": "scheduled",
        "outcome": "succeeded",
        "owner": "A1:1",
    }
    return {**record, **fields}


def invariants(check_function, data: dict) -> list[str]:
    found = check.Findings()
    check_function({"events": [], "runs": [], **data}, found)
    return [f"{v.invariant}: {v.detail}" for v in found.violations]


def test_a_fence_given_out_again_by_a_re_created_row_is_seen_once_per_source():
    # The instance's row is deleted and created again; the new row starts at 0 again and
    # gives out fence 1 a second time; two runs hold it, and both acknowledged writes.
    events = [
        lease_event(INST, "created", 0, 0, 1),
        lease_event(INST, "changed", 0, 1, 2, new_owner="A1:1"),
        lease_event(INST, "deleted", 1, 1, 3, old_owner="A1:1"),
        lease_event(INST, "created", 0, 0, 4),
        lease_event(INST, "changed", 0, 1, 5, new_owner="B1:2"),
    ]
    runs = [
        run_record(INST, 1, T0, outcome="fence_lost"),
        run_record(INST, 1, T0 + timedelta(seconds=4), owner="B1:2"),
    ]
    acks = {(INST, 1): {f"{INST}|{T0.isoformat()}|1", f"{INST}|later|1"}}
    found = invariants(check._repeated_fences, {"events": events, "runs": runs, "ack_runs": acks})
    assert [f.split(":")[0] for f in found] == ["S8 fence repeated"] * 3, found


def test_fences_that_start_above_the_deleted_rows_repeat_nothing():
    epoch = 2**32
    events = [
        lease_event(INST, "created", 0, 0, 1),
        lease_event(INST, "changed", 0, epoch, 2),  # the row's first fence: its id's epoch
        lease_event(INST, "changed", epoch, epoch + 1, 3, new_owner="A1:1"),
        lease_event(INST, "deleted", epoch + 1, epoch + 1, 4, old_owner="A1:1"),
        lease_event(INST, "created", 0, 0, 5),
        lease_event(INST, "changed", 0, 2 * epoch, 6),
        lease_event(INST, "changed", 2 * epoch, 2 * epoch + 1, 7, new_owner="B1:2"),
    ]
    runs = [run_record(INST, epoch + 1, T0), run_record(INST, 2 * epoch + 1, T0, owner="B1:2")]
    data = {"events": events, "runs": runs, "run_by_fence": {}, "audits": []}
    assert invariants(check._repeated_fences, data) == []
    found = check.Findings()
    check._fence_history(data, found)
    data["run_by_fence"] = {(r["job"], r["fence"]): r for r in runs}
    check._fences_recorded(data, found)
    assert found.violations == []  # the rows' first fences are no run's end


def test_a_write_committed_after_its_row_was_deleted_is_stale():
    events = [
        lease_event(INST, "created", 0, 0, 1),
        lease_event(INST, "changed", 0, 1, 2, new_owner="A1:1"),
        lease_event(INST, "deleted", 1, 1, 4, old_owner="A1:1"),
    ]
    audits = [
        {"job": INST, "lease": INST, "fence": 1, "kind": "slot", "key": "a", "tick": 3, "at": T0},
        {"job": INST, "lease": INST, "fence": 1, "kind": "slot", "key": "b", "tick": 5, "at": T0},
    ]
    data = {"names": [], "events": events, "audits": audits}
    found = check.Findings()
    check._stale_writes(data, check._fence_history(data, found), found)
    (stale,) = [v.detail for v in found.violations]
    assert "slot b of fence 1 committed at tick 5" in stale and "deleted with its row" in stale


def slot_row(lease: str, fence: int, slot: datetime, **fields) -> dict:
    row = {
        "job": check.target_of(lease),
        "lease": lease,
        "fence": fence,
        "kind": "scheduled",
        "slot": slot,
        "attempt": 1,
        "interval_start": slot - timedelta(seconds=4),
        "done": True,
    }
    return {**row, **fields}


def test_a_one_off_or_a_scheduled_slot_committed_twice_is_seen():
    once = f"soak.retrying@once:{T0.isoformat()}"
    rows = [
        slot_row(once, 10, T0, kind="once"),
        slot_row(once, 12, T0, kind="once", attempt=2),  # the one-off's work, again
        slot_row("soak.retrying", 3, T0, attempt=1, done=False),  # failed: not done
        slot_row("soak.retrying", 5, T0, attempt=2),
        slot_row("soak.retrying", 7, T0 + timedelta(seconds=4)),
        slot_row("soak.retrying", 9, T0 + timedelta(seconds=4), attempt=2),  # twice
    ]
    found = invariants(check._slot_once, {"slot_rows": rows})
    assert len(found) == 2 and all(f.startswith("S9 slot once") for f in found), found
    assert "fences [10, 12]" in found[0] + found[1] and "fences [7, 9]" in found[0] + found[1]


def test_backfill_windows_done_twice_are_seen_and_resumed_ones_are_not():
    row = f"soak.windows@backfill:{T0.isoformat()}"
    s = timedelta(seconds=1)
    resumed = [("soak.windows", 5, T0, T0 + s, row), ("soak.windows", 7, T0 + s, T0 + 2 * s, row)]
    assert invariants(check._backfill_windows, {"windows": resumed}) == []
    twice = [*resumed, ("soak.windows", 9, T0 + s, T0 + 2 * s, row)]
    (found,) = invariants(check._backfill_windows, {"windows": twice})
    assert "overlaps" in found


def test_a_retry_that_covers_another_interval_is_seen():
    rows = [
        slot_row("soak.retrying", 3, T0, done=False, interval_start=T0 - timedelta(seconds=8)),
        slot_row("soak.retrying", 5, T0, attempt=2, interval_start=T0 - timedelta(seconds=4)),
    ]
    (found,) = invariants(check._retry_intervals, {"slot_rows": rows})
    assert found.startswith("A7 retry interval")


def test_a_fence_lost_that_nobody_took_is_seen():
    row = f"soak.retrying@once:{T0.isoformat()}"
    events = [
        lease_event(row, "changed", 4, 5, 1, new_owner="A1:1"),
        lease_event(row, "changed", 5, 6, 2, old_owner="A1:1"),  # its own end
        lease_event(row, "changed", 6, 7, 3, new_owner="A1:1"),
        lease_event(row, "changed", 7, 8, 4, old_owner="A1:1", new_owner="B1:2"),  # taken
    ]
    runs = [
        run_record("soak.retrying", 5, T0, kind="once", outcome="fence_lost"),
        run_record("soak.retrying", 7, T0, kind="once", attempt=2, outcome="fence_lost"),
    ]
    (found,) = invariants(check._lost_to_nobody, {"events": events, "runs": runs})
    assert "fence 5" in found and found.startswith("A8")


def test_a_fence_lost_to_the_revocation_of_a_disabled_instance_is_not_lost_to_nobody():
    # The holder was paused past its lease; the instance was disabled meanwhile, and the
    # runner's sweep (lease.end_orphans) moved the paused row's fence on, clearing its owner.
    # The holder resumed, found its fence gone and recorded fence_lost: it lost it to that.
    events = [
        lease_event(INST, "changed", 4, 5, 1, new_owner="A1:1"),
        lease_event(INST, "changed", 5, 6, 2, old_owner="A1:1", paused=True),
    ]
    runs = [run_record(INST, 5, T0, outcome="fence_lost")]
    assert invariants(check._lost_to_nobody, {"events": events, "runs": runs}) == []


@pytest.mark.parametrize("seed", range(20))
def test_every_kind_of_operation_is_planned_in_two_minutes(seed):
    from soak.plan import OP_KINDS

    counts = make_plan(seed, SOAK_SECONDS, 40).op_counts()
    assert all(counts[kind] > 0 for kind in OP_KINDS), counts
