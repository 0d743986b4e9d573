"""Fault: a lease holder paused past its TTL (a GC pause, a VM suspend; here SIGSTOP) resumes
after another worker took the job over, and goes on writing.

Why it matters: this is the failure a time-only lease cannot prevent. The paused worker
believes it still holds the lock; only a fence checked in the writing transaction, under a
lock on the lease row, turns its next write into ``FenceLost`` instead of a second writer.

Worker A writes rows through ``fenced_atomic`` and reports each one after its commit; it is
SIGSTOPped, its lease runs out, worker B acquires and writes, A is SIGCONTed. Checked: A's
writes stop (FenceLost), no row of A's fence was committed after B took over, and every
write either worker acknowledged is in the database.
"""

from __future__ import annotations

import pytest
from django.db import connection

from django_fencedjobs.models import Outcome
from tests.faults.harness import (
    make_due,
    prepare,
    runs,
    stop_outside_transactions,
    wait_lease_expired,
)
from tests.faults.jobs import PAUSED_WRITER
from tests.testapp.models import Write

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 5


def rows_by_fence() -> dict[int, dict[int, int]]:
    """``{fence: {row id: seq}}`` of every committed write of the job."""
    found: dict[int, dict[int, int]] = {}
    for pk, fence, seq in Write.objects.filter(job=PAUSED_WRITER).values_list("id", "fence", "seq"):
        found.setdefault(fence, {})[pk] = seq
    return found


def acked(worker) -> dict[int, int]:
    return {event["id"]: event["seq"] for event in worker.events("ack")}


def committed_after_snapshot(fence: int, snapshot: str) -> list[int]:
    """PostgreSQL: ids of rows of ``fence`` whose inserting transaction had not committed
    when ``snapshot`` was taken (B took it right after its acquisition committed)."""
    table = connection.ops.quote_name(Write._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_xact_id()::text::bigint >> 32")
        (epoch,) = cursor.fetchone()
        cursor.execute(
            f"SELECT id FROM {table} WHERE fence = %s AND NOT pg_visible_in_snapshot("
            "(((%s::bigint << 32) + xmin::text::bigint))::text::xid8, %s::pg_snapshot)",
            [fence, epoch, snapshot],
        )
        return [row[0] for row in cursor.fetchall()]


def before_pause(a) -> dict[int, int]:
    """The writes A had acknowledged when it reached its pause point."""
    (pause,) = a.events("pause_point")
    return {pk: seq for pk, seq in acked(a).items() if seq <= pause["seq"]}


def check_no_write_after_takeover(a, b, *, a_writes: int | None) -> None:
    """``a_writes``: how many rows A committed, all before its pause, when B had taken over
    before A resumed; None when A may still have committed writes between resuming and
    the takeover (its fence was still current then)."""
    fence_a = a.events("pause_point")[0]["fence"]
    fence_b = b.events("ack")[0]["fence"]
    assert fence_b > fence_a
    rows = rows_by_fence()
    assert set(rows) == {fence_a, fence_b}, rows
    # Every write either worker acknowledged is in the database, as acknowledged.
    for worker, fence in ((a, fence_a), (b, fence_b)):
        assert acked(worker).items() <= rows[fence].items(), worker.label
    # No row of A's fence committed after B took over: on PostgreSQL, every one had committed
    # when B's acquisition had (B's snapshot, taken right after it)...
    if connection.vendor == "postgresql":
        (snapshot,) = b.events("snapshot")
        assert snapshot["fence"] == fence_b
        late = committed_after_snapshot(fence_a, snapshot["snapshot"])
        assert late == [], f"rows {late} of the paused holder's fence committed after the takeover"
    # ...and (both databases) every row of A precedes B's first row...
    first_b = min(rows[fence_b])
    late = sorted(pk for pk in rows[fence_a] if pk > first_b)
    assert late == [], (
        f"the paused holder committed {len(late)} row(s) after the takeover "
        f"(ids {late[:5]}...; the successor's first row is {first_b})"
    )
    if a_writes is not None:
        # ...and A committed exactly what it had written before it was stopped, nothing after.
        assert rows[fence_a] == before_pause(a), (
            "the paused holder committed a write after it resumed"
        )
        assert len(rows[fence_a]) == a_writes
    # A learned that it lost the lease: it reports FenceLost, and records the run so.
    assert a.events("fence_lost"), a.log()
    run_a, run_b = runs(PAUSED_WRITER)
    assert (run_a.fence, run_a.outcome) == (fence_a, Outcome.FENCE_LOST), run_a.error
    assert (run_b.fence, run_b.outcome) == (fence_b, Outcome.SUCCEEDED), run_b.error


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_paused_holder_write_is_rejected(spawn, round_):
    prepare(PAUSED_WRITER)
    a = spawn("once", PAUSED_WRITER, "A", role="A", pause_after=3)
    b = spawn("once", PAUSED_WRITER, "B", wait_go=True, role="B")
    a.wait_for("pause_point")
    stop_outside_transactions(a)
    a.touch("resume-A")  # seen as soon as A runs again
    wait_lease_expired(PAUSED_WRITER, diagnostics=spawn.logs)
    make_due(PAUSED_WRITER)
    b.wait_for("ready")
    b.send("go")
    b.wait_for("ack", count=3)
    a.cont()
    assert a.wait_exit() == 0, a.log()
    b.touch("stop-B")
    assert b.wait_exit() == 0, b.log()
    assert b.events("done"), b.log()
    check_no_write_after_takeover(a, b, a_writes=3)
