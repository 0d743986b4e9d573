"""The jobs the fault tests run, in child processes (and a few in the test process).

Declared by :func:`register`, never at import: the worker calls it in the child, and a test
calls it inside ``registry.isolated()``, so the global registry of the test process (and
``tick()`` over every job in other tests) never sees these jobs.

Each handler reports what it did as JSON lines appended to ``<dir>/events-<label>.jsonl``
(one ``write(2)`` per line, so a line is either there whole or not at all, even when the
process is SIGKILLed). The test polls those files to know where a worker is. Per-run knobs
come from :data:`CONFIG`, which the worker fills from ``--set KEY=VALUE``.

Every schedule is hourly or slower unless a test needs the loop to fire by itself: the
tests make a job due with ``operations.make_due`` ("run now"), so no test waits for a slot.
"""

from __future__ import annotations

import json
import os
import random
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from django_fencedjobs import FenceLost, JobTimeout, Run, fenced_atomic, job
from tests.testapp.models import Item, Write

PAUSED_WRITER = "faults.paused_writer"
#: A holder paused past its lease and its timeout (tests/test_faults_paused_past_timeout.py).
PAUSED_PAST_TIMEOUT = "faults.paused_past_timeout"
ITEMS = "faults.items"
WINDOWS = "faults.windows"
DOUBLE_FIRE = "faults.double_fire"
LOOP = "faults.loop"
OVERRUN = "faults.overrun"
BYSTANDER = "faults.bystander"
FAST = "faults.fast"
SLOW = "faults.slow"
TASK_DOUBLE_FIRE = "faults.task_double_fire"
TASK_TAKEOVER = "faults.task_takeover"
TASK_STUCK = "faults.task_stuck"
TASK_HANDOVER = "faults.task_handover"
TASK_HELD = "faults.task_held"
#: Timeout and lease TTL of 1 s: a run behind a connection pooler (tests/test_poolers.py).
POOLED = "faults.pooled"
#: A handler whose session is ended under it and that reconnects (tests/test_poolers.py).
RECONNECT = "faults.reconnect"
#: Jobs with instances (tests/test_faults_instances.py): instances every second or so, and
#: instances whose runs hold until released.
INSTANCES = "faults.instances"
HOLDING_INSTANCES = "faults.holding_instances"
#: ``overlap="replace"`` every 3 s (tests/test_overlap.py): a run still going at the next
#: slot is fenced off and replaced by that slot's run.
REPLACE = "faults.replace"
#: ``fleet=N`` registers N jobs named ``faults.fleet.000`` ... (every ``fleet_every`` s).
FLEET_PREFIX = "faults.fleet."

HOURLY = timedelta(hours=1)
#: Short enough that a paused or killed holder's lease runs out within a second or so.
SHORT_TTL = timedelta(seconds=1)
#: Far longer than any test; shorter than the hourly interval, as the system checks want.
LONG_TIMEOUT = timedelta(minutes=30)
#: The timeout of ``PAUSED_PAST_TIMEOUT``: longer than a worker takes to reach its pause point.
PAUSE_TIMEOUT = timedelta(seconds=4)
#: Upper bound of every wait inside a handler: a test that went wrong ends, it never hangs.
HANDLER_WAIT = 60.0

#: Per-process knobs (``--set KEY=VALUE``): ``dir`` and ``label`` name the events file; the
#: rest is read by the handlers below.
CONFIG: dict[str, str] = {}


# -- reporting and waiting ------------------------------------------------------------------


def path(name: str) -> str:
    return os.path.join(CONFIG["dir"], name)


def label() -> str:
    return CONFIG.get("label") or str(os.getpid())


