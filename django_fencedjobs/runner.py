"""Running jobs: the :class:`Run` a handler receives, one run of one job, one tick over
the due jobs, and the loop.

A run's life:

1. **acquire**, in one transaction: take the lease (fence + 1, only if it expired and the
   job is due), move ``next_run_at`` past now, mark runs of older fences abandoned,
   insert the ``JobRun`` (unique per slot). Slots missed while nothing ran coalesce into
   this one run; their count is recorded.
2. **execute** the handler with a :class:`Run`, under the supervisor (lease renewal,
   timeout). Every write goes through ``fenced_atomic``.
3. **record** the outcome, in one transaction: the ``JobRun`` row moves from running to
   its outcome, and the lease is released (both conditional, so a superseded run
   changes nothing of its successor's).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.models import Model, Q, QuerySet
from django.utils import timezone as dj_timezone

from django_fencedjobs import clock, lease, signals
from django_fencedjobs.conf import get_settings
from django_fencedjobs.exceptions import (
    FenceLost,
    JobTimeout,
    NotInRun,
    WatermarkError,
)
from django_fencedjobs.fencing import (
    FencedAtomic,
    current_run,
    in_fenced_block,
    reset_current_run,
    set_current_run,
)
from django_fencedjobs.models import JobLease, JobRun, Outcome, Watermark
from django_fencedjobs.registry import Job, registry
from django_fencedjobs.supervisor import Supervisor

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

logger = logging.getLogger("django_fencedjobs")

ModelT = TypeVar("ModelT", bound=Model)
WatermarkValue = datetime | int

#: Missed slots are counted up to this many; past it the count says "at least".
MAX_COUNTED_SLOTS = 10_000

_stop = threading.Event()


def request_stop() -> None:
    """Ask the runner to stop: the current batch or window finishes and commits, the run is
    recorded as interrupted, the lease is released, and no further job starts."""
    _stop.set()


def stop_requested() -> bool:
    return _stop.is_set()


def clear_stop() -> None:
    _stop.clear()


@dataclass(frozen=True)
class Window:
    """A half-open interval of time ``[start, end)`` a run processes."""

    start: datetime
    end: datetime


class Run:
    """What a job's handler receives: the run's fence and slot, and the helpers that keep
    its work idempotent (watermark windows, per-item batches)."""

    def __init__(
        self,
        job: Job,
        record: JobRun,
        *,
        now: datetime,
        watermarks: dict[str, WatermarkValue],
    ) -> None:
        self.job = job
        self.record = record
        #: The fence this run was given; every fenced write checks it is still current.
        self.fence: int = record.fence
        #: The slot this run is for (aware, UTC).
        self.scheduled_for: datetime = record.scheduled_for
        #: The clock's reading when the run acquired its lease (aware, UTC): the upper
        #: bound of "everything due up to now".
        self.now: datetime = now
        self.owner: str = record.owner
        self._watermarks_at_start = dict(watermarks)
        self._watermarks = dict(watermarks)
        self.items = 0
        self.batch_count = 0
        self.capped = False
        self.interrupted = False
        #: Set when the run learned its fence is gone (renewal failed, timed out, or a
        #: fenced block found it stale): helpers stop at once.
        self.lost = False
        self._iterators: list[Generator[Any, None, None]] = []
        self._aborting = False

    def __repr__(self) -> str:
        slot = f"{self.scheduled_for:%Y-%m-%dT%H:%M:%SZ}"
        return f"<Run {self.job.name} fence={self.fence} scheduled_for={slot}>"

    # -- watermarks ----------------------------------------------------------------------

    @property
    def watermark(self) -> WatermarkValue | None:
        """The watermark (default key) as it was when the run started."""
        return self._watermarks_at_start.get("")

    def watermark_for(self, key: str) -> WatermarkValue | None:
        """The watermark of ``key`` as it was when the run started."""
        return self._watermarks_at_start.get(key)

    def advance_watermark(self, value: WatermarkValue, key: str = "") -> None:
        """Move the watermark forward to ``value``, in the current fenced transaction.

        Advance it in the same ``fenced_atomic`` block as the work it covers: both commit
        or neither does, so a crash can neither lose work nor repeat it. Raises
        :class:`WatermarkError` when called outside the run's fenced block or when
        ``value`` is behind the stored watermark.
        """
        alias = lease.lease_db()
        if current_run() is not self or not in_fenced_block(alias):
            raise WatermarkError(
                f"job {self.job.name!r}: advance_watermark() must be called inside "
                "`with fenced_atomic():` in the run's own handler, together with the work"
            )
        if isinstance(value, datetime):
            if dj_timezone.is_naive(value):
                raise WatermarkError(
                    f"job {self.job.name!r}: watermark {value!r} is naive; pass an aware "
                    "datetime, e.g. window.end or run.now"
                )
            column = "position"
        elif isinstance(value, int) and not isinstance(value, bool):
            column = "cursor"
        else:
            raise WatermarkError(
                f"job {self.job.name!r}: a watermark is an aware datetime or an int, got {value!r}"
            )
        rows = Watermark.objects.using(alias).filter(job=self.job.name, key=key)
        forward = Q(**{f"{column}__isnull": True}) | Q(**{f"{column}__lte": value})
        changed = rows.filter(forward).update(
            **{column: value}, fence=self.fence, updated_at=dj_timezone.now()
        )
        if not changed:
            current = rows.values_list(column, flat=True).first()
            if current is not None:
                raise WatermarkError(
                    f"job {self.job.name!r}: the watermark{f' {key!r}' if key else ''} is at "
                    f"{current!r}; it only moves forward, not to {value!r}"
                )
            Watermark.objects.using(alias).create(
                job=self.job.name, key=key, fence=self.fence, **{column: value}
            )
        self._watermarks[key] = value

    # -- bounded iteration ----------------------------------------------------------------

    def _may_continue(self) -> bool:
        if self.lost:
            raise FenceLost(_fence_gone(self))
        if _stop.is_set():
            self.interrupted = True
            return False
        return True

    def windows(
        self, step: timedelta, *, start: datetime | None = None, key: str = ""
    ) -> Iterator[Window]:
        """Consecutive windows ``[w, w + step)`` from the watermark up to :attr:`now`, at
        most ``max_batches`` of them; only whole windows (``end <= now``).

        Without a stored watermark, the first window starts at ``start``, or else at the
        last whole multiple of ``step`` since the epoch that leaves one whole window before
        now. Advance the watermark to ``window.end`` inside the window's fenced block
        before asking for the next window.
        """
        if step <= timedelta(0):
            raise ValueError(
                f"job {self.job.name!r}: windows(step={step!r}): step must be a positive "
                "timedelta, e.g. timedelta(hours=1)"
            )
        position = self._watermarks.get(key)
        if position is None:
            position = start if start is not None else _floor(self.now, step) - step
        if not isinstance(position, datetime):
            raise WatermarkError(
                f"job {self.job.name!r}: windows() needs a datetime watermark, found {position!r}"
            )
        gen = self._windows(position, step, key)
        self._iterators.append(gen)
        return gen

    def _windows(
        self, position: datetime, step: timedelta, key: str
    ) -> Generator[Window, None, None]:
        while position + step <= self.now:
            if self.batch_count >= self.job.max_batches:
                self.capped = True
                return
            if not self._may_continue():
                return
            window = Window(position, position + step)
            yield window
            self.batch_count += 1
            reached = self._watermarks.get(key)
            if not isinstance(reached, datetime) or reached < window.end:
                raise WatermarkError(
                    f"job {self.job.name!r}: advance the watermark to window.end "
                    f"({window.end.isoformat()}) inside the window's fenced_atomic block "
                    "before taking the next window"
                )
            position = window.end

    def batches(self, queryset: QuerySet[ModelT], size: int = 100) -> Iterator[list[ModelT]]:
        """Claim and yield the rows of ``queryset`` in batches of ``size``, each batch in its
        own fenced transaction, at most ``max_batches`` batches.

        Rows are claimed with ``SELECT ... FOR UPDATE SKIP LOCKED``; the batch's
        transaction commits when the loop asks for the next batch (or ends), and rolls
        back if the loop body raises. The queryset must exclude finished items (e.g.
        ``filter(sent_at__isnull=True)``), and the loop body must mark them finished,
        in the same transaction::

            for reminders in run.batches(Reminder.objects.filter(sent_at=None), size=50):
                for reminder in reminders:
                    send(reminder)
                    reminder.sent_at = run.now
                Reminder.objects.bulk_update(reminders, ["sent_at"])
                run.add_items(len(reminders))
        """
        if size < 1:
            raise ValueError(
                f"job {self.job.name!r}: batches(size={size!r}): size must be at least 1"
            )
        gen = self._batches(queryset, size)
        self._iterators.append(gen)
        return gen

    def _batches(
        self, queryset: QuerySet[ModelT], size: int
    ) -> Generator[list[ModelT], None, None]:
        alias = lease.lease_db()
        features = connections[alias].features
        claim = queryset.using(alias).select_for_update(
            skip_locked=features.has_select_for_update_skip_locked,
            of=("self",) if features.has_select_for_update_of else (),
        )
        # Where it can, the claim statement itself locks the lease row on this run's fence:
        # one statement per batch instead of the fence check and then the claim.
        held = None
        if self.job.exclusion == "lease":
            held = lease.fence_held(connections[alias], self.job.name, self.fence)
        if held is not None:
            claim = claim.filter(held)
        while True:
            if self.batch_count >= self.job.max_batches:
                self.capped = queryset.using(alias).exists()
                return
            if not self._may_continue():
                return
            with FencedAtomic(None, check=held is None):
                items = list(claim[:size])
                if not items:
                    if held is not None:
                        # Nothing claimed: the queue is empty, or the fence is gone (then
                        # this raises FenceLost, as fenced_atomic would have).
                        self.check_fence(connections[alias])
                    return
                try:
                    yield items
                except GeneratorExit:
                    if self._aborting:
                        raise  # the loop body failed: roll this batch back
                    # The loop stopped early (``break``): the batch it finished commits.
                    self.batch_count += 1
                    return
            self.batch_count += 1

    def _close_iterators(self, *, abort: bool) -> None:
        self._aborting = abort
        for gen in self._iterators:
            gen.close()
        self._iterators.clear()

    # -- progress and liveness -----------------------------------------------------------

    def add_items(self, n: int = 1) -> None:
        """Count items processed, for the run record and the logs."""
        self.items += n

    def heartbeat(self) -> None:
        """Renew the lease now; raises :class:`FenceLost` when it is no longer this run's.

        The supervisor renews in the background; call this from a long computation to find
        out at once that the run has been superseded.
        """
        if self.lost or not lease.renew(
            self.job.name, self.fence, clock.now() + self.job.lease_ttl
        ):
            self.lost = True
            raise FenceLost(_fence_gone(self))

    @property
    def stopping(self) -> bool:
        """True once the process was asked to stop (SIGTERM): finish what is committed."""
        return _stop.is_set()

    def check_fence(self, connection: BaseDatabaseWrapper) -> None:
        """Called by ``fenced_atomic`` inside its transaction."""
        if self.lost:
            raise FenceLost(_fence_gone(self))
        if self.job.exclusion == "advisory":
            held = lease.try_advisory_xact_lock(connection, self.job.name)
            reason = "another transaction of this job holds its advisory lock"
        else:
            held = lease.lock_fence(connection, self.job.name, self.fence)
            reason = "another run took the lease over, or the run was revoked"
        if not held:
            if self.job.exclusion != "advisory":
                self.lost = True
            raise FenceLost(
                f"job {self.job.name!r}: fence {self.fence} is no longer current ({reason}); "
                "nothing in this fenced block was committed"
            )


def _fence_gone(run: Run) -> str:
    return (
        f"job {run.job.name!r}: fence {run.fence} is no longer current: another run took the "
        "lease over, or this run timed out and was revoked. The run is over; do not retry "
        "in the handler (the next run continues from the committed state)."
    )


def _floor(value: datetime, step: timedelta) -> datetime:
    seconds = step.total_seconds()
    epoch = value.timestamp()
    return datetime.fromtimestamp(epoch - (epoch % seconds), tz=UTC)


def _watermark_text(value: WatermarkValue | None) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    return str(value)


# -- syncing declared jobs with their lease rows ------------------------------------------


def sync(jobs: Sequence[Job], now: datetime, fingerprints: dict[str, str] | None = None) -> bool:
    """Create lease rows for new jobs and recompute ``next_run_at`` for changed schedules.

    ``fingerprints`` are the stored schedule fingerprints by job name, when the caller has
    already read them (a tick has); otherwise they are read here. Returns True when
    anything changed (the caller re-reads).
    """
    if fingerprints is None:
        rows = lease.read([job.name for job in jobs])
        fingerprints = {name: row.schedule_fingerprint for name, row in rows.items()}
    missing: list[JobLease] = []
    changed = False
    for job in jobs:
        schedule = job.valid_schedule
        stored = fingerprints.get(job.name)
        if stored is None:
            missing.append(
                JobLease(
                    name=job.name,
                    next_run_at=schedule.next_after(now),
                    schedule_fingerprint=schedule.fingerprint(),
                    created_at=now,
                )
            )
        elif stored != schedule.fingerprint():
            lease.reschedule(job.name, stored, schedule.fingerprint(), schedule.next_after(now))
            changed = True
    if missing:
        lease.create(missing)
    return changed or bool(missing)


def runnable_jobs(names: Sequence[str] | None = None) -> list[Job]:
    """The jobs to consider: the named ones (unknown names raise), or every job with a valid
    schedule."""
    if names:
        return [registry.get(name) for name in names]
    return [job for job in registry.all() if job.schedule is not None]


# -- one run --------------------------------------------------------------------------------


def _slot(job: Job, row: lease.LeaseRow, now: datetime) -> tuple[datetime, int]:
    """The slot to run for (the latest due one) and how many earlier slots coalesce into it."""
    schedule = job.valid_schedule
    later = schedule.fire_times(row.next_run_at, now, limit=MAX_COUNTED_SLOTS)
    if len(later) < MAX_COUNTED_SLOTS:
        return (later[-1] if later else row.next_run_at), len(later)
    # A very long outage: find the latest slot by widening a window back from now.
    span = schedule.min_interval()
    while True:
        recent = schedule.fire_times(max(now - span, row.next_run_at), now)
        if recent:
            return recent[-1], MAX_COUNTED_SLOTS
        span *= 2


def run_job(job: Job, row: lease.LeaseRow) -> JobRun | None:
    """Acquire ``job``'s lease (as read in ``row``) and run it; None when another process got
    there first. Exceptions of the handler are recorded, not raised."""
    owner = get_settings().owner
    now = clock.now()
    if not row.is_due(now):
        return None
    schedule = job.valid_schedule
    scheduled_for, missed = _slot(job, row, now)
    next_run_at = schedule.next_after(now)
    too_late = job.starting_deadline is not None and now - scheduled_for > job.starting_deadline
    alias = lease.lease_db()
    try:
        with transaction.atomic(using=alias):
            fence = lease.acquire(
                row, owner=owner, now=now, ttl=job.lease_ttl, next_run_at=next_run_at
            )
            if fence is None:
                return None
            lease.mark_abandoned(job.name, fence, now)
            watermarks = {
                key: value
                for key, position, cursor in Watermark.objects.using(alias)
                .filter(job=job.name)
                .values_list("key", "position", "cursor")
                if (value := position if position is not None else cursor) is not None
            }
            record = JobRun.objects.using(alias).create(
                job=job.name,
                scheduled_for=scheduled_for,
                started_at=None if too_late else now,
                finished_at=now if too_late else None,
                outcome=Outcome.MISSED if too_late else Outcome.RUNNING,
                fence=fence,
                owner=owner,
                missed_slots=missed,
                watermark_before=_watermark_text(watermarks.get("")),
                error=(
                    f"Not started: {now - scheduled_for} after its slot, past the job's "
                    f"starting_deadline of {job.starting_deadline}."
                    if too_late
                    else ""
                ),
            )
            if too_late:
                lease.release(job.name, fence, succeeded_at=None, failed=False)
    except IntegrityError:
        # A run for this slot already exists (e.g. "run now" landed on a recorded slot):
        # skip the slot rather than retry it forever.
        lease.skip_slot(row, next_run_at=next_run_at)
        logger.warning(
            "slot %s of %s is already recorded; skipped",
            scheduled_for.isoformat(),
            job.name,
            extra={"event": "slot_skipped", "job": job.name},
        )
        return None
    if too_late:
        logger.warning(
            "run missed: %s after its slot, past starting_deadline %s",
            now - scheduled_for,
            job.starting_deadline,
            extra=_log_fields(record, event="run_missed"),
        )
        signals.send(signals.run_finished, job=job, record=record)
        return record
    return _execute(job, Run(job, record, now=now, watermarks=watermarks))


def _execute(job: Job, run: Run) -> JobRun:
    record = run.record
    logger.info(
        "run started: %s (fence %d, %d earlier slot(s) coalesced)",
        job.name,
        run.fence,
        record.missed_slots,
        extra=_log_fields(record, event="run_started"),
    )
    signals.send(signals.run_started, job=job, record=record)
    token = set_current_run(run)
    supervisor = Supervisor(run)
    supervisor.start()
    outcome: str = Outcome.SUCCEEDED
    error = ""
    try:
        try:
            try:
                job.func(run)
            finally:
                supervisor.disarm()
        except BaseException:
            run._close_iterators(abort=True)
            raise
        run._close_iterators(abort=False)
    except (FenceLost, JobTimeout) as exc:
        outcome, error = _interrupted_outcome(supervisor, exc)
    except Exception as exc:
        if supervisor.fired is not None:
            outcome, error = _interrupted_outcome(supervisor, exc)
        else:
            outcome, error = Outcome.FAILED, _bounded_traceback(exc)
    except BaseException as exc:  # KeyboardInterrupt, SystemExit: record, then let it through
        _record(run, Outcome.INTERRUPTED, _bounded_traceback(exc), supervisor)
        raise
    finally:
        reset_current_run(token)
        supervisor.join()
    if supervisor.fired is not None:
        _discard_connection(lease.lease_db())
    if outcome == Outcome.SUCCEEDED and supervisor.fired is not None:
        outcome, error = _interrupted_outcome(supervisor, None)
    if outcome == Outcome.SUCCEEDED and run.interrupted:
        outcome, error = (
            Outcome.INTERRUPTED,
            "Stopped on request (SIGTERM/SIGINT) between batches; the next run continues "
            "from the committed state.",
        )
    return _record(run, outcome, error, supervisor)


def _discard_connection(alias: str) -> None:
    """Throw away this thread's connection to ``alias`` after the handler was interrupted.

    The interrupt lands at whatever Python instruction the handler was at, possibly inside
    Django's transaction bookkeeping, which can leave the connection wrapper's state
    inconsistent (an atomic block never exited, autocommit left off). The run's record is
    written on a fresh connection instead. Closing the old one makes the server roll back
    anything it left open; the fence had been revoked or lost, so nothing of it could
    have committed anyway.
    """
    from django_fencedjobs.fencing import forget_fenced_blocks

    forget_fenced_blocks(alias)
    old = connections[alias]
    del connections[alias]
    raw = old.connection
    if raw is not None:
        try:
            raw.close()
        except Exception:  # already broken: nothing to release
            logger.debug("closing an interrupted run's connection failed", exc_info=True)


def _interrupted_outcome(supervisor: Supervisor, exc: BaseException | None) -> tuple[str, str]:
    if supervisor.fired is JobTimeout or isinstance(exc, JobTimeout):
        return (
            Outcome.TIMED_OUT,
            f"Timed out after {supervisor.run_.job.run_timeout}; the lease was revoked, so no "
            "later write of this run can commit.",
        )
    return Outcome.FENCE_LOST, str(exc) if exc else FenceLost.__doc__ or ""


def _bounded_traceback(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(exc))
    limit = get_settings().ERROR_MAX_CHARS
    if len(text) > limit:
        text = "…" + text[-(limit - 1) :]
    return text


def _record(run: Run, outcome: str, error: str, supervisor: Supervisor) -> JobRun:
    """Record the outcome and release the lease; retried once across a dropped connection."""
    record = run.record
    for attempt in (1, 2):
        try:
            _finish(run, outcome, error, supervisor)
            break
        except DatabaseError as exc:
            logger.warning(
                "recording the outcome of %s failed (attempt %d): %s",
                run.job.name,
                attempt,
                exc,
                extra=_log_fields(record, event="record_failed"),
            )
            connections[lease.lease_db()].close()
            if attempt == 2:
                _pending.append((run, outcome, error, supervisor))
                return record
            time.sleep(0.5)
    record.refresh_from_db()
    duration = record.duration
    log = logger.info if outcome == Outcome.SUCCEEDED else logger.error
    log(
        "run finished: %s %s (%d items, %d batches%s, %.3fs)",
        run.job.name,
        record.outcome,
        record.items,
        record.batches,
        ", capped at max_batches with work left" if record.capped else "",
        duration or 0.0,
        extra=_log_fields(record, event="run_finished", duration=duration),
    )
    signals.send(signals.run_finished, job=run.job, record=record)
    return record


def _finish(run: Run, outcome: str, error: str, supervisor: Supervisor) -> None:
    job, record = run.job, run.record
    alias = lease.lease_db()
    if outcome == Outcome.TIMED_OUT and not supervisor.revoked:
        if lease.revoke_timed_out(run):
            return
    finished_at = clock.now()
    with transaction.atomic(using=alias):
        # From running (or abandoned, if a successor gave up on this run while it was
        # paused: its own account is better), never from an outcome already recorded.
        recorded = (
            JobRun.objects.using(alias)
            .filter(pk=record.pk, outcome__in=[Outcome.RUNNING, Outcome.ABANDONED])
            .update(
                outcome=outcome,
                finished_at=finished_at,
                items=run.items,
                batches=run.batch_count,
                capped=run.capped,
                watermark_after=_watermark_text(run._watermarks.get("")),
                error=error,
            )
        )
        released = lease.release(
            job.name,
            run.fence,
            succeeded_at=record.started_at if outcome == Outcome.SUCCEEDED else None,
            failed=outcome in (Outcome.FAILED, Outcome.TIMED_OUT),
        )
    if recorded and not released and outcome != Outcome.FENCE_LOST:
        logger.warning(
            "run of %s finished after its lease was taken over (fence %d)",
            job.name,
            run.fence,
            extra=_log_fields(record, event="run_superseded"),
        )


#: Outcomes that could not be recorded because the database was unreachable; the loop
#: retries them before its next tick.
_pending: list[tuple[Run, str, str, Supervisor]] = []


def record_pending() -> None:
    while _pending:
        run, outcome, error, supervisor = _pending[0]
        _finish(run, outcome, error, supervisor)
        _pending.pop(0)
        run.record.refresh_from_db()
        logger.info(
            "recorded the outcome of %s after reconnecting: %s",
            run.job.name,
            outcome,
            extra=_log_fields(run.record, event="run_recorded_late"),
        )
        # Receivers (Sentry Crons, metrics) learn the outcome now, as for any other run.
        signals.send(signals.run_finished, job=run.job, record=run.record)


def _log_fields(record: JobRun, *, event: str, **more: Any) -> dict[str, Any]:
    fields = {
        "event": event,
        "job": record.job,
        "fence": record.fence,
        "owner": record.owner,
        "scheduled_for": record.scheduled_for.isoformat(),
        "outcome": record.outcome,
        "items": record.items,
        "batches": record.batches,
        "missed_slots": record.missed_slots,
    }
    fields.update(more)
    return fields


# -- ticks and the loop ----------------------------------------------------------------------


@dataclass
class TickResult:
    runs: list[JobRun]
    #: When the earliest of the considered jobs can next be acquired (None: no job).
    next_wakeup: datetime | None


def tick(names: Sequence[str] | None = None) -> TickResult:
    """One pass: run every due job once, in order of their slots.

    With no due job this issues a constant number of queries, whatever the number of
    registered jobs: the clock, and one read of the lease rows (:func:`lease.scan`, whose
    cost barely grows with the number of jobs either).
    """
    jobs = runnable_jobs(names)
    by_name = {job.name: job for job in jobs}
    if not jobs:
        return TickResult([], None)
    now = clock.now()
    seen = lease.scan(list(by_name), now)
    if sync(jobs, now, seen.fingerprints):
        seen = lease.scan(list(by_name), now)
    runs: list[JobRun] = []
    for row in sorted(seen.due, key=lambda r: (r.next_run_at, r.name)):
        if _stop.is_set():
            break
        record = run_job(by_name[row.name], row)
        if record is not None:
            runs.append(record)
    if runs:
        seen = lease.scan(list(by_name), now)
    signals.send(signals.tick_finished, now=now)
    return TickResult(runs, seen.wakeup)


def loop(names: Sequence[str] | None = None, *, max_ticks: int | None = None) -> None:
    """Run due jobs until :func:`request_stop`: sleep until the earliest next slot (at most
    ``LOOP_MAX_SLEEP``), survive the database going away by reconnecting with backoff."""
    runnable_jobs(names)  # unknown names fail now, not at the first tick
    max_sleep = get_settings().LOOP_MAX_SLEEP.total_seconds()
    backoff = 0.5
    ticks = 0
    while not _stop.is_set() and (max_ticks is None or ticks < max_ticks):
        ticks += 1
        try:
            record_pending()
            result = tick(names)
            backoff = 0.5
            sleep = max_sleep
            if result.next_wakeup is not None:
                sleep = min(max_sleep, max((result.next_wakeup - clock.now()).total_seconds(), 0))
        except DatabaseError as exc:
            logger.error(
                "database unavailable, retrying in %.1fs: %s",
                backoff,
                exc,
                extra={"event": "database_unavailable"},
            )
            connections.close_all()
            sleep, backoff = backoff, min(backoff * 2, max_sleep)
        _stop.wait(sleep)


def run_once(names: Sequence[str] | None = None) -> TickResult:
    """``runjobs --once``: one tick, for cron."""
    return tick(names)


__all__ = [
    "NotInRun",
    "Run",
    "TickResult",
    "Window",
    "loop",
    "request_stop",
    "run_job",
    "run_once",
    "tick",
]
