"""The tick, the worker pool and the loop: which due job runs when, and on which worker.

A :class:`Dispatcher` claims due rows for the free workers of its :class:`Pool` in one
transaction (:func:`~django_fencedjobs.runner.claim`), only when a worker is free: a job
waits unacquired rather than behind a slow one with its lease taken (that wait shows as
lateness). A worker whose handler was given up on is replaced at once; at
``MAX_ABANDONED_HANDLERS`` such threads still running the runner stops and raises
:class:`TooManyAbandonedHandlers`: only the end of the process ends them.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.apps import apps
from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_fencedjobs import clock, db, lease, runners, signals
from django_fencedjobs.chores import Chore, Chores
from django_fencedjobs.conf import get_settings
from django_fencedjobs.declared import runnable_jobs, sync
from django_fencedjobs.exceptions import FencedJobsError
from django_fencedjobs.models import JobRun
from django_fencedjobs.registry import Job
from django_fencedjobs.runner import Acquired, Unrecorded, claim, claim_oneshots, run_acquired

logger = logging.getLogger("django_fencedjobs")

#: A due job whose row was locked (by a run's fenced transaction) is tried again after this.
RETRY_LOCKED = timedelta(seconds=1)

#: A loop with instances reads their index at least this often: a change is seen within it.
INSTANCES_POLL = timedelta(seconds=1)

#: Due work and some workers busy: wait this long at most for them to free up, so that one
#: claim (a transaction, whatever its size) serves every worker in a stampede.
CLAIM_GATHER = timedelta(milliseconds=10)

#: Due jobs of the last scan a claim offers per free worker: while other runners drain the
#: same jobs, a worker's worth of those still due is taken rather than come back short.
OFFERED_PER_WORKER = 4

#: How often at most the loop reads the due rows again once a job of them was passed over.
RESCAN_AFTER = timedelta(seconds=0.2)


class TooManyAbandonedHandlers(FencedJobsError):
    """Too many handlers this runner gave up on are still running: it took no further run,
    recorded the runs it held, and should be replaced by a new process."""

    def __init__(self, count: int, limit: int) -> None:
        handlers = "1 handler" if count == 1 else f"{count} handlers"
        super().__init__(
            f"{handlers} given up on at their timeout still running, the most a runner "
            "keeps (FENCEDJOBS['MAX_ABANDONED_HANDLERS'], by default its number of workers: "
            f"{limit}); took no further run, recorded the runs it held; exiting for a new "
            "process to take over"
        )


#: Every pool of this process with a thread left (abandoned ones too: it keeps its pool).
_pools: weakref.WeakSet[Pool] = weakref.WeakSet()
#: Whether this process has made a pool: only such a process reports abandoned handlers.
_runs_jobs = threading.Event()


def abandoned_handlers() -> int | None:
    """Handlers this process gave up on still running; None in a process that ran no job."""
    return sum(pool.abandoned() for pool in list(_pools)) if _runs_jobs.is_set() else None


@dataclass
class _Worker:
    #: Set when the worker's handler was given up on: the thread takes no more work.
    retired: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None


class Pool:
    """``size`` worker threads, started as needed, for one dispatching thread (``wake``
    wakes it whenever a worker becomes free). A worker whose handler is given up on is
    replaced; its thread is counted (:meth:`abandoned`) until it returns. When
    ``max_abandoned`` of them (default: ``size``) run at once, the pool sets ``stop`` and
    :attr:`gave_up` says how many. Ends that cannot be recorded go to ``unrecorded``.
    """

    def __init__(
        self,
        size: int,
        *,
        max_abandoned: int | None = None,
        stop: threading.Event | None = None,
        wake: threading.Event | None = None,
        unrecorded: Unrecorded | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"a pool needs at least one worker, got {size}")
        self.size = size
        self.max_abandoned = max_abandoned or size
        self.stop = stop or threading.Event()
        self.wake = wake or threading.Event()
        self.unrecorded = unrecorded or Unrecorded()
        #: How many abandoned handlers were running when the limit was reached; 0 until then.
        self.gave_up = 0
        #: The threads of handlers given up on, while they run.
        self._abandoned: list[threading.Thread] = []
        _pools.add(self)
        _runs_jobs.set()
        self._work: queue.SimpleQueue[Acquired | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self._busy: set[str] = set()
        self._done: list[JobRun] = []

    def free(self) -> int:
        with self._lock:
            return self.size - len(self._busy)

    def busy(self) -> set[str]:
        """The lease rows a worker holds and has not finished with, by name."""
        with self._lock:
            return set(self._busy)

    def submit(self, acquired: Acquired) -> None:
        with self._lock:
            name = acquired.lease_name
            if len(self._busy) >= self.size or name in self._busy:
                raise RuntimeError(f"no free worker for {name}")
            self._busy.add(name)
            if len(self._busy) > sum(1 for w in self._workers if not w.retired.is_set()):
                self._start_worker()
        self._work.put(acquired)

    def abandoned(self) -> int:
        with self._lock:
            return self._still_abandoned()

    def _still_abandoned(self) -> int:
        """:meth:`abandoned`, with the lock held: forget the threads that have returned."""
        self._abandoned = [thread for thread in self._abandoned if thread.is_alive()]
        return len(self._abandoned)

    def finished(self) -> list[JobRun]:
        """Runs recorded since the last call."""
        with self._lock:
            done, self._done = self._done, []
            return done

    def shutdown(self) -> None:
        """Let the workers end once their current run is recorded (they are daemon
        threads: a retired one never holds up the process's exit)."""
        with self._lock:
            live = sum(1 for w in self._workers if not w.retired.is_set())
        for _ in range(live):
            self._work.put(None)
        for worker in list(self._workers):
            # A worker given up on while we wait is retired: stop waiting for it.
            while (
                worker.thread is not None
                and worker.thread.is_alive()
                and not worker.retired.wait(0.05)
            ):
                pass

    def _start_worker(self) -> None:
        worker = _Worker()
        worker.thread = threading.Thread(
            target=self._work_loop, args=(worker,), name="fencedjobs-worker", daemon=True
        )
        self._workers.append(worker)
        worker.thread.start()

    def _work_loop(self, worker: _Worker) -> None:
        try:
            while not worker.retired.is_set():
                acquired = self._work.get()
                if acquired is None:
                    return
                record = self._run(worker, acquired)
                if worker.retired.is_set():
                    return  # given up on, and replaced: the run is not ours any more
                self._finish(acquired.lease_name, record)
        finally:
            try:
                connections.close_all()  # this thread's connections only
            except Exception:
                logger.debug("closing a worker's connections failed", exc_info=True)

    def _run(self, worker: _Worker, acquired: Acquired) -> JobRun | None:
        def give_up() -> None:
            # The supervisor recorded the run; this worker is stuck in the handler. Free its
            # place, count the stuck thread until it returns: past the limit, stop.
            worker.retired.set()
            with self._lock:
                self._workers.remove(worker)
                if worker.thread is not None:
                    self._abandoned.append(worker.thread)
                running = self._still_abandoned()
                limit_reached = running >= self.max_abandoned and not self.gave_up
                if limit_reached:
                    self.gave_up = running
            if limit_reached:
                self.stop.set()
            self._finish(acquired.lease_name, acquired.record)

        name = acquired.job.name
        try:
            _keep_or_replace(connections[db.lease_db()])
            return run_acquired(
                acquired, stop=self.stop, unrecorded=self.unrecorded, on_abandon=give_up
            )
        except DatabaseError as exc:
            logger.error(
                "could not run %s, database unavailable: %s",
                name,
                exc,
                extra={"event": "database_unavailable", "job": name},
            )
            connections[db.lease_db()].close()
        except Exception:
            logger.exception("the runner failed around %s", name)
        return None

    def _finish(self, name: str, record: JobRun | None) -> None:
        with self._lock:
            self._busy.discard(name)
            if record is not None:
                self._done.append(record)
        self.wake.set()


def _keep_or_replace(connection: BaseDatabaseWrapper) -> None:
    """Before a worker's run: replace its connection if it is broken (a database restart)
    or past a positive ``CONN_MAX_AGE``. A ``CONN_MAX_AGE`` of 0 means "per web request":
    a worker has none, so its connection lives as long as it does, not one session (a
    server process on PostgreSQL) per run."""
    if connection.settings_dict.get("CONN_MAX_AGE") == 0:
        connection.close_at = None
    connection.close_if_unusable_or_obsolete()


@dataclass
class TickResult:
    runs: list[JobRun]
    #: When the earliest of the considered jobs can next be acquired (None: no job).
    next_wakeup: datetime | None


class Dispatcher:
    """One runner's dispatching: its jobs, pool, stop and wake events, runs still to record,
    and ``chores`` (:mod:`django_fencedjobs.chores`; its loop adds :meth:`sweep_orphans`)."""

    def __init__(
        self, jobs: Sequence[Job], *, workers: int | None = None, chores: Iterable[Chore] = ()
    ) -> None:
        self.jobs = list(jobs)
        self.workers = workers or get_settings().WORKERS
        self.chores = Chores(chores)
        #: Set to stop: no further job starts, each run in progress stops between batches.
        self.stop = threading.Event()
        #: Wakes the dispatching thread: a worker became free, or a stop was requested.
        self.wake = threading.Event()
        self.unrecorded = Unrecorded()
        #: The jobs with a schedule (scanned by name), and those with instances (by an index).
        self._by_name = {job.name: job for job in self.jobs if not job.instances}
        self._bases = {job.name: job for job in self.jobs if job.instances}
        #: The jobs with instances due at the last look, earliest first; emptied when a
        #: claim comes up short. The same for backfill slots and one-offs.
        self._due_parents: list[str] = []
        self._due_oneshots: list[str] = []
        #: When a claim was put off to gather free workers (monotonic), if it was.
        self._gathering: float | None = None
        self._tiebreaks: dict[str, float] = {}
        #: Due rows of the last scan not handed out yet; when the next job not due is.
        self._backlog: list[lease.LeaseRow] = []
        self._wakeup: datetime | None = None
        self._scanned = 0.0
        #: Due jobs of the last scan that a claim passed over (another runner has them).
        self._passed_over = 0
        #: How many times the loop failed on an error that was not the database's.
        self.errors = 0
        #: A due job was held back since the last scan: look at it again in a moment.
        self._retry_soon = False

    def request_stop(self) -> None:
        """Stop: each worker's current batch or window finishes and commits, its run is
        recorded as interrupted, its lease released, and no further job starts."""
        self.stop.set()
        self.wake.set()

    def tiebreak(self, name: str) -> float:
        """This dispatcher's place for job ``name`` among jobs due at the same instant, drawn
        once: runners reading the same stampede start at different ends of it, instead of
        each trying the jobs another has just taken."""
        try:
            return self._tiebreaks[name]
        except KeyError:
            return self._tiebreaks.setdefault(name, random.random())

    def scan(self) -> list[lease.LeaseRow]:
        """Read the due rows (earliest first, for :meth:`hand_out`) and the next wakeup: one
        read of the lease rows, after syncing the rows of new or changed jobs."""
        names = list(self._by_name)
        now = clock.now()
        self._backlog, self._wakeup = [], None
        if names:
            seen = lease.scan(names, now)
            if sync(list(self._by_name.values()), now, seen.fingerprints):
                seen = lease.scan(names, now)
            self._backlog = sorted(seen.due, key=lambda r: (r.next_run_at, self.tiebreak(r.name)))
            self._wakeup = seen.wakeup
        if self._bases:  # the jobs with due instances, earliest first (one read of an index)
            wakeups = lease.instances_wakeups(list(self._bases))
            due = sorted((at, name) for name, at in wakeups.items() if at <= now)
            self._due_parents = [name for _, name in due]
            self._wake_by(wakeups, now)
        # The jobs with due backfill slots or one-offs (one read of their index).
        wakeups = lease.oneshot_wakeups([job.name for job in self.jobs])
        self._due_oneshots = sorted(name for name, at in wakeups.items() if at <= now)
        self._wake_by(wakeups, now)
        self._scanned = time.monotonic()
        self._passed_over = 0
        return list(self._backlog)

    def _wake_by(self, wakeups: dict[str, datetime], now: datetime) -> None:
        """Wake up by the earliest of ``wakeups`` not due at ``now``, if it comes first."""
        later = [at for at in wakeups.values() if at > now]
        if later:
            earliest = min(later)
            self._wakeup = earliest if self._wakeup is None else min(self._wakeup, earliest)

    def hand_out(self, pool: Pool) -> None:
        """Claim due rows of the last scan for the free workers and hand them out: due jobs
        (earliest first, by :meth:`tiebreak` among equals) and due instances in one
        :func:`claim`, after recording the ends that freed the workers; then backfill slots
        and one-offs. A job passed over (another runner took or holds it) waits a rescan."""
        busy = pool.busy()
        if any(row.name in busy for row in self._backlog):
            self._retry_soon = True
            self._backlog = [row for row in self._backlog if row.name not in busy]
        rescanned = False
        while (self._backlog or self._due_parents) and pool.free() and not self.stop.is_set():
            free = pool.free()
            if self._gather(pool, free):
                return
            self._claim_for(pool, free)
            if self._is_stale() and not rescanned:
                # Other runners drain these jobs: read what is left (once: a locked row
                # stays due).
                self.scan()
                rescanned = True
        free = pool.free()
        if self._due_oneshots and free and not self.stop.is_set():
            # Backfill slots and one-offs, claimed as instances are.
            oneshots = claim_oneshots(self._due_oneshots, free, held=pool.busy())
            for acquired in oneshots:
                pool.submit(acquired)
            if len(oneshots) < free:
                self._due_oneshots = []
                self._retry_soon = True

    def _claim_for(self, pool: Pool, free: int) -> None:
        """One claim for ``free`` workers: the backlog's next due jobs (up to
        :data:`OFFERED_PER_WORKER` per worker offered), then due instances."""
        self.unrecorded.record()
        window = self._backlog[: free * OFFERED_PER_WORKER]
        named = {row.name: self._by_name[row.name] for row in window}
        bases = {name: self._bases[name] for name in self._due_parents}
        claimed = claim(free, named=named, bases=bases, held=pool.busy())
        for acquired in claimed:
            pool.submit(acquired)
        taken = {acquired.lease_name for acquired in claimed}
        # A worker's worth taken: the others offered may be due still. Fewer: the others are
        # taken by another runner, or held (looked at again after a scan).
        short = sum(1 for row in window if row.name in taken) < free
        left = [row for row in window if row.name not in taken]
        for row in left if short else []:
            self._passed_over += 1
            self._retry_soon = True
            logger.debug(
                "%s: another runner took this slot first, or holds the row; passed over",
                row.name,
                extra={"event": "passed_over", "job": row.name},
            )
        self._backlog = ([] if short else left) + self._backlog[len(window) :]
        # Fewer than asked for: no due instance is left to claim now (any rest is held).
        if len(claimed) < free and self._due_parents:
            self._due_parents = []
            self._retry_soon = True

    def _gather(self, pool: Pool, free: int) -> bool:
        """Whether to put the claim off, some workers busy, for at most :data:`CLAIM_GATHER`."""
        if free < pool.size:
            now = time.monotonic()
            if self._gathering is None:
                self._gathering = now
            if now - self._gathering < CLAIM_GATHER.total_seconds():
                return True
        self._gathering = None
        return False

    def _gather_left(self) -> float | None:
        """Seconds until a claim put off to gather workers is made anyway; None if none is."""
        if self._gathering is None:
            return None
        return max(CLAIM_GATHER.total_seconds() - (time.monotonic() - self._gathering), 0.0)

    @property
    def has_work(self) -> bool:
        """Due work from the last scan is waiting for a free worker."""
        return bool(self._backlog or self._due_parents or self._due_oneshots)

    def sleep_time(self, max_sleep: float) -> float:
        """How long to sleep: while due work waits, until a worker is free (it wakes us);
        else until the next job due, or a moment when a due job was held back."""
        if self.has_work:
            gathering = self._gather_left()
            return max_sleep if gathering is None else gathering
        sleep = max_sleep
        if self._wakeup is not None:
            sleep = min(sleep, max((self._wakeup - clock.now()).total_seconds(), 0))
        if self._retry_soon:
            sleep = min(sleep, RETRY_LOCKED.total_seconds())
        if self._bases:
            sleep = min(sleep, INSTANCES_POLL.total_seconds())
        return sleep

    def tick(self) -> TickResult:
        """One pass (``runjobs --once``): run every job due now once, side by side on the
        workers, and return when each is recorded (then :class:`TooManyAbandonedHandlers` if
        the pass stopped at that limit). With no due job: the clock and one read of the
        lease rows, whatever the number of jobs, and no thread."""
        if not self.jobs:
            return TickResult([], None)
        self.scan()
        runs: list[JobRun] = []
        wakeup = self._wakeup
        if self.has_work:
            pool = self._pool()
            try:
                while self.has_work and not self.stop.is_set():
                    self.hand_out(pool)
                    if self.has_work:
                        self.wake.wait(self._gather_left())
                        self.wake.clear()
            finally:
                pool.shutdown()
            self._give_up_if(pool)
            runs = pool.finished()
            self.scan()
            # Still due after this pass: acquisition passed a locked row by. Retry soon.
            wakeup = clock.now() + RETRY_LOCKED if self.has_work else self._wakeup
        now = clock.now()
        signals.send(signals.tick_finished, now=now)
        self.chores.run_due(now)
        return TickResult(runs, wakeup)

    def loop(self, *, max_ticks: int | None = None) -> None:
        """Run due jobs until :meth:`request_stop`: scan, hand out, sleep until the next slot
        (at most ``LOOP_MAX_SLEEP``) or a free worker; survive the database going away and
        any other error (logged, counted in :attr:`errors`), with backoff. On a stop, return
        once every worker's run is recorded; at ``MAX_ABANDONED_HANDLERS`` the same, then
        raise :class:`TooManyAbandonedHandlers`. One scan serves a stampede until handed
        out, unless a job of it was passed over: then rescan, at most every
        :data:`RESCAN_AFTER`."""
        max_sleep = get_settings().LOOP_MAX_SLEEP.total_seconds()
        # On PostgreSQL, ends are recorded here, several in one statement (lease.end_runs).
        self.unrecorded.deferring = lease.ends_together()
        pool = self._pool()
        # This runner's row: registered, then a beat every RUNNER_BEAT (never raises).
        presence = runners.Presence(self.jobs, pool.size)
        self.chores.add(Chore("orphan sweep", lambda: presence.interval, self.sweep_orphans))
        backoff, ticks = 0.5, 0
        try:
            while not self.stop.is_set():
                self.wake.clear()
                try:
                    if not (self._backlog or self._due_parents):
                        # Else the next claim records them, just before it claims.
                        self.unrecorded.record()
                    if not self.has_work:
                        if max_ticks is not None and ticks >= max_ticks:
                            break
                        ticks += 1
                        self.scan()
                        self._retry_soon = False
                        signals.send(signals.tick_finished, now=clock.now())
                    elif self._is_stale():
                        self.scan()
                    self.hand_out(pool)
                    sleep, backoff = self.sleep_time(max_sleep), 0.5
                except Exception as exc:
                    sleep, backoff = backoff, min(backoff * 2, max_sleep)
                    self._failed(exc, sleep)
                pool.finished()  # the loop keeps no history of its runs: drop them
                presence.beat(unrecorded_for=self.unrecorded.waited())
                self.chores.run_due()
                self.wake.wait(min(sleep, presence.due_in()))
        finally:
            pool.shutdown()
            self.unrecorded.deferring = False
            self._record_before_exit()
            presence.stop()
        self._give_up_if(pool)

    @staticmethod
    def sweep_orphans(now: datetime) -> None:
        """The loop's own chore, every beat: record the runs no acquisition will end (job
        deleted or paused) at most a beat after their lease ran out (:func:`lease.end_orphans`);
        a row held by a paused holder is waited for a bounded time, tried again next turn."""
        try:
            with db.bounded_wait():
                lease.end_orphans(now)
        except DatabaseError as exc:
            if not db.is_lock_timeout(exc):
                raise

    def _pool(self) -> Pool:
        return Pool(
            self.workers,
            max_abandoned=get_settings().MAX_ABANDONED_HANDLERS or self.workers,
            stop=self.stop,
            wake=self.wake,
            unrecorded=self.unrecorded,
        )

    def _failed(self, exc: Exception, retry_in: float) -> None:
        """A pass failed: log it and drop what it read. The database away is expected
        (reconnect); any other error is a fault: logged with its traceback and counted."""
        if isinstance(exc, DatabaseError):
            logger.error(
                "database unavailable, retrying in %.1fs: %s",
                retry_in,
                exc,
                extra={"event": "database_unavailable"},
            )
            connections.close_all()
        else:
            self.errors += 1
            logger.error(
                "the runner's loop failed (%d time(s) so far), going on in %.1fs: %s",
                self.errors,
                retry_in,
                exc,
                exc_info=exc,
                extra={"event": "loop_failed", "errors": self.errors},
            )
        self._backlog, self._due_parents, self._due_oneshots = [], [], []

    def _is_stale(self) -> bool:
        """The last scan is stale: a job from it was passed over (another process took it)
        and it is at least :data:`RESCAN_AFTER` old."""
        return (
            time.monotonic() - self._scanned >= RESCAN_AFTER.total_seconds()
            and self._passed_over > 0
        )

    def _record_before_exit(self) -> None:
        """Once the workers are done: record the ends still waiting (one try). A run left
        unrecorded reads running until its lease expires, then abandoned."""
        try:
            self.unrecorded.record()
        except Exception as exc:
            logger.warning(
                "could not record every run before exiting: %s",
                exc,
                exc_info=not isinstance(exc, DatabaseError),
                extra={"event": "record_failed"},
            )

    def _give_up_if(self, pool: Pool) -> None:
        """After a pool's shutdown at its limit of abandoned handlers: record what waits
        (one try) and raise :class:`TooManyAbandonedHandlers`."""
        if not pool.gave_up:
            return
        self._record_before_exit()
        raise TooManyAbandonedHandlers(pool.gave_up, pool.max_abandoned)


def tick(
    names: Sequence[str] | None = None, *, workers: int | None = None, chores: Iterable[Chore] = ()
) -> TickResult:
    """One pass over the named jobs (default: all): :meth:`Dispatcher.tick`, with no chore
    unless given some (``runjobs --once`` gives the app's)."""
    return Dispatcher(runnable_jobs(names), workers=workers, chores=chores).tick()


def loop(
    names: Sequence[str] | None = None,
    *,
    workers: int | None = None,
    max_ticks: int | None = None,
    chores: Iterable[Chore] | None = None,
) -> None:
    """:meth:`Dispatcher.loop` over the named jobs (default: all), with the app's chores
    unless given others. To stop it from elsewhere, make the :class:`Dispatcher` yourself."""
    if chores is None:
        chores = app_chores(loop=True)
    Dispatcher(runnable_jobs(names), workers=workers, chores=chores).loop(max_ticks=max_ticks)


def app_chores(*, loop: bool) -> list[Chore]:
    """The app's runner chores, asked of its app config: this module imports none of them."""
    config: Any = apps.get_app_config("fencedjobs")
    chores: list[Chore] = config.runner_chores(loop=loop)
    return chores


__all__ = [
    "Dispatcher",
    "Pool",
    "TickResult",
    "TooManyAbandonedHandlers",
    "abandoned_handlers",
    "app_chores",
    "loop",
    "tick",
]
