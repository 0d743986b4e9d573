"""The soak's jobs, written as an application would write them, against the public API only
(``job``, ``fenced_atomic``, ``Run``: ``run.windows``, ``run.batches``,
``run.advance_watermark``, ``run.add_items``).

Short schedules (every 2 to 5 s), short leases (1 to 3 s) and short timeouts, so that under
faults many runs are taken over, time out or lose their fence.

* ``soak.windows``: watermark windows of 1 s, one :class:`WindowRow` per window, the
  watermark advanced in the same fenced block; now and then it sleeps inside the block.
* ``soak.windows_keyed``: the same with 2 s windows and a keyed watermark (``key="k"``).
* ``soak.items``: per-item batches (``run.batches``), marking items done, one
  :class:`ItemLog` per item; now and then it sleeps inside a batch.
* ``soak.slow``: a counter chain in 1 to 3 fenced blocks; sleeps outside and inside them,
  past its lease's renewal period and sometimes past its timeout.
* ``soak.failing``: writes, then often raises: after its write, or inside a fenced block
  (whose row must never commit), or inside a block whose error it catches and goes on.
* ``soak.retrying`` (``retries=2``): an attempt's fenced block writes a :class:`SlotRow`
  for its slot (with the data interval its handler sees); a failing attempt writes one
  that is not done, then raises, and the next attempt runs through the lease. The plan's
  operator skips and one-offs are of this job, and half its backfills. It avoids the
  calendar ``soak-quiet`` (the first seconds of every minute) with ``defer_excluded``, so
  that some of its slots are recorded excluded and others run deferred, as next attempts.
* ``soak.inst`` (``instances=True``): the plan creates, edits (schedule and arguments),
  disables, enables, deletes and re-creates its instances; each run writes a
  :class:`SlotRow` with its arguments' generation, and sometimes sleeps inside the block.

A backfill run of ``soak.windows`` tiles its slot's interval with windows under the slot
row's own watermark (``WindowRow.lease`` names that row); a backfill run or one-off of
``soak.retrying`` writes its slot's row once.

Every unit of work also inserts one :class:`Audit` row in its transaction; after the commit
the handler appends an *ack* line (``<dir>/acks/<pid>.jsonl``: one ``write(2)`` per line):
the checker proves that every acknowledged commit is in the database.

What a run does (sleep lengths, batch sizes, whether it fails) is drawn from
``random.Random("<seed>:<job>:<slot>")``: the same seed gives each slot the same behaviour.

The driver controls the jobs through the environment of the runner processes
(``SOAK_SEED``, ``SOAK_DIR``, ``SOAK_ORIGIN``) and one file: once ``<dir>/calm`` exists (the
faults are over), the handlers stop misbehaving on purpose, except ``soak.failing``, which
keeps failing as designed, and the driver measures how quickly every job is back to
regular runs.
"""

from __future__ import annotations

import functools
import json
import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from django.db.models import Max

from django_fencedjobs import Run, fenced_atomic, job
from soak.soakapp.models import Audit, FailRow, Item, ItemLog, SlotRow, SlowRow, WindowRow
from soak.specs import (
    FAILING,
    INSTANCE_SPEC,
    INSTANCES,
    ITEMS,
    QUIET,
    RETRY_BACKOFF,
    RETRYING,
    SLOW,
    SPECS,
    WINDOW_STEPS,
    WINDOWS,
    WINDOWS_KEYED,
)

# -- what the driver tells the jobs -------------------------------------------------------------


def lease_of(run: Run) -> str:
    """The lease row the run holds: the job's own, an instance's, or a backfill slot's or
    one-off's row."""
    return str(getattr(run, "lease_name", run.job.name))


def _dir() -> str:
    return os.environ.get("SOAK_DIR", "")


def origin() -> datetime:
    """Where the windows jobs start (their first window's start), set by the driver."""
    value = os.environ.get("SOAK_ORIGIN")
    if not value:
        return datetime(2026, 1, 1, tzinfo=UTC)
    return datetime.fromisoformat(value)


def calm() -> bool:
    """True once the faults are over."""
    return bool(_dir()) and os.path.exists(os.path.join(_dir(), "calm"))


def behaviour(run: Run) -> random.Random:
    """The run's random choices: a function of the seed, the job and the slot."""
    seed = os.environ.get("SOAK_SEED", "0")
    return random.Random(f"{seed}:{run.job.name}:{run.scheduled_for.isoformat()}")