def report(event: str, **fields: Any) -> None:
    """Append one event line for the test to read."""
    if not CONFIG.get("dir"):
        return
    line = json.dumps({"event": event, "pid": os.getpid(), "t": time.time(), **fields}) + "\n"
    fd = os.open(path(f"events-{label()}.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def exists(name: str) -> bool:
    return os.path.exists(path(name))


def consume(name: str) -> bool:
    """Remove the file ``name``; True if this call removed it (exactly one caller wins)."""
    try:
        os.unlink(path(name))
    except FileNotFoundError:
        return False
    return True


def wait_until(condition: Callable[[], bool], timeout: float = HANDLER_WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _int(key: str, default: int) -> int:
    return int(CONFIG.get(key, default))


# -- the handlers -----------------------------------------------------------------------------


def paused_writer(run: Run) -> None:
    """Write rows through ``fenced_atomic`` in a loop, reporting each one after its commit.

    Role ``A`` stops after ``pause_after`` writes at a point outside any transaction, reports
    ``pause_point`` (the test SIGSTOPs it there) and, once ``resume-A`` exists, writes again
    as fast as it can: after a takeover, the first of those writes must raise ``FenceLost``.
    With ``pause_inside=1`` the pause point is inside the fenced block of write
    ``pause_after`` instead, after its insert, with the lease row locked. With
    ``hold_at_start=1`` it reports ``started`` and waits for ``proceed-A`` before writing.
    Role ``B`` first records a snapshot (PostgreSQL: which transactions had committed when
    it took over), then writes until ``stop-B`` exists.
    """
    role = CONFIG["role"]
    pause_after = _int("pause_after", 3)
    pause_inside = CONFIG.get("pause_inside") == "1"
    if CONFIG.get("hold_at_start") == "1":
        report("started", fence=run.fence)
        wait_until(lambda: exists(f"proceed-{label()}"))
    if role == "B" and connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_current_snapshot()::text")
            report("snapshot", fence=run.fence, snapshot=cursor.fetchone()[0])
    seq = 0
    deadline = time.monotonic() + HANDLER_WAIT
    try:
        while time.monotonic() < deadline:
            seq += 1
            with fenced_atomic():
                row = Write.objects.create(job=run.job.name, fence=run.fence, seq=seq)
                if role == "A" and seq == pause_after and pause_inside:
                    report("pause_point", fence=run.fence, inside=True, id=row.pk, seq=seq)
                    wait_until(lambda: exists(f"resume-{label()}"))
            report("ack", id=row.pk, fence=run.fence, seq=seq)
            if role == "A" and seq == pause_after and not pause_inside:
                report("pause_point", fence=run.fence, seq=seq)
                wait_until(lambda: exists(f"resume-{label()}"))
            elif role == "B":
                if exists(f"stop-{label()}"):
                    report("done", fence=run.fence)
                    return
                time.sleep(0.02)
        report("deadline", fence=run.fence)
    except FenceLost:
        # The supervisor may deliver its own FenceLost while this one is being reported
        # (both notice the takeover as the process resumes): report again if so.
        try:
            report("fence_lost", fence=run.fence, seq=seq)
        except FenceLost:
            report("fence_lost", fence=run.fence, seq=seq)
        raise
    except BaseException as exc:
        report(
            "raised",
            fence=run.fence,
            seq=seq,
            error=traceback.format_exc(),
            type=type(exc).__name__,
        )
        raise


def paused_computing(run: Run) -> None:
    """Write ``pause_after`` rows (default 3) through ``fenced_atomic``, reporting each one
    after its commit; then report ``pause_point`` and compute, outside any transaction, in
    short steps (the test SIGSTOPs it there) until ``release-<label>`` exists (then report
    ``done`` and return) or the run is stopped (then report ``stopped`` with what stopped
    it). It writes nothing after its pause point."""
    seq = 0
    try:
        for seq in range(1, _int("pause_after", 3) + 1):
            with fenced_atomic():
                row = Write.objects.create(job=run.job.name, fence=run.fence, seq=seq)
            report("ack", id=row.pk, fence=run.fence, seq=seq)
        report("pause_point", fence=run.fence, seq=seq)
        released = wait_until(lambda: exists(f"release-{label()}"))
        report("done" if released else "deadline", fence=run.fence)
    except BaseException as exc:
        report("stopped", fence=run.fence, type=type(exc).__name__)
        raise


def process_items(run: Run) -> None:
    """A per-item job: mark each unprocessed Item with this run's fence, one ``Write`` per
    item processed (so a second processing of an item shows as a duplicate). With
    ``stall_batch=k`` it waits inside batch ``k``'s transaction, after its writes, until it
    is asked to stop (SIGTERM) or ``release-<label>`` exists (or it is SIGKILLed there)."""
    size = _int("size", 5)
    stall = _int("stall_batch", -1)
    queryset = Item.objects.filter(processed_at=None).order_by("id")
    for index, batch in enumerate(run.batches(queryset, size=size)):
        for item in batch:
            item.processed_at = run.now
            item.processed_by_fence = run.fence
        Item.objects.bulk_update(batch, ["processed_at", "processed_by_fence"])
        Write.objects.bulk_create(
            [Write(job=run.job.name, fence=run.fence, seq=item.pk) for item in batch]
        )
        run.add_items(len(batch))
        report("batch", index=index, fence=run.fence, ids=[item.pk for item in batch])
        if index == stall:
            report("stalled", index=index, fence=run.fence)
            wait_until(lambda: run.stopping or exists(f"release-{label()}"))
    report("finished", fence=run.fence)


def process_windows(run: Run) -> None:
    """A watermark job: one ``Write`` per window (``seq`` = the window's number counted from
    ``start``), the watermark advanced in the same fenced transaction. With
    ``stall_window=k`` it waits inside window ``k``'s transaction, after its writes."""
    start = datetime.fromisoformat(CONFIG["start"])
    step = timedelta(seconds=_int("step", 60))
    stall = _int("stall_window", -1)
    for index, window in enumerate(run.windows(step, start=start)):
        with fenced_atomic():
            number = (window.start - start) // step
            Write.objects.create(job=run.job.name, fence=run.fence, seq=number)
            run.advance_watermark(window.end)
            run.add_items(1)
            report("window", index=index, number=number, fence=run.fence)
            if index == stall:
                report("stalled", index=index, fence=run.fence)
                wait_until(lambda: run.stopping or exists(f"release-{label()}"))
    report("finished", fence=run.fence)


def double_fire(run: Run) -> None:
    """Record one execution (a non-transactional side effect, and a fenced row), holding
    the lease for a random moment so that racing processes find it held or released."""
    round_ = _int("round", -1)
    report("executed", fence=run.fence, round=round_, scheduled_for=run.scheduled_for.isoformat())
    time.sleep(random.uniform(0, 0.05))
    with fenced_atomic():
        Write.objects.create(job=run.job.name, fence=run.fence, seq=round_)


def loop_job(run: Run) -> None:
    """The loop's job. Normally one fenced write; when the file ``stall`` exists, the one run
    that removes it reports ``stalled`` and waits for ``continue`` before writing (the test
    restarts the database server meanwhile), having read over its connection first: the
    write then goes over a connection the restart broke."""
    if consume("stall"):
        Write.objects.filter(job=run.job.name).exists()
        report("stalled", fence=run.fence, scheduled_for=run.scheduled_for.isoformat())
        wait_until(lambda: exists("continue"))
        report("continuing", fence=run.fence)
    with fenced_atomic():
        Write.objects.create(job=run.job.name, fence=run.fence, seq=0)
    report("wrote", fence=run.fence, scheduled_for=run.scheduled_for.isoformat())


def overrun(run: Run) -> None:
    """A handler that overruns its timeout and ignores the interrupt, as a handler with a
    broad ``except`` would; then it tries to write again.

    ``mode=busy`` spins in pure Python; ``mode=sleep`` sleeps, outside any transaction;
    ``mode=busy_in_transaction`` spins inside a fenced block after writing in it. The write
    before the overrun commits; nothing written after the timeout may: the write after the
    overrun must raise ``FenceLost``.

    Two modes no interrupt can stop quickly: ``mode=block`` sits in one long ``time.sleep``
    (as in a socket read or C code), outside any transaction; ``block_in_transaction`` does
    so inside a fenced block after writing in it. ``mode=swallow`` is the common handler
    shape ``for item in items: try: ... except Exception: log``: it reports every exception
    it swallows, and a side effect (``effect``) per item.
    """
    mode = CONFIG["mode"]
    if mode in ("block", "block_in_transaction", "swallow"):
        _overrun_unstoppably(run, mode)
        return
    with fenced_atomic():
        Write.objects.create(job=run.job.name, fence=run.fence, seq=0)
    report("wrote", seq=0, fence=run.fence)
    deadline = time.monotonic() + HANDLER_WAIT
    try:
        if mode == "busy":
            _spin(deadline)
        elif mode == "sleep":
            while time.monotonic() < deadline:
                time.sleep(0.05)
        else:
            with fenced_atomic():
                Write.objects.create(job=run.job.name, fence=run.fence, seq=1)
                _spin(deadline)
        report("not_interrupted")
    except JobTimeout:
        report("timeout_delivered", fence=run.fence)
    try:
        with fenced_atomic():
            Write.objects.create(job=run.job.name, fence=run.fence, seq=2)
        report("wrote", seq=2, fence=run.fence)
    except FenceLost:
        report("fence_lost", fence=run.fence)
        raise


def _overrun_unstoppably(run: Run, mode: str) -> None:
    if mode == "block":
        report("blocking", fence=run.fence)
        time.sleep(HANDLER_WAIT)
    elif mode == "block_in_transaction":
        with fenced_atomic():
            Write.objects.create(job=run.job.name, fence=run.fence, seq=1)
            report("blocking", fence=run.fence)
            time.sleep(HANDLER_WAIT)
    else:
        deadline = time.monotonic() + HANDLER_WAIT
        seq = 0
        while time.monotonic() < deadline:
            seq += 1
            try:
                with fenced_atomic():
                    Write.objects.create(job=run.job.name, fence=run.fence, seq=seq)
                report("effect", seq=seq)
                time.sleep(0.01)
            except Exception as exc:
                report("swallowed", type=type(exc).__name__)
    report("not_interrupted")


def bystander(run: Run) -> None:
    """An unrelated job: one fenced write."""
    with fenced_atomic():
        Write.objects.create(job=run.job.name, fence=run.fence, seq=0)
    report("wrote", fence=run.fence)


def fast(run: Run) -> None:
    """A frequent job: one fenced write per slot (``seq`` = the slot's epoch second),
    keeping its transaction (and so the lease row) open ``hold`` seconds (default 0)."""
    with fenced_atomic():
        Write.objects.create(
            job=run.job.name, fence=run.fence, seq=int(run.scheduled_for.timestamp())
        )
        time.sleep(float(CONFIG.get("hold", 0)))


def slow(run: Run) -> None:
    """A job that takes ``slow_seconds`` (default 8) outside any transaction, then writes."""
    report("slow_started", fence=run.fence)
    time.sleep(float(CONFIG.get("slow_seconds", 8)))
    with fenced_atomic():
        Write.objects.create(job=run.job.name, fence=run.fence, seq=0)
    report("slow_finished", fence=run.fence)


# -- scheduled tasks (tests/test_tasks_faults.py) ---------------------------------------------
#
# The tasks live in tests.taskapp.tasks (a worker process imports them by path). A task's
# ``seq`` says which run enqueued it: the round, or ``fence * 100 + n``.


def task_double_fire(run: Run) -> None:
    """Enqueue one unfenced task (``seq`` = the round) for the slot, holding the lease for a
    random moment as :func:`double_fire` does."""
    from tests.taskapp.tasks import plain_write

    round_ = _int("round", -1)
    report("executed", fence=run.fence, round=round_, scheduled_for=run.scheduled_for.isoformat())
    time.sleep(random.uniform(0, 0.05))
    result = run.enqueue(plain_write, run.job.name, round_)
    report("enqueued", fence=run.fence, round=round_, result_id=str(result.id))


def task_takeover(run: Run) -> None:
    """Enqueue ``tasks`` (default 3) fenced tasks (``record_write``, ``seq = fence * 100 +
    n``), each reported ``enqueued`` once its enqueue committed.

    Role ``A`` is the run that will be taken over. With ``pause_inside=1`` it enqueues one
    task in a fenced block and, still inside it (before the commit), reports ``pause_point``
    and waits for ``resume-<label>``; otherwise it enqueues its tasks and reports
    ``pause_point`` outside any transaction, and waits there; resumed, it tries to enqueue
    one more task (``seq = fence * 100 + 99``), outside any block. Role ``B``, the successor,
    enqueues its tasks and, with ``hold=1``, keeps its lease (reports ``holding``) until
    ``release-<label>`` exists.
    """
    from tests.taskapp.tasks import record_write

    role = CONFIG["role"]
    base = run.fence * 100
    try:
        if role == "A" and CONFIG.get("pause_inside") == "1":
            with fenced_atomic():
                result = run.enqueue(record_write, run.job.name, base)
                report("pause_point", fence=run.fence, inside=True, result_id=str(result.id))
                wait_until(lambda: exists(f"resume-{label()}"))
            report("enqueued", fence=run.fence, seq=base, result_id=str(result.id))
            return
        for n in range(_int("tasks", 3)):
            result = run.enqueue(record_write, run.job.name, base + n)
            report("enqueued", fence=run.fence, seq=base + n, result_id=str(result.id))
        if role == "A":
            report("pause_point", fence=run.fence)
            wait_until(lambda: exists(f"resume-{label()}"))
            try:
                result = run.enqueue(record_write, run.job.name, base + 99)
            except FenceLost:
                report("enqueue_refused", fence=run.fence)
                raise
            report("enqueued", fence=run.fence, seq=base + 99, result_id=str(result.id))
        elif CONFIG.get("hold") == "1":
            report("holding", fence=run.fence)
            wait_until(lambda: exists(f"release-{label()}"))
        report("done", fence=run.fence)
    except BaseException as exc:
        report("raised", fence=run.fence, type=type(exc).__name__, error=traceback.format_exc())
        raise


def task_stuck(run: Run) -> None:
    """Enqueue one task that blocks (``block_until``) until the file ``release`` exists,
    having created the file ``task-started``."""
    from tests.taskapp.tasks import block_until

    result = run.enqueue(
        block_until, run.job.name, run.fence, path("task-started"), path("release")
    )
    report("enqueued", fence=run.fence, result_id=str(result.id))


def task_held(run: Run) -> None:
    """Enqueue one task that waits inside its fenced block (``hold_in_fence``, ``seq`` = the
    fence) until the file ``release`` exists, having created the file ``task-in-block``."""
    from tests.taskapp.tasks import hold_in_fence

    run.enqueue(hold_in_fence, run.job.name, run.fence, path("task-in-block"), path("release"))
    report("enqueued", fence=run.fence)


def task_handover(run: Run) -> None:
    """Enqueue one task on the backend that hands it over after the commit (and kills this
    process there while its marker file exists): ``seq`` = the slot's epoch second."""
    from tests.taskapp.tasks import handed_over_write

    report("enqueueing", fence=run.fence, scheduled_for=run.scheduled_for.isoformat())
    run.enqueue(handed_over_write, run.job.name, int(run.scheduled_for.timestamp()))
    report("enqueued", fence=run.fence, scheduled_for=run.scheduled_for.isoformat())


# -- connection poolers (tests/test_poolers.py) -----------------------------------------------


def instance_run(run: Run, *, n: int, hold: bool = False) -> None:
    """An instance's run: report it, with its argument ``n``; with ``hold``, wait until
    released (``release-<label>``) or asked to stop; then one fenced ``Write`` (``seq=n``)."""
    report("ran", job=run.job.name, n=n, fence=run.fence)
    if hold:
        report("holding", job=run.job.name, fence=run.fence)
        wait_until(lambda: run.stopping or exists(f"release-{label()}"))
    with fenced_atomic():
        Write.objects.create(job=run.job.name, fence=run.fence, seq=n)


def pooled(run: Run) -> None:
    """A run that keeps its database connection busy in ways a pooler shares.

    ``mode=write``: one fenced write (``seq`` 0). ``mode=write_then_block``: that write,
    then one ``time.sleep`` of ``block`` seconds (default 8: past the timeout and the
    supervisor's grace) outside any transaction, where no interrupt reaches it.
    ``mode=block_in_transaction``: inside a fenced block, a write (``seq`` 1), then the
    same sleep, holding the lease row.
    """
    mode = CONFIG.get("mode", "write")
    block = float(CONFIG.get("block", 8))
    if mode == "block_in_transaction":
        with fenced_atomic():
            Write.objects.create(job=run.job.name, fence=run.fence, seq=1)
            report("blocking", fence=run.fence)
            time.sleep(block)
        report("not_interrupted", fence=run.fence)
        return
    with fenced_atomic():
        Write.objects.create(job=run.job.name, fence=run.fence, seq=0)
    report("wrote", seq=0, fence=run.fence)
    if mode == "write_then_block":
        report("blocking", fence=run.fence)
        time.sleep(block)
        report("not_interrupted", fence=run.fence)


def reconnecting(run: Run) -> None:
    """A handler whose database session is ended under it (a restart, a failover, an
    operator), and that retries on a new connection, as handlers that retry a dropped
    connection do; then it blocks ``block`` seconds (default 20) in one ``time.sleep``
    inside a fenced block, after a write there (``seq`` 99)."""
    import psycopg
    from django.db import InterfaceError, OperationalError

    block = float(CONFIG.get("block", 20))
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    report("session", pid=pid, fence=run.fence)
    settings = connection.settings_dict
    with psycopg.connect(
        host=settings["HOST"],
        port=settings["PORT"],
        user=settings["USER"],
        dbname=settings["NAME"],
        autocommit=True,
    ) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])
    for attempt in range(3):
        try:
            with fenced_atomic():
                Write.objects.create(job=run.job.name, fence=run.fence, seq=attempt)
            break
        except (OperationalError, InterfaceError) as exc:
            report("retrying", attempt=attempt, type=type(exc).__name__)
            connection.close()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (new_pid,) = cursor.fetchone()
    report("reconnected", pid=new_pid, fence=run.fence)
    with fenced_atomic():
        Write.objects.create(job=run.job.name, fence=run.fence, seq=99)
        report("blocking", fence=run.fence)
        time.sleep(block)
    report("not_interrupted", fence=run.fence)


def _spin(deadline: float) -> None:
    total = 0
    while time.monotonic() < deadline:
        total = (total * 31 + 7) % 1_000_003


def replaced_writer(run: Run) -> None:
    """Role ``A``: commits one write, then opens a second fenced block, inserts, reports
    ``inside`` (the test SIGSTOPs it there, the lease row locked) and stays in the block
    until ``released`` exists, then tries to commit. Any other role, or once released:
    one write, acknowledged after its commit."""
    with fenced_atomic():
        Write.objects.create(job=REPLACE, fence=run.fence, seq=1)
    report("ack", fence=run.fence, seq=1)
    if CONFIG.get("role") != "A" or exists("released"):
        return
    try:
        with fenced_atomic():
            Write.objects.create(job=REPLACE, fence=run.fence, seq=2)
            report("inside", fence=run.fence)
            wait_until(lambda: exists("released"))
        report("ack", fence=run.fence, seq=2)
    except BaseException as exc:
        report("refused", fence=run.fence, error=type(exc).__name__)
        raise


def register() -> None:
    """Declare the jobs in the current registry. Idempotent (same functions, same names)."""
    job(every=HOURLY, name=PAUSED_WRITER, lease_ttl=SHORT_TTL, timeout=LONG_TIMEOUT)(paused_writer)
    job(every=HOURLY, name=PAUSED_PAST_TIMEOUT, lease_ttl=SHORT_TTL, timeout=PAUSE_TIMEOUT)(
        paused_computing
    )
    job(every=HOURLY, name=ITEMS, lease_ttl=SHORT_TTL, timeout=LONG_TIMEOUT)(process_items)
    job(every=HOURLY, name=WINDOWS, lease_ttl=SHORT_TTL, timeout=LONG_TIMEOUT)(process_windows)
    job(every=HOURLY, name=DOUBLE_FIRE, lease_ttl=timedelta(seconds=5), timeout=LONG_TIMEOUT)(
        double_fire
    )
    job(
        every=timedelta(seconds=5),
        name=LOOP,
        lease_ttl=timedelta(seconds=2),
        timeout=timedelta(seconds=4),
    )(loop_job)
    job(every=HOURLY, name=OVERRUN, lease_ttl=timedelta(seconds=3), timeout=timedelta(seconds=1))(
        overrun
    )
    job(every=HOURLY, name=BYSTANDER, lease_ttl=SHORT_TTL, timeout=LONG_TIMEOUT)(bystander)
    job(
        every=timedelta(seconds=3),
        name=REPLACE,
        lease_ttl=timedelta(seconds=6),  # longer than the interval: capped at the next slot
        timeout=LONG_TIMEOUT,
        overlap="replace",
    )(replaced_writer)
    job(every=timedelta(seconds=2), name=FAST, lease_ttl=timedelta(seconds=5))(fast)
    job(every=timedelta(minutes=1), name=SLOW, timeout=timedelta(seconds=30))(slow)
    job(every=HOURLY, name=TASK_DOUBLE_FIRE, lease_ttl=timedelta(seconds=5), timeout=LONG_TIMEOUT)(
        task_double_fire
    )
    job(every=HOURLY, name=TASK_TAKEOVER, lease_ttl=SHORT_TTL, timeout=LONG_TIMEOUT)(task_takeover)
    job(every=HOURLY, name=TASK_HELD, lease_ttl=SHORT_TTL, timeout=LONG_TIMEOUT)(task_held)
    # Small bounds: a task of theirs not finished 3 s after its slot makes the job late.
    for name, handler in ((TASK_STUCK, task_stuck), (TASK_HANDOVER, task_handover)):
        job(
            every=HOURLY,
            name=name,
            lease_ttl=SHORT_TTL,
            timeout=timedelta(seconds=2),
            grace=timedelta(seconds=1),
        )(handler)
    one_second = timedelta(seconds=1)
    job(every=HOURLY, name=POOLED, lease_ttl=one_second, timeout=one_second)(pooled)
    job(
        every=HOURLY,
        name=RECONNECT,
        lease_ttl=timedelta(seconds=6),
        timeout=timedelta(seconds=2),
    )(reconnecting)
    job(
        instances=True,
        name=INSTANCES,
        lease_ttl=timedelta(seconds=2),
        timeout=timedelta(milliseconds=900),
    )(instance_run)
    job(instances=True, name=HOLDING_INSTANCES, lease_ttl=SHORT_TTL, timeout=LONG_TIMEOUT)(
        instance_run
    )
    every = timedelta(seconds=_int("fleet_every", 3))
    for n in range(_int("fleet", 0)):
        job(every=every, name=f"{FLEET_PREFIX}{n:03d}", lease_ttl=timedelta(seconds=30))(fast)
    # Backfills, catch-up, retries and one-offs (tests/test_faults_time.py).
    from tests.faults import time_jobs

    time_jobs.register()
