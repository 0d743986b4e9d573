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