def ack(run: Run, kind: str, key: str) -> None:
    """Record, after the commit, that this unit of work was acknowledged as committed."""
    if not _dir():
        return
    line = json.dumps(
        {
            "job": run.job.name,
            "lease": lease_of(run),
            "fence": run.fence,
            "kind": kind,
            "key": key,
            # Which run: two runs of one name acknowledging one fence is a fence repeated.
            "run": f"{lease_of(run)}|{run.scheduled_for.isoformat()}|{run.attempt}",
        }
    )
    fd = os.open(
        os.path.join(_dir(), "acks", f"{os.getpid()}.jsonl"),
        os.O_WRONLY | os.O_APPEND | os.O_CREAT,
        0o644,
    )
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@contextmanager
def marked(where: str) -> Iterator[None]:
    """Mark this process, for the driver's aimed faults: ``<dir>/busy/<pid>`` while a
    handler runs, ``<dir>/inside/<pid>`` while it sleeps inside a fenced transaction."""
    path = os.path.join(_dir(), where, str(os.getpid())) if _dir() else ""
    if path:
        with open(path, "w"):
            pass
    try:
        yield
    finally:
        if path:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def sleep_inside(seconds: float) -> None:
    if seconds > 0:
        with marked("inside"):
            time.sleep(seconds)


def audit(run: Run, kind: str, key: str) -> None:
    Audit.objects.create(job=run.job.name, lease=lease_of(run), fence=run.fence, kind=kind, key=key)


# -- the jobs -----------------------------------------------------------------------------------


def _windows(run: Run) -> None:
    step, key = WINDOW_STEPS[run.job.name]
    rng = behaviour(run)
    quiet = calm()
    stall = -1 if quiet or rng.random() < 0.7 else rng.randrange(4)
    stall_for = rng.uniform(0.3, 1.5)
    for index, window in enumerate(run.windows(step, start=origin(), key=key)):
        with fenced_atomic():
            WindowRow.objects.create(
                job=run.job.name,
                lease=lease_of(run),
                fence=run.fence,
                start=window.start,
                end=window.end,
            )
            run.advance_watermark(window.end, key=key)
            run.add_items(1)
            if index == stall:
                sleep_inside(stall_for)
            audit(run, "window", window.start.isoformat())
        ack(run, "window", window.start.isoformat())


def windows(run: Run) -> None:
    _windows(run)


def windows_keyed(run: Run) -> None:
    _windows(run)


def items(run: Run) -> None:
    rng = behaviour(run)
    size = rng.randint(1, 8)
    stall = -1 if calm() or rng.random() < 0.75 else rng.randrange(3)
    stall_for = rng.uniform(0.2, 1.0)
    pending = Item.objects.filter(done_at=None).order_by("id")
    committed: list[int] = []
    for index, batch in enumerate(run.batches(pending, size=size)):
        # Asking for this batch committed the previous one.
        for pk in committed:
            ack(run, "item", str(pk))
        done_at = datetime.now(UTC)
        for item in batch:
            item.done_at = done_at
            item.done_fence = run.fence
        Item.objects.bulk_update(batch, ["done_at", "done_fence"])
        ItemLog.objects.bulk_create(
            [ItemLog(item_id=item.pk, job=run.job.name, fence=run.fence) for item in batch]
        )
        Audit.objects.bulk_create(
            [
                Audit(
                    job=run.job.name,
                    lease=lease_of(run),
                    fence=run.fence,
                    kind="item",
                    key=str(i.pk),
                )
                for i in batch
            ]
        )
        run.add_items(len(batch))
        if index == stall:
            sleep_inside(stall_for)
        committed = [item.pk for item in batch]
    for pk in committed:  # the loop ended: the last batch committed
        ack(run, "item", str(pk))


def slow(run: Run) -> None:
    rng = behaviour(run)
    quiet = calm()
    blocks = rng.randint(1, 3)
    if quiet:
        outside, inside = rng.uniform(0, 0.6), rng.uniform(0, 0.4)
    else:
        outside = rng.choice([0.0, 0.0, 0.2, 0.5, 1.0, 2.0, 3.5])
        inside = rng.choice([0.0, 0.0, 0.1, 0.5, 1.0, 2.0])
    # Half the time, the shape of a handler that logs and carries on: `except Exception`
    # (which must not swallow the end of the run).
    sloppy = not quiet and rng.random() < 0.5
    for _ in range(blocks):
        try:
            time.sleep(outside / blocks)
        except Exception:
            if not sloppy:
                raise
        with fenced_atomic():
            top = SlowRow.objects.filter(job=run.job.name).aggregate(top=Max("seq"))["top"]
            seq = (top or 0) + 1
            SlowRow.objects.create(job=run.job.name, fence=run.fence, seq=seq)
            try:
                sleep_inside(inside / blocks)
            except Exception:
                if not sloppy:
                    raise
            audit(run, "slow", str(seq))
        ack(run, "slow", str(seq))


