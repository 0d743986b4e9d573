"""The jobs of the time-operation fault tests (tests/test_faults_time.py): a backfilled
watermark job, one job per catch-up policy on a short interval and on a nightly cron in
Europe/Berlin, jobs that retry, one-offs; and a clock the test can move under running
processes.

Declared by :func:`register`, which :func:`tests.faults.jobs.register` calls: in the worker
process, and in a test inside ``registry.isolated()``. Handlers report through
:func:`tests.faults.jobs.report`, with their run's slot, interval, attempt and kind, so the
test can check what each run saw against what was recorded.

**The shifted clock.** ``FENCEDJOBS_TEST_CLOCK=tests.faults.time_jobs.shifted_clock``
makes a process's clock this host's clock plus the number of seconds written in the file
``FENCEDJOBS_TEST_CLOCK_SHIFT`` names, read at every call: the test moves every process's
"now" (days ahead, across a DST change) by writing that file, and time goes on flowing
from there, so leases, sleeps and renewals behave as they do on a real clock.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta

from django_fencedjobs import Run, clock, fenced_atomic, job
from tests.faults.jobs import CONFIG, HANDLER_WAIT, exists, report, wait_until
from tests.testapp.models import Write

#: A watermark job worked by a backfill: one ``Write`` per window (``seq`` = the window's
#: start in minutes since the epoch), the watermark advanced in the same fenced block.
BACKFILLED = "time.backfilled"
#: Its windows: three per hourly slot.
BACKFILL_STEP = timedelta(minutes=20)
#: Short, so that a killed runner's slots are taken again within seconds.
BACKFILL_TTL = timedelta(seconds=2)

#: One job per catch-up policy, every ``CATCHUP_EVERY``; ``each`` keeps ``CATCHUP_LIMIT``.
CATCHUP_EVERY = timedelta(seconds=2)
CATCHUP_LIMIT = 3
CATCHUP = {policy: f"time.every2s.{policy}" for policy in ("coalesce", "each", "latest")}
#: The same policies on a nightly cron in a zone with DST changes.
NIGHTLY_CRON = "30 2 * * *"
NIGHTLY_ZONE = "Europe/Berlin"
NIGHTLY = {policy: f"time.nightly.{policy}" for policy in ("coalesce", "each", "latest")}

#: Fails its first two attempts, succeeds on the third.
RETRIED = "time.retried"
RETRY_BACKOFF = timedelta(seconds=1)
#: Always fails; its backoff reaches past its next slot, so it is never retried.
UNRETRIED = "time.unretried"
#: Slots far apart: a test's retries all fall before the next one.
DAILY = timedelta(days=1)

#: Run once at an instant, by ``backfills.run_once``.
ONCE = "time.once"
#: Run once, by nobody: late ``timeout + grace`` (2 s) after its instant.
LATE_ONCE = "time.late_once"


def shifted_clock() -> datetime:
    """This host's clock plus the shift (seconds) in the file ``FENCEDJOBS_TEST_CLOCK_SHIFT``
    names."""
    with open(os.environ["FENCEDJOBS_TEST_CLOCK_SHIFT"]) as shift:
        seconds = float(shift.read())
    return clock.system_now() + timedelta(seconds=seconds)


def write_shift(path: str, seconds: float) -> None:
    """Set the shift every process reading ``path`` sees (one rename: never half written)."""
    temporary = f"{path}.new"
    with open(temporary, "w") as shift:
        shift.write(repr(seconds))
    os.replace(temporary, path)


def _epoch_minutes(instant: datetime) -> int:
    return int(instant.timestamp()) // 60


def backfilled(run: Run) -> None:
    """Work the run's windows, one fenced ``Write`` and watermark advance each, a moment
    apart (``pace`` seconds, default 0.05), reporting ``started`` and ``ended``.

    In the worker whose ``role`` is ``victim``, once the file ``hold`` exists, a window
    after the first stops inside its fenced block, after its write (reporting
    ``holding``), and waits there to be killed."""
    slot = run.scheduled_for.isoformat()
    report("started", slot=slot, fence=run.fence, attempt=run.attempt, kind=run.kind)
    pace = float(CONFIG.get("pace", 0.05))
    victim = CONFIG.get("role") == "victim"
    for index, window in enumerate(run.windows(BACKFILL_STEP)):
        with fenced_atomic():
            Write.objects.create(job=BACKFILLED, fence=run.fence, seq=_epoch_minutes(window.start))
            run.advance_watermark(window.end)
            if victim and index >= 1 and exists("hold"):
                report("holding", slot=slot, fence=run.fence, index=index)
                wait_until(lambda: False, HANDLER_WAIT)
        time.sleep(pace)
    report("ended", slot=slot, fence=run.fence)


def slot_reporter(run: Run) -> None:
    """Report the run's slot, data interval, attempt and kind; nothing else."""
    report(
        "ran",
        job=run.job.name,
        slot=run.scheduled_for.isoformat(),
        interval=[run.interval.start.isoformat(), run.interval.end.isoformat()],
        attempt=run.attempt,
        kind=run.kind,
        fence=run.fence,
    )


def failing_until_third(run: Run) -> None:
    """Attempts 1 and 2 fail; attempt 3 succeeds."""
    slot_reporter(run)
    if run.attempt < 3:
        raise RuntimeError(f"attempt {run.attempt} fails")


def always_failing(run: Run) -> None:
    slot_reporter(run)
    raise RuntimeError("always fails")


def once(run: Run) -> None:
    """Report the run and make one fenced write (``seq`` = its fence). In the worker whose
    ``role`` is ``victim``, then report ``wrote`` and wait there to be killed: its work
    committed, its end not recorded."""
    slot_reporter(run)
    with fenced_atomic():
        Write.objects.create(job=ONCE, fence=run.fence, seq=run.fence)
    if CONFIG.get("role") == "victim":
        report("wrote", fence=run.fence)
        wait_until(lambda: False, HANDLER_WAIT)


def register() -> None:
    """Declare the jobs in the current registry. Idempotent."""
    job(every=timedelta(hours=1), name=BACKFILLED, lease_ttl=BACKFILL_TTL)(backfilled)
    for policy, name in CATCHUP.items():
        job(
            every=CATCHUP_EVERY,
            name=name,
            lease_ttl=timedelta(seconds=5),
            catchup=policy,  # type: ignore[arg-type]
            catchup_limit=CATCHUP_LIMIT,
        )(slot_reporter)
    for policy, name in NIGHTLY.items():
        job(NIGHTLY_CRON, timezone=NIGHTLY_ZONE, name=name, catchup=policy)(  # type: ignore[arg-type]
            slot_reporter
        )
    job(every=DAILY, name=RETRIED, retries=2, retry_backoff=RETRY_BACKOFF)(failing_until_third)
    job(every=DAILY, name=UNRETRIED, retries=2, retry_backoff=2 * DAILY)(always_failing)
    job(every=DAILY, name=ONCE, lease_ttl=timedelta(seconds=5))(once)
    job(
        every=DAILY,
        name=LATE_ONCE,
        timeout=timedelta(seconds=1),
        grace=timedelta(seconds=1),
    )(slot_reporter)


__all__ = ["register", "shifted_clock", "write_shift"]
