"""P15: how soon ``overlap="buffer_one"`` runs a slot that came during a run, once it ends.

A slot can come while a run of its job is still going even though its timeout is shorter
than the interval (fencedjobs.E004): a retry, or a run that started late, goes past the
next slot. ``loop.loop()`` in this process, with the database clock and the default
``LOOP_MAX_SLEEP``, runs one job every 5 seconds (timeout 4.9 s) whose first attempt fails
at once; its retry, 0.5 s later, works until 0.2 s past the next slot, then writes one row
in a fenced transaction. That slot is buffered: it runs when the retry ends. The loop
stops after the wanted number of slots; every instant comes from the ``JobRun`` rows (all
the database's).

- **The buffered slot's wait**: its run's ``started_at`` minus the end (``finished_at``)
  of the retry it waited for. Goal: p99 ≤ 1 s.
- **The floor, side by side**: how late the same loop starts a run that is due while it
  is idle, measured on the retries of the same runs: ``started_at`` minus the instant the
  retry was due (its attempt's end plus the backoff). A buffered slot cannot start sooner
  than an idle loop wakes.
"""

from __future__ import annotations

import itertools
import time
from datetime import timedelta
from typing import Any

from bench import common

PREFIX = "bench.p15."
BACKOFF = timedelta(seconds=0.5)


def measure(smoke: bool) -> common.Report:
    from bench.benchapp.models import Row
    from django_fencedjobs import fenced_atomic, job
    from django_fencedjobs.models import JobRun, Outcome

    every = timedelta(seconds=2 if smoke else 5)
    past_the_next_slot = timedelta(seconds=0.2)
    wanted = 3 if smoke else 40  # slots whose retry ended
    limit = 60.0 if smoke else 400.0
    name = f"{PREFIX}retrying"

    common.clear_jobs(PREFIX)
    ended: list[int] = []

    def done(record: JobRun) -> bool:
        if record.job == name and record.attempt == 2:
            ended.append(record.pk)
        return len(ended) > wanted  # the last one's buffered slot has started by now

    def handler(run: Any) -> None:
        if run.attempt == 1:
            raise RuntimeError("the first attempt fails; its retry runs into the next slot")
        # Until just past the next slot (the database's instants), then one fenced write.
        end = run.scheduled_for + every + past_the_next_slot
        time.sleep(max(0.0, (end - run.now).total_seconds()))
        with fenced_atomic():
            Row.objects.create(seq=run.fence, note="p15")

    def declare() -> None:
        job(
            every=every,
            name=name,
            timeout=every - timedelta(seconds=0.1),  # shorter than the interval: E004
            retries=1,
            retry_backoff=BACKOFF,
        )(handler)

    common.loop_until(declare, done, seconds=limit)

    runs = {
        (slot, attempt): (started, finished, outcome, missed)
        for slot, attempt, started, finished, outcome, missed in JobRun.objects.filter(
            job=name
        ).values_list(
            "scheduled_for", "attempt", "started_at", "finished_at", "outcome", "missed_slots"
        )
    }
    slots = sorted({slot for slot, _ in runs})
    waits, floor, buffered, wrong = [], [], 0, []
    for slot, following in itertools.pairwise(slots):
        first, retry, nxt = runs.get((slot, 1)), runs.get((slot, 2)), runs.get((following, 1))
        if first is None or retry is None or nxt is None or retry[1] is None:
            continue
        if retry[2] != Outcome.SUCCEEDED or nxt[3]:
            wrong.append(f"{slot:%H:%M:%S}: retry {retry[2]}, next slot coalesced {nxt[3]}")
        floor.append((retry[0] - (first[1] + BACKOFF)).total_seconds())
        if retry[1] > following:  # the next slot came while the retry ran: buffered
            buffered += 1
            waits.append((nxt[0] - retry[1]).total_seconds())

    report = common.Report("P15", 'overlap="buffer_one": a buffered slot runs when the run ends')
    report.add(
        f"`loop.loop()` with the database clock and the default `LOOP_MAX_SLEEP`; one job "
        f"every {every.total_seconds():g} s (timeout {every.total_seconds() - 0.1:g} s), its "
        f"first attempt failing, its retry ({BACKOFF.total_seconds():g} s later) working "
        f"until {past_the_next_slot.total_seconds():g} s past the next slot; instants from "
        "the `JobRun` rows."
    )
    report.add("")
    rows = []
    for label, values in (
        ("buffered slot: its start after the run's end", waits),
        ("floor: a due retry's start after it was due (idle loop)", floor),
    ):
        if values:
            rows.append(
                [
                    label,
                    len(values),
                    f"{common.percentile(values, 50) * 1000:.1f} ms",
                    f"{common.percentile(values, 99) * 1000:.1f} ms",
                    f"{max(values) * 1000:.1f} ms",
                ]
            )
    for line in common.table(["", "runs", "p50", "p99", "max"], rows):
        report.add(line)
    if wrong:
        report.add("")
        report.add("Not as planned: " + "; ".join(wrong[:5]))
    p99 = common.percentile(waits, 99) if waits else float("inf")
    floor99 = common.percentile(floor, 99) if floor else float("nan")
    report.figures.update(p99=p99, floor_p99=floor99, buffered=buffered)
    report.goal("slots buffered and measured", f"≥ {wanted}", str(buffered), buffered >= wanted)
    planned = "all" if not wrong else f"{len(wrong)} not"
    report.goal("runs as planned (retry succeeded, nothing coalesced)", "all", planned, not wrong)
    report.goal(
        "buffered slot's start after the run's end, p99",
        "≤ 1 s",
        f"{p99 * 1000:.1f} ms (floor {floor99 * 1000:.1f} ms)",
        p99 <= 1.0,
    )
    return report


if __name__ == "__main__":
    raise SystemExit(common.main(measure))