class Deliberate(RuntimeError):
    """soak.failing fails on purpose."""


def failing(run: Run) -> None:
    mode = behaviour(run).choice(["ok", "raise_after", "raise_inside", "swallow"])
    with fenced_atomic():
        FailRow.objects.create(job=run.job.name, fence=run.fence)
        audit(run, "fail", "ok")
    ack(run, "fail", "ok")
    if mode == "raise_after":
        raise Deliberate("raised after a committed write")
    if mode in ("raise_inside", "swallow"):
        try:
            with fenced_atomic():
                FailRow.objects.create(job=run.job.name, fence=run.fence, doomed=True)
                audit(run, "doomed", "doomed")
                raise Deliberate("raised inside a fenced block: its writes roll back")
        except Deliberate:
            if mode == "raise_inside":
                raise
        # "swallow": the handler caught its own error and goes on.
        with fenced_atomic():
            FailRow.objects.create(job=run.job.name, fence=run.fence)
            audit(run, "fail", "ok")
        ack(run, "fail", "ok")


def slot_row(run: Run, *, done: bool, gen: int = 0, stall: float = 0.0) -> None:
    """One fenced block: the attempt's :class:`SlotRow` and its audit row; its ack after."""
    key = f"{run.scheduled_for.isoformat()}#{run.attempt}"
    with fenced_atomic():
        SlotRow.objects.create(
            job=run.job.name,
            lease=lease_of(run),
            fence=run.fence,
            kind=str(getattr(run, "kind", "scheduled")),
            slot=run.scheduled_for,
            attempt=run.attempt,
            interval_start=run.interval.start,
            done=done,
            gen=gen,
        )
        sleep_inside(stall)
        audit(run, "slot" if done else "attempt", key)
    ack(run, "slot" if done else "attempt", key)


def retrying(run: Run) -> None:
    """Fails (after writing a row that is not done) on about half its first attempts and
    a third of its second ones; a third attempt, the last, succeeds."""
    rng = random.Random(f"{behaviour(run).random()}:{run.attempt}")
    fails = {1: 0.5, 2: 0.35}.get(run.attempt, 0.0)
    if rng.random() < fails:
        slot_row(run, done=False)
        raise Deliberate(f"attempt {run.attempt} fails on purpose")
    slot_row(run, done=True)


def instance(run: Run, *, gen: int = 0, tag: str = "") -> None:
    """An instance's run: its slot's row, with its arguments' generation; now and then a
    sleep inside the block (so that runs are stopped holding the row's lock)."""
    rng = behaviour(run)
    stall = 0.0 if calm() or rng.random() < 0.7 else rng.uniform(0.3, 1.5)
    slot_row(run, done=True, gen=gen, stall=stall)


def _busy(handler: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(handler)
    def busy(run: Run, **kwargs: Any) -> None:
        with marked("busy"):
            handler(run, **kwargs)

    return busy


def _declare(name: str, handler: Callable[[Run], None], **more: Any) -> None:
    spec = SPECS[name]
    job(
        every=spec.every,
        name=name,
        lease_ttl=spec.lease_ttl,
        timeout=spec.timeout,
        max_batches=spec.max_batches,
        retries=spec.retries,
        retry_backoff=RETRY_BACKOFF,
        **more,
    )(_busy(handler))


_declare(WINDOWS, windows)
_declare(WINDOWS_KEYED, windows_keyed)
_declare(ITEMS, items)
_declare(SLOW, slow)
_declare(FAILING, failing)
_declare(RETRYING, retrying, exclude=[QUIET], defer_excluded=True)
job(
    instances=True,
    name=INSTANCES,
    lease_ttl=INSTANCE_SPEC.lease_ttl,
    timeout=INSTANCE_SPEC.timeout,
    max_batches=INSTANCE_SPEC.max_batches,
)(_busy(instance))
