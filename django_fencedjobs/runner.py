"""One run of one job: acquire (:func:`claim`: the lease taken, fence + 1, the ``JobRun``
inserted, in one transaction), execute the handler under its supervisor, and record the end
(:func:`record_end`: the lease row first, then the run's, both conditional, so a superseded
run changes nothing of its successor's, and recording twice records once). See
docs/internals.md for a run's whole life.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
import traceback
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import (
    DatabaseError,
    DataError,
    IntegrityError,
    NotSupportedError,
    ProgrammingError,
    connections,
    transaction,
)

from django_fencedjobs import clock, db, lease, oneshots, outcomes, retries, signals, slots
from django_fencedjobs.checkids import CheckId
from django_fencedjobs.conf import get_settings
from django_fencedjobs.exceptions import UnknownJob
from django_fencedjobs.fencing import reset_current_holder, set_current_holder
from django_fencedjobs.instances import instance_job
from django_fencedjobs.instants import format_instant
from django_fencedjobs.models import (
    FAILURE_OUTCOMES,
    LEASE_FREE,
    JobRun,
    Outcome,
    RunKind,
    Watermark,
)
from django_fencedjobs.registry import Job
from django_fencedjobs.run import Run, watermark_text
from django_fencedjobs.runstate import RunState, WatermarkValue
from django_fencedjobs.supervisor import Supervisor
from django_fencedjobs.text import bounded, error_excerpt, one_line, storable

logger = logging.getLogger("django_fencedjobs")


@dataclass
class Acquired:
    """A run whose lease was taken and record written (running, or missed), committed."""

    job: Job
    record: JobRun
    now: datetime
    #: The lease row's watermarks as committed, by key.
    watermarks: dict[str, WatermarkValue]
    #: The lease row the run holds: the job's own (default), or a backfill slot's or one-off's.
    lease_name: str = ""
    #: ``overlap="replace"``: the next slot, when this run is stopped and recorded replaced.
    replace_at: datetime | None = None

    def __post_init__(self) -> None:
        self.lease_name = self.lease_name or self.job.name


def run_named(
    job: Job, *, stop: threading.Event | None = None, unrecorded: Unrecorded | None = None
) -> JobRun | None:
    """Claim the row of ``job`` (a declared job or an instance) if it is due and run it in
    this thread; None when it is not due or another process has it. What the handler
    raises is recorded, not raised (but ``KeyboardInterrupt``, after recording). ``stop``:
    the stop request; ``unrecorded``: where an end the database was away for waits."""
    claimed = claim(1, named={job.name: job})
    if not claimed:
        return None
    return run_acquired(claimed[0], stop=stop, unrecorded=unrecorded)


#: The log event and level of a slot recorded as not run, by its outcome.
_NOT_RUN: dict[str, tuple[str, int]] = {
    Outcome.SKIPPED: ("slot_not_rerun", logging.WARNING),
    Outcome.EXCLUDED: ("slot_excluded", logging.INFO),
    Outcome.FAILED: ("slot_not_run", logging.ERROR),
}


def run_acquired(
    acquired: Acquired,
    *,
    stop: threading.Event | None = None,
    unrecorded: Unrecorded | None = None,
    on_abandon: Any = None,
) -> JobRun:
    """Run a claimed run in this thread and record its end."""
    job, record, now = acquired.job, acquired.record, acquired.now
    if record.outcome == Outcome.MISSED:
        logger.warning(
            "run missed: %s after its slot, past starting_deadline %s",
            now - record.scheduled_for,
            job.starting_deadline,
            extra=_log_fields(record, event="run_missed"),
        )
    elif record.outcome != Outcome.RUNNING:  # recorded, not run: the error says why
        event, level = _NOT_RUN[record.outcome]
        logger.log(
            level,
            "%s: attempt %d of slot %s %s: %s",
            job.name,
            record.attempt,
            record.scheduled_for.isoformat(),
            record.outcome,
            record.error,
            extra=_log_fields(record, event=event),
        )
    if record.outcome != Outcome.RUNNING:
        signals.send(signals.run_finished, job=job, record=record)
        return record
    state = RunState(
        job,
        record,
        watermarks=acquired.watermarks,
        stop_requested=stop,
        lease_name=acquired.lease_name,
        replace_in=(acquired.replace_at - now).total_seconds() if acquired.replace_at else None,
    )
    return _execute(state, now, Unrecorded() if unrecorded is None else unrecorded, on_abandon)


def claim(
    limit: int,
    *,
    named: dict[str, Job] | None = None,
    bases: dict[str, Job] | None = None,
    held: Collection[str] = (),
) -> list[Acquired]:
    """Acquire up to ``limit`` due rows, earliest first: those of the jobs ``named``, then
    due instances of the jobs ``bases``, in one transaction and one :func:`lease.take`: the
    one way a due row is acquired. Each row gets its own fence; a slot is recorded at most
    once; earlier runs of a row still running are marked abandoned. An invalid instance
    (changed without ``save()``) is paused; the others of the batch run. The instance rows
    ``held`` (by the caller's own workers) are not taken, even when their leases expired: a
    runner paused past them does not take its own runs over (its named jobs it does not
    offer: :meth:`~django_fencedjobs.loop.Dispatcher.hand_out`)."""
    named, bases = named or {}, bases or {}
    if limit < 1 or not (named or bases):
        return []
    with transaction.atomic(using=db.lease_db()):
        now = clock.now()  # the database's clock goes with BEGIN
        owner = get_settings().owner
        due = lease.claim_named(list(named), now, limit)
        due += lease.claim_instances(list(bases), now, limit - len(due), held)
        planned = _plan(named, bases, due, now, owner)
        recorded, skipped = lease.take([take for take, _, _ in planned], now)
        for take in skipped:  # moved past the slot by the take, no fence handed out
            logger.warning(
                "slot %s of %s is already recorded; skipped",
                take.record.scheduled_for.isoformat(),
                take.row.name,
                extra={"event": "slot_skipped", "job": take.row.name},
            )
        for take in recorded:
            _end_if_not_run(take.row.name, take.record)
        found = {take.row.name: (job, marks) for take, job, marks in planned}
        replacing = [
            take.row.name
            for take in recorded
            if found[take.row.name][0].overlap == "replace" and take.row.lease_until != LEASE_FREE
        ]
        if replacing:  # the runs still going when their next slot came
            lease.mark_replaced(replacing, now)
    return [
        Acquired(
            found[t.row.name][0],
            t.record,
            now,
            found[t.row.name][1],
            replace_at=_replaced_at(found[t.row.name][0], t.next_run_at, now),
        )
        for t in recorded
    ]


def _replaced_at(job: Job, next_slot: datetime, now: datetime) -> datetime | None:
    """``overlap="replace"``: when the run is over, its lease never renewed past it: the
    next slot, if it is still to come (a run of a backlog, ``catchup="each"``, is not
    replaced by the next one of that backlog)."""
    return next_slot if job.overlap == "replace" and next_slot > now else None


def claim_oneshots(parents: list[str], limit: int, held: Collection[str] = ()) -> list[Acquired]:
    """Acquire up to ``limit`` due backfill slots and one-offs of the jobs ``parents``,
    earliest first, each backfill kept to its concurrency: one transaction, each row taken
    by :func:`lease.acquire`'s compare-and-set and recorded as its target's run; the rows
    ``held`` passed by, as :func:`claim` passes them by."""
    if limit < 1 or not parents:
        return []
    alias = db.lease_db()
    acquired = []
    with transaction.atomic(using=alias):
        now = clock.now()
        owner = get_settings().owner
        for item in lease.claim_oneshots(parents, now, limit, held):
            row = item.row
            try:
                job = oneshots.job_for(row.name, item.kwargs)
            except UnknownJob as exc:
                _target_gone(row, now, exc)
                continue
            watermarks = _watermarks(row.name, alias)
            slot = slots.plan(job, row, now, resumable=bool(watermarks))
            fence = lease.acquire(
                row,
                owner=owner,
                now=now,
                ttl=job.lease_ttl,
                next_run_at=slot.next_run_at,
                run_slot=slot.run_slot,
                attempt=slot.next_attempt,
                dropped_retry=slot.dropped_retry,
            )
            if fence is None:
                continue
            if row.lease_until != LEASE_FREE:
                lease.mark_oneshot_abandoned(job.name, row.kind, slot.scheduled_for, fence, now)
            record = _new_record(job, fence, owner, now, slot, watermarks)
            lease.insert_as_next_attempt(record)
            _end_if_not_run(row.name, record)
            acquired.append(Acquired(job, record, now, watermarks, row.name))
    return acquired


def _target_gone(row: lease.LeaseRow, now: datetime, exc: UnknownJob) -> None:
    """A backfill slot or one-off whose target is gone (instance deleted, job no longer
    declared): its row is paused, and its slot recorded ``skipped`` with the reason, as
    the slot's next attempt, so that it is accounted for and not only logged."""
    target, slot = oneshots.target_of(row.name), row.run_slot or row.next_run_at
    lease.pause_invalid(row.name, row.fence)
    if row.lease_until != LEASE_FREE:  # an attempt that never ended, fenced off just now
        lease.mark_oneshot_abandoned(target, row.kind, slot, row.fence + 1, now)
    error = f"not run: {target} was deleted before it ran, or its job is no longer declared"
    record = JobRun(
        job=target,
        scheduled_for=slot,
        finished_at=now,
        outcome=Outcome.SKIPPED,
        kind=row.kind,
        attempt=row.attempt,
        error=f"{error} ({exc})",
    )
    lease.insert_as_next_attempt(record)
    logger.error(
        "%s does not run (recorded skipped): %s",
        row.name,
        exc,
        extra={"event": "oneshot_invalid", "job": row.name},
    )


def _end_if_not_run(name: str, record: JobRun) -> None:
    """A run recorded as not run (:func:`_new_record`) ends at once, its lease given up and
    (a one-shot's) its row done; a failure counted as one."""
    if record.outcome != Outcome.RUNNING:
        failed = record.outcome in FAILURE_OUTCOMES
        lease.end(name, record.fence, succeeded_at=None, failed=failed)


def _plan(
    named: dict[str, Job], bases: dict[str, Job], due: list[lease.DueRow], now: datetime, owner: str
) -> list[tuple[lease.Take, Job, dict[str, WatermarkValue]]]:
    """Each claimed row's take (slot, next fire time, record), job and watermarks; an
    invalid one is paused instead."""
    planned = []
    for item in due:
        if item.instance is None:
            job = named[item.row.name]
        else:
            job = instance_job(bases[item.instance.job], item.instance)
        if job.schedule is None:
            lease.pause_invalid(item.row.name, item.row.fence)
            logger.error(
                "%s %s is invalid and does not run (paused): %s (%s)",
                "job" if item.instance is None else "instance",
                job.name,
                job.schedule_error,
                job.check_id,
                extra={"event": "instance_invalid", "job": job.name},
            )
            continue
        slot = slots.plan(job, item.row, now, resumable=bool(item.watermarks))
        record = _new_record(job, item.row.fence + 1, owner, now, slot, item.watermarks)
        until = now + job.lease_ttl
        if replace_at := _replaced_at(job, slot.next_run_at, now):
            until = min(until, replace_at)  # never past the next slot: its run takes over
        take = lease.Take(
            item.row,
            slot.next_run_at,
            until,
            record,
            run_slot=slot.run_slot,
            attempt=slot.next_attempt,
            dropped_retry=slot.dropped_retry,
        )
        planned.append((take, job, item.watermarks))
    return planned


def _watermarks(name: str, alias: str) -> dict[str, WatermarkValue]:
    """The watermarks of lease row ``name`` as committed, by key."""
    return {
        key: value
        for key, position, cursor in Watermark.objects.using(alias)
        .filter(job=name)
        .values_list("key", "position", "cursor")
        if (value := position if position is not None else cursor) is not None
    }


def _new_record(
    job: Job,
    fence: int,
    owner: str,
    now: datetime,
    slot: slots.Slot,
    watermarks: dict[str, WatermarkValue],
) -> JobRun:
    """The run's row, not saved yet: running; recorded not run as the slot says
    (:attr:`slots.Slot.not_run`); missed when it starts past the job's starting deadline (a
    backfill's slot has none: it is in the past by design)."""
    scheduled_for, due = slot.scheduled_for, slot.due or slot.scheduled_for
    too_late = (
        job.starting_deadline is not None
        and slot.kind != RunKind.BACKFILL
        and now - due > job.starting_deadline
    )
    if slot.not_run is not None:
        outcome, error = slot.not_run
        return JobRun(
            job=job.name,
            scheduled_for=scheduled_for,
            attempt=slot.attempt,
            kind=slot.kind,
            interval_start=slot.interval_start,
            finished_at=now,
            outcome=outcome,
            fence=fence,
            owner=owner,
            missed_slots=slot.missed,
            error=error,
        )
    return JobRun(
        job=job.name,
        scheduled_for=scheduled_for,
        attempt=slot.attempt,
        kind=slot.kind,
        interval_start=slot.interval_start,
        started_at=None if too_late else now,
        finished_at=now if too_late else None,
        outcome=Outcome.MISSED if too_late else Outcome.RUNNING,
        fence=fence,
        owner=owner,
        missed_slots=slot.missed,
        watermark_before=watermark_text(watermarks.get("")),
        # Until a fenced block of the run moves it (RunState.save_progress).
        watermark_after=watermark_text(watermarks.get("")),
        error=outcomes.missed(now - due, job) if too_late else "",
    )


def _execute(state: RunState, now: datetime, unrecorded: Unrecorded, on_abandon: Any) -> JobRun:
    job, record = state.job, state.record
    logger.info(
        "run started: %s (fence %d, %d earlier slot(s) coalesced)",
        job.name,
        state.fence,
        record.missed_slots,
        extra=_log_fields(record, event="run_started"),
    )
    signals.send(signals.run_started, job=job, record=record)

    def abandoned() -> None:
        if record.outcome == Outcome.RUNNING:  # its supervisor could not record it: retry
            unrecorded.add(state, *_outcome_of(None, state, supervisor))
        if on_abandon is not None:
            on_abandon()

    supervisor = Supervisor(state, end=record_end, on_abandon=abandoned)
    exc = _handle(state, now, supervisor)
    outcome, error = _outcome_of(exc, state, supervisor)
    if outcome == Outcome.FAILED and isinstance(exc, DatabaseError):
        outcome, error = _database_failure(state, outcome, error)
    if supervisor.fired is not None or supervisor.abandoned:
        # What the supervisor delivered decided the outcome already (outcomes.decide).
        _discard_connection(db.lease_db())
    elif unrecorded.deferring and not isinstance(exc, KeyboardInterrupt):
        unrecorded.defer(state, outcome, error)  # recorded with other runs' ends
        return record
    record = _record(state, outcome, error, unrecorded)
    if isinstance(exc, KeyboardInterrupt):
        raise exc
    return record


def _handle(state: RunState, now: datetime, supervisor: Supervisor) -> BaseException | None:
    """Call the handler in the run's context, under its supervisor (joined): what it raised."""
    token = set_current_holder(state)
    supervisor.start()
    raised: BaseException | None = None
    try:
        try:
            try:
                _call(state.job, Run(state, now=now))
            finally:
                supervisor.disarm()
        except BaseException:
            state.close_iterators(abort=True)
            raise
        state.close_iterators(abort=False)
    except BaseException as exc:
        raised = exc
    finally:
        reset_current_holder(token)
    supervisor.join()
    return raised


def _call(job: Job, run: Run) -> None:
    result = job.func(run, **job.kwargs)
    if inspect.isawaitable(result) or inspect.isgenerator(result) or inspect.isasyncgen(result):
        close = getattr(result, "close", None) or getattr(result, "aclose", None)
        if close is not None and not inspect.isasyncgen(result):
            close()  # no "never awaited" warning: this error says it
        raise TypeError(
            f"job {job.name!r}: the handler returned {type(result).__name__} instead of "
            "running: async def and generator handlers are not run (system check "
            f"{CheckId.HANDLER_KIND}). Write a plain def handler."
        )


def _outcome_of(
    exc: BaseException | None, state: RunState, supervisor: Supervisor
) -> tuple[str, str]:
    """How a run ended (:func:`outcomes.decide`); a failure's message is its traceback. A
    handler that failed after its supervisor stopped the run (its transaction ended) ended
    for the supervisor's reason, delivered or not: timed out, not fence lost."""
    fired = supervisor.fired or (supervisor.stopped_by if exc is not None else None)
    outcome, error = outcomes.decide(
        state.job,
        state.fence,
        exc,
        fired=fired,
        stopped=state.stopped,
        interrupted=state.interrupted,
    )
    if outcome == Outcome.FAILED and exc is not None:
        error = _bounded("".join(traceback.format_exception(exc)))
    return outcome, error


def _database_failure(run: RunState, outcome: str, error: str) -> tuple[str, str]:
    """The handler failed on a database error: fence_lost if its fence is gone meanwhile
    (the server ended its session idle in a transaction past the lease, another run took
    over)."""
    _discard_connection(db.lease_db())
    try:
        row = lease.read([run.lease_name]).get(run.lease_name)
    except DatabaseError:
        return outcome, error
    if row is not None and row.fence != run.fence:
        return Outcome.FENCE_LOST, outcomes.fence_lost(run.fence) + "\n\n" + error
    return outcome, error


def _discard_connection(alias: str) -> None:
    """Throw away this thread's connection to ``alias`` after the handler was interrupted,
    maybe inside Django's transaction bookkeeping, its session maybe ended: the server rolls
    back what it left open (nothing of it could commit, its fence gone), and the wrapper
    goes with its record of open atomic blocks; the next use opens a fresh connection."""
    old = connections[alias]
    del connections[alias]
    raw = old.connection
    if raw is not None:
        try:
            raw.close()
        except Exception:  # already broken: nothing to release
            logger.debug("closing an interrupted run's connection failed", exc_info=True)


def _bounded(error: str) -> str:
    return bounded(storable(error), get_settings().ERROR_MAX_CHARS)


def record_end(run: RunState, outcome: str, error: str, *, wait: float = db.LOCK_WAIT) -> bool:
    """Record how ``run`` ended: the one function that does, whoever calls it (the run's
    thread, or its supervisor at the timeout or on giving up).

    One transaction, the lease row first, then the run's: every path that locks both
    (acquiring, which marks older runs abandoned, and this) locks them in that order, so a
    finishing run and its successor cannot deadlock. Then the fence is dead: every fenced
    block of the run fails. The lease row is waited for at most ``wait`` seconds
    (``DatabaseError``). True when this call recorded the end (logged, ``run_finished``
    sent), False when it was recorded already."""
    run.stop()
    end = _run_end(run, outcome, error)
    ended = lease.end_run(end, lock_wait=wait)
    if ended is None:
        return False
    _report_end(run, _ended(run, end, ended))
    return True


def _log_retry(run: RunState, retry: lease.Retry | None, retry_at: datetime | None) -> None:
    if retry is None:
        return
    record = run.record
    slot = format_instant(record.scheduled_for, UTC)
    if retry_at is not None:
        logger.warning(
            "%s: attempt %d of the %s run of slot %s will be at %s",
            run.job.name,
            retry.attempt,
            record.kind,
            slot,
            format_instant(retry_at, UTC, ref=record.scheduled_for),
            extra=_log_fields(record, event="retry_scheduled", retry_at=retry_at.isoformat()),
        )
    else:
        logger.warning(
            "%s: no retry of the %s run of slot %s: attempt %d would not start before the"
            " next slot",
            run.job.name,
            record.kind,
            slot,
            retry.attempt,
            extra=_log_fields(record, event="retry_skipped"),
        )


def _run_end(run: RunState, outcome: str, error: str) -> lease.RunEnd:
    """What :func:`lease.end_runs` records of ``run``'s end: every rule of a run's end
    (retry, a one-shot row done, a timeout after a takeover...) decided here, once."""
    job, record = run.job, run.record
    succeeded_at = record.started_at if outcome == Outcome.SUCCEEDED else None
    late_after: datetime | None = None  # an instance's deadline after a success: next slot's
    if succeeded_at is not None and job.parent is not None:
        late_after = job.late_after(job.valid_schedule.next_after(succeeded_at))
    lost_outcome, lost_error = outcomes.if_superseded(outcome, run.fence)
    return lease.RunEnd(
        run.lease_name,
        run.fence,
        record.pk,
        outcome=outcome,
        error=error,
        capped=run.capped,
        loose_items=run.loose_items,
        succeeded_at=succeeded_at,
        late_after=late_after,
        finished_at=None if clock.get_clock() is clock.database_now else clock.now(),
        retry=retries.next_attempt(job, record, outcome),
        final=outcome in retries.FINAL_OUTCOMES,
        lost_outcome=lost_outcome,
        lost_error=lost_error,
    )


def _ended(run: RunState, end: lease.RunEnd, ended: lease.Ended) -> dict[str, Any]:
    """Log what recording ``run``'s ``end`` found (a retry, a takeover): what its row says."""
    if ended.released:
        _log_retry(run, end.retry, ended.retry_at)
    if not ended.released and ended.outcome != Outcome.FENCE_LOST:
        logger.warning(
            "run of %s finished after its lease was taken over (fence %d)",
            run.job.name,
            run.fence,
            extra=_log_fields(run.record, event="run_superseded"),
        )
    return {
        "outcome": ended.outcome,
        "finished_at": ended.finished_at,
        "capped": run.capped,
        "error": ended.error,
        "items": ended.items,
        "batches": ended.batches,
        "watermark_after": ended.watermark_after,
    }


def _report_end(run: RunState, ended: dict[str, Any]) -> None:
    """Log how the run ended and send ``run_finished``, once its row says so."""
    job, record = run.job, run.record
    for field, value in ended.items():  # what the row now says
        setattr(record, field, value)
    duration = record.duration
    log = logger.info if record.outcome == Outcome.SUCCEEDED else logger.error
    why = error_excerpt(record.error)  # the exception's last line, for a failure
    log(
        "run finished: %s %s (%d items, %d batches%s, %.3fs)%s",
        job.name,
        record.outcome,
        record.items,
        record.batches,
        ", capped at max_batches with work left" if record.capped else "",
        duration or 0.0,
        f": {why}" if why else "",
        extra=_log_fields(
            record, event="run_finished", duration=duration, capped=record.capped, error=why
        ),
    )
    signals.send(signals.run_finished, job=job, record=record)


def _record(run: RunState, outcome: str, error: str, unrecorded: Unrecorded) -> JobRun:
    """:func:`_record_alone`, retried once across a dropped connection; left to
    ``unrecorded`` if the database stays away."""
    for attempt in (1, 2):
        try:
            if _record_alone(run, outcome, error):
                return run.record  # what it wrote is on the record already
            break
        except DatabaseError as exc:
            logger.warning(
                "recording the outcome of %s failed (attempt %d): %s",
                run.job.name,
                attempt,
                exc,
                extra=_log_fields(run.record, event="record_failed"),
            )
            connections[db.lease_db()].close()
            if attempt == 2:
                unrecorded.add(run, outcome, error)
                return run.record
            time.sleep(0.5)
    # Recorded already, by its supervisor at the timeout or by a successor's takeover.
    run.record.refresh_from_db(using=db.lease_db())
    return run.record


def _refused(exc: Exception) -> bool:
    """Whether recording an end failed on the end itself (a value refused, or not even
    sent), not on the database being away: trying it again would fail again."""
    return not isinstance(exc, DatabaseError) or isinstance(exc, _REFUSALS)


_REFUSALS = (DataError, IntegrityError, NotSupportedError, ProgrammingError)


def _record_alone(run: RunState, outcome: str, error: str) -> bool:
    """:func:`record_end`; an end the database refuses is recorded failed instead.
    ``DatabaseError`` when the database is away (the end is still to record)."""
    try:
        return record_end(run, outcome, error)
    except Exception as exc:
        if not _refused(exc):
            raise
        return _record_refused(run, error, exc)


def _record_refused(run: RunState, error: str, exc: Exception) -> bool:
    """Record ``run``'s refused end (``exc``) as ``failed``, with the reason, leaving out
    its items counted outside fenced blocks (the one value of the end from the handler).
    If even that is refused, the run reads abandoned once its lease expires."""
    logger.error(
        "recording the end of %s failed on the end itself; recording it failed, with the reason",
        run.job.name,
        exc_info=exc,
        extra=_log_fields(run.record, event="end_refused"),
    )
    run.loose_items = 0
    why = error_excerpt(f"{type(exc).__name__}: {one_line(exc)}")
    reason = outcomes.end_refused(why)
    text = f"{error}\n\n{reason}" if error else reason
    try:
        return record_end(run, Outcome.FAILED, _bounded(text))
    except Exception as again:
        if not _refused(again):
            raise
        logger.exception(
            "the end of %s cannot be recorded: it reads running until its lease expires, "
            "then abandoned",
            run.job.name,
            extra=_log_fields(run.record, event="end_unrecordable"),
        )
        return False


class Unrecorded:
    """Ends still to be recorded by their runner (:meth:`record`) before it next scans,
    deferred to share one statement (:meth:`defer`) or left while the database was away
    (:meth:`add`); workers add, the dispatching thread records. Until then the run reads
    running: a runner killed in between leaves it abandoned, never succeeded."""

    def __init__(self) -> None:
        #: (run, outcome, error, late: could not be recorded at once, since: monotonic).
        self._runs: list[tuple[RunState, str, str, bool, float]] = []
        self._lock = threading.Lock()
        #: Whether ends of runs whose handler returned wait here (a loop on PostgreSQL).
        self.deferring = False

    def add(self, run: RunState, outcome: str, error: str) -> None:
        """An end that could not be recorded: the database was unreachable."""
        with self._lock:
            self._runs.append((run, outcome, error, True, time.monotonic()))

    def defer(self, run: RunState, outcome: str, error: str) -> None:
        """The end of a run whose handler returned, to record with the others'."""
        run.stop()  # its fenced blocks are over; none may begin from now on
        with self._lock:
            self._runs.append((run, outcome, error, False, time.monotonic()))

    def waited(self) -> float:
        """How long, in seconds, the oldest end here has waited to be recorded (0: none)."""
        with self._lock:
            return time.monotonic() - self._runs[0][4] if self._runs else 0.0

    def record(self) -> None:
        """Record each, oldest first (``DatabaseError``, keeping the rest, while the
        database is away): all in one statement, or if it is refused each on its own, so
        that no end holds another's."""
        with self._lock:
            runs = list(self._runs)
        if not runs or self._record_together(runs):
            return
        for run, outcome, error, late, _ in runs:
            recorded = _record_alone(run, outcome, error)
            with self._lock:
                self._runs.pop(0)  # only this thread removes, from the front
            if late and recorded:
                _log_recorded_late(run, outcome)

    def _record_together(self, runs: list[tuple[RunState, str, str, bool, float]]) -> bool:
        """``runs``' ends in one statement; False, having recorded none, if it is refused."""
        try:
            ends = [_run_end(run, outcome, error) for run, outcome, error, _, _ in runs]
            ended = lease.end_runs(ends, lock_wait=db.LOCK_WAIT)
        except Exception as exc:
            if not _refused(exc):
                raise
            logger.warning(
                "recording %d run end(s) in one statement failed on one of them (%s); "
                "recording each on its own",
                len(runs),
                one_line(exc),
                extra={"event": "ends_split"},
            )
            return False
        with self._lock:
            del self._runs[: len(runs)]  # only this thread removes, from the front
        for (run, outcome, _, late, _), end in zip(runs, ends, strict=True):
            found = ended.get(end.run_pk)
            if found is None:
                continue  # recorded already: by its supervisor, or a successor's takeover
            _report_end(run, _ended(run, end, found))
            if late:
                _log_recorded_late(run, outcome)
        return True


def _log_recorded_late(run: RunState, outcome: str) -> None:
    logger.info(
        "recorded the outcome of %s after reconnecting: %s",
        run.job.name,
        outcome,
        extra=_log_fields(run.record, event="run_recorded_late"),
    )


def _log_fields(record: JobRun, *, event: str, **more: Any) -> dict[str, Any]:
    return {
        "event": event,
        "job": record.job,
        "fence": record.fence,
        "owner": record.owner,
        "scheduled_for": record.scheduled_for.isoformat(),
        "outcome": record.outcome,
        "items": record.items,
        "batches": record.batches,
        "missed_slots": record.missed_slots,
        **more,
    }


__all__ = [
    "Acquired",
    "Unrecorded",
    "claim",
    "claim_oneshots",
    "record_end",
    "run_acquired",
    "run_named",
]
