"""The tick, the worker pool and the loop: which due job runs when, and on which worker.

A runner process runs due jobs side by side on a bounded :class:`Pool` of worker threads.
The dispatching thread claims due rows for the free workers, as many as are free, in one
transaction (:func:`~django_fencedjobs.runner.claim`); each worker runs one claimed run at
a time (:func:`~django_fencedjobs.runner.run_acquired`: execute, record) on a database
connection of its own, kept from run to run and thrown away after a run that had to be
interrupted. A job is claimed only when a worker is free: a job waits unacquired rather
than sit behind a slow one with its lease taken, and that wait shows as lateness
(``started_at - scheduled_for``).

A :class:`Dispatcher` owns one runner's dispatching: its jobs, its pool, its stop and wake
events, the order it takes jobs due at the same instant in, and the runs it still has to
record. Its steps are the same for both ways of running:

* :meth:`Dispatcher.tick` is one pass (``runjobs --once``): scan, hand every job due now
  to the workers as they free up, and end when each is recorded.
* :meth:`Dispatcher.loop` (``runjobs``) repeats scan, hand out, sleep until asked to stop,
  sleeping until the earliest next slot or until a worker is free again.

:func:`tick` and :func:`loop` make a dispatcher for the named jobs (every job by default)
and run it.

A worker whose handler was given up on (it did not return at its timeout plus the grace:
:mod:`~django_fencedjobs.supervisor`) is replaced at once; the stuck thread is retired and
ends by itself whenever its handler returns. Such threads are counted while they run
(:func:`abandoned_handlers`). When a runner holds as many as its limit
(``MAX_ABANDONED_HANDLERS``, by default its number of workers), it stops as on a stop
request and :func:`tick` or :func:`loop` raises :class:`TooManyAbandonedHandlers`: nothing
but the end of the process ends those threads, so ``runjobs`` exits for its supervisor to
start a new one.
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
from django_fencedjobs.runner import (
    Acquired,
    Unrecorded,
    claim,
    claim_oneshots,
    run_acquired,
)

logger = logging.getLogger("django_fencedjobs")

#: A job that was due but could not be acquired (its row locked by a run inside a fenced
#: transaction) is tried again after this long, not in a busy loop.
RETRY_LOCKED = timedelta(seconds=1)

#: A loop that runs instances looks at them again at least this often: an instance created
#: or changed to fire before the loop's planned wakeup is seen within this long (one read
#: of an index, whatever the number of instances: bench P10).
INSTANCES_POLL = timedelta(seconds=1)

#: Due instances and some of the workers busy: wait this long at most for them to free up,
#: so that one claim serves every worker (in a stampede the workers free up one after
#: another, and a claim costs a transaction whatever its size).
CLAIM_GATHER = timedelta(milliseconds=10)

#: How many due jobs of the last scan a claim offers per free worker: while other runners
#: drain the same jobs, some of those offered were taken already, and the claim takes a
#: worker's worth of those still due (the rest stay for the next claim), rather than come
#: back short and scan again.
OFFERED_PER_WORKER = 4

#: While other processes drain the same due jobs (a fleet), the loop reads the due rows
#: again after a job was passed over, at most this often: what it read is going stale.
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
        self.count = count
        self.limit = limit


#: Every pool of this process that may still have a thread: a pool lives as long as one of
#: its threads does (each runs a method of it), abandoned ones included.
_pools: weakref.WeakSet[Pool] = weakref.WeakSet()
#: Whether this process has run jobs (made a pool): only such a process reports
#: :func:`abandoned_handlers`.
_runs_jobs = threading.Event()


def abandoned_handlers() -> int | None:
    """How many handlers this process gave up on are still running (their threads have not
    returned); None in a process that has run no job (a web process)."""
    if not _runs_jobs.is_set():
        return None
    return sum(pool.abandoned() for pool in list(_pools))


@dataclass
class _Worker:
    #: Set when the worker's handler was given up on: the thread takes no more work.
    retired: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None


class Pool:
    """``size`` worker threads, started as they are first needed.

    :meth:`submit` hands a due job to a free worker (the caller checks :meth:`free`
    first); :meth:`finished` returns what has been recorded since. Thread-safe for one
    dispatching thread, which ``wake`` wakes whenever a worker becomes free.

    A worker whose handler is given up on is replaced; its thread is counted
    (:meth:`abandoned`) until it returns. When ``max_abandoned`` of them (default:
    ``size``) are running at once, the pool sets ``stop`` (no further job starts; each run
    in progress stops between batches and is recorded) and :attr:`gave_up` says how many
    there were. A run whose end cannot be recorded goes to ``unrecorded``.
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
        """Run a claimed run on a free worker."""
        with self._lock:
            name = acquired.lease_name
            if len(self._busy) >= self.size or name in self._busy:
                raise RuntimeError(f"no free worker for {name}")
            self._busy.add(name)
            idle = len(self._busy) > sum(1 for w in self._workers if not w.retired.is_set())
            if idle:
                self._start_worker()
        self._work.put(acquired)

    def abandoned(self) -> int:
        """How many handlers this pool gave up on are still running."""
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

    # -- the workers ---------------------------------------------------------------------

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
            # The supervisor recorded the run and ended its session; this worker is stuck
            # in the handler. Free its place for a new worker, and count the stuck thread
            # until it returns: past the limit, stop taking runs (the runner exits).
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
    or past a positive ``CONN_MAX_AGE``; keep it otherwise.

    Django's default ``CONN_MAX_AGE`` of 0 closes a connection at the end of each web
    request. A worker has no requests: read that way, it would open a new session, a new
    server process on PostgreSQL, for every run. Its connection lives as long as it does.
    """
    if connection.settings_dict.get("CONN_MAX_AGE") == 0:
        connection.close_at = None
    connection.close_if_unusable_or_obsolete()


@dataclass
class TickResult:
    runs: list[JobRun]
    #: When the earliest of the considered jobs can next be acquired (None: no job).
    next_wakeup: datetime | None


class Dispatcher:
    """One runner's dispatching: its jobs, its pool of workers, the events that stop and
    wake it, the order of its jobs due at the same instant, and its runs still to record.

    ``runjobs`` makes one and stops it from its signal handlers (:meth:`request_stop`);
    :func:`tick` and :func:`loop` make one per call.

    ``chores``: what it does beside its runs after each pass (:mod:`django_fencedjobs.chores`;
    ``runjobs`` gives the app's, :meth:`~django_fencedjobs.apps.FencedJobsConfig.runner_chores`).
    Its loop adds its own, the orphan sweep (:meth:`sweep_orphans`).
    """

    def __init__(
        self, jobs: Sequence[Job], *, workers: int | None = None, chores: Iterable[Chore] = ()
    ) -> None:
        self.jobs = list(jobs)
        self.workers = workers or default_workers()
        self.chores = Chores(chores)
        #: Set to stop: no further job starts, each run in progress stops between batches
        #: and is recorded (``run.stopping``).
        self.stop = threading.Event()
        #: Wakes the dispatching thread: a worker became free, or a stop was requested.
        self.wake = threading.Event()
        #: Runs whose end could not be recorded (the database was away): retried first.
        self.unrecorded = Unrecorded()
        #: The jobs with a schedule, by name: scanned by name (lease.scan).
        self._by_name = {job.name: job for job in self.jobs if not job.instances}
        #: The jobs whose instances have the schedules: claimed by an index (claim).
        self._bases = {job.name: job for job in self.jobs if job.instances}
        #: The jobs with instances due at the last look, the earliest due first; emptied
        #: when a claim comes up short (none left that could be claimed now).
        self._due_parents: list[str] = []
        #: The jobs with backfill slots or one-offs due at the last look (the same).
        self._due_oneshots: list[str] = []
        #: When a claim was put off to gather free workers (monotonic), if it was.
        self._gathering: float | None = None
        self._tiebreaks: dict[str, float] = {}
        #: Due rows of the latest scan not handed out yet, and when the next job not due
        #: then can be acquired.
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
        """This dispatcher's place for job ``name`` among jobs due at the same instant: a
        random number drawn once. Several runners that read the same stampede of due jobs
        then start at different ends of it, instead of each trying the jobs another has
        just taken, one failed acquisition after another."""
        try:
            return self._tiebreaks[name]
        except KeyError:
            return self._tiebreaks.setdefault(name, random.random())

    # -- the steps -----------------------------------------------------------------------

    def scan(self) -> list[lease.LeaseRow]:
        """Read the due rows, earliest slot first, and the next wakeup: one read of the lease
        rows (after creating or rescheduling the rows of new or changed jobs). Returns the
        due rows, which :meth:`hand_out` hands out from."""
        names = list(self._by_name)
        now = clock.now()
        self._backlog, self._wakeup = [], None
        if names:
            seen = lease.scan(names, now)
            if sync(list(self._by_name.values()), now, seen.fingerprints):
                seen = lease.scan(names, now)
            self._backlog = sorted(seen.due, key=lambda r: (r.next_run_at, self.tiebreak(r.name)))
            self._wakeup = seen.wakeup
        if self._bases:
            self._scan_instances(now)
        self._scan_oneshots(now)
        self._scanned = time.monotonic()
        self._passed_over = 0
        return list(self._backlog)

    def _scan_instances(self, now: datetime) -> None:
        """When each job's next instance is due (one read of the index): the jobs with due
        instances, earliest first, for :meth:`hand_out` to claim from; else a wakeup."""
        wakeups = lease.instances_wakeups(list(self._bases))
        due = sorted((at, name) for name, at in wakeups.items() if at <= now)
        self._due_parents = [name for _, name in due]
        later = [at for at in wakeups.values() if at > now]
        if later:
            earliest = min(later)
            self._wakeup = earliest if self._wakeup is None else min(self._wakeup, earliest)

    def _scan_oneshots(self, now: datetime) -> None:
        """The jobs with due backfill slots or one-offs, and when the next one is due (one
        read of their index)."""
        wakeups = lease.oneshot_wakeups([job.name for job in self.jobs])
        self._due_oneshots = sorted(name for name, at in wakeups.items() if at <= now)
        later = [at for at in wakeups.values() if at > now]
        if later:
            earliest = min(later)
            self._wakeup = earliest if self._wakeup is None else min(self._wakeup, earliest)

    def hand_out(self, pool: Pool) -> None:
        """Claim due rows of the last scan for the free workers, earliest first, and hand
        them out: the due jobs (by name, this runner's tiebreak first among those due at
        the same instant), then due instances, in one claim (:func:`claim`), after the ends
        of the runs that freed the workers; then backfill slots and one-offs. A job the
        claim passes over (another runner took it, or holds its row) waits for a later
        scan."""
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
                # Other runners are draining these jobs: what is left of them (once a pass:
                # a row held locked stays due).
                self.scan()
                rescanned = True
        free = pool.free()
        if self._due_oneshots and free and not self.stop.is_set():
            # Backfill slots and one-offs, claimed as instances are.
            oneshots = claim_oneshots(self._due_oneshots, free)
            for acquired in oneshots:
                pool.submit(acquired)
            if len(oneshots) < free:
                self._due_oneshots = []
                self._retry_soon = True

    def _claim_for(self, pool: Pool, free: int) -> None:
        """One claim for ``free`` workers: the next due jobs of the backlog (up to
        :data:`OFFERED_PER_WORKER` per worker offered, a worker's worth taken), then due
        instances; each run claimed goes to a worker."""
        self.unrecorded.record()
        window = self._backlog[: free * OFFERED_PER_WORKER]
        due = {name: self._bases[name] for name in self._due_parents}
        claimed = claim(
            free, named={row.name: self._by_name[row.name] for row in window}, bases=due
        )
        for acquired in claimed:
            pool.submit(acquired)
        taken = {acquired.lease_name for acquired in claimed}
        # A worker's worth taken: the others offered may be due still. Fewer: every other
        # one offered is taken by another runner, or held (looked at again after a scan).
        short = sum(1 for row in window if row.name in taken) < free
        passed = [] if not short else [row.name for row in window if row.name not in taken]
        for name in passed:
            self._passed_over += 1
            self._retry_soon = True
            logger.debug(
                "%s: another runner took this slot first, or holds the row; passed over",
                name,
                extra={"event": "passed_over", "job": name},
            )
        kept = [row for row in window if row.name not in taken] if not short else []
        self._backlog = kept + self._backlog[len(window) :]
        # Fewer than asked for: no due instance is left that could be claimed now (the rest,
        # if any, are locked or held: looked at again in a moment).
        if len(claimed) < free and self._due_parents:
            self._due_parents = []
            self._retry_soon = True

    def _gather(self, pool: Pool, free: int) -> bool:
        """Whether to put the claim off for a moment (:data:`CLAIM_GATHER`): some workers
        are busy, and it was not put off that long already."""
        if free >= pool.size:
            self._gathering = None
            return False
        now = time.monotonic()
        if self._gathering is None:
            self._gathering = now
        if now - self._gathering < CLAIM_GATHER.total_seconds():
            return True
        self._gathering = None
        return False

    def _ends_wait(self) -> bool:
        """Due rows wait for workers: the ends of the runs that free them wait for the
        next claim, which records them just before it claims (:meth:`hand_out`), several
        in one statement. It comes as soon as every worker is free, or
        :data:`CLAIM_GATHER` after the first."""
        return bool(self._backlog or self._due_parents)

    def _gather_left(self) -> float | None:
        """Seconds until a claim put off to gather workers is made anyway; None if none is."""
        if self._gathering is None:
            return None
        return max(CLAIM_GATHER.total_seconds() - (time.monotonic() - self._gathering), 0.0)

    @property
    def has_work(self) -> bool:
        """Due work from the last scan is waiting for a free worker: due jobs, or due
        instances not claimed yet."""
        return bool(self._backlog or self._due_parents or self._due_oneshots)

    def sleep_time(self, max_sleep: float) -> float:
        """How long to sleep: until a worker is free while due jobs wait (it wakes us),
        else until the next job not due at the last scan, however busy the others, and a
        moment when a due job was held back."""
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

    # -- the two ways to run -------------------------------------------------------------

    def tick(self) -> TickResult:
        """One pass: run every job due now once, side by side on the workers, and return
        when each is recorded (``runjobs --once``). Due jobs beyond the workers wait for one
        to be free.

        Raises :class:`TooManyAbandonedHandlers` once every run of the pass is recorded, if
        so many of its handlers were given up on that the pass stopped taking runs.

        With no due job this issues a constant number of queries, whatever the number of
        registered jobs: the clock, and one read of the lease rows (:func:`lease.scan`,
        whose cost barely grows with the number of jobs either); and starts no thread.
        """
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
        """Run due jobs until :meth:`request_stop`: scan, hand out, sleep until the earliest
        next slot (at most ``LOOP_MAX_SLEEP``) or until a worker is free; survive the
        database going away by reconnecting with backoff, and any other error by logging
        and counting it (:attr:`errors`), with the same backoff. On a stop request, return once
        every worker's run is recorded. When the workers' handlers given up on and still
        running reach ``MAX_ABANDONED_HANDLERS``, stop the same way, then raise
        :class:`TooManyAbandonedHandlers`.

        One scan serves until its due jobs are all handed out: when many jobs are due at
        once (a stampede), each freed worker takes the next one from that scan instead of
        the loop reading every row again. When a job from it could not be acquired (other
        runners are draining the same jobs), the scan is stale: the loop scans again, at
        most every :data:`RESCAN_AFTER`, rather than try every job the others have run
        meanwhile.
        """
        max_sleep = get_settings().LOOP_MAX_SLEEP.total_seconds()
        # On PostgreSQL the ends of runs whose handler returned are recorded here, several
        # in one statement, at the next pass (lease.end_runs).
        self.unrecorded.deferring = lease.ends_together()
        pool = self._pool()
        #: This runner's row: registered, then a beat every RUNNER_BEAT (never raises).
        presence = runners.Presence(self.jobs, pool.size)
        self.chores.add(Chore("orphan sweep", lambda: presence.interval, self.sweep_orphans))
        backoff, ticks = 0.5, 0
        try:
            while not self.stop.is_set():
                self.wake.clear()
                try:
                    if not self._ends_wait():
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

    # -- helpers ---------------------------------------------------------------------------

    @staticmethod
    def sweep_orphans(now: datetime) -> None:
        """The loop's own chore, every beat: record the runs that no acquisition will end
        (their job deleted, or paused) at most a beat after their lease ran out
        (:func:`lease.end_orphans`). A row held by a paused holder's transaction is waited
        for a bounded time, and tried again at the next turn."""
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
        """A pass of the loop failed: log it, drop what the pass had read, and go on after
        ``retry_in`` seconds. The database away is the expected failure (reconnect); any
        other is a fault of ours or of a job's code: logged with its traceback and counted
        (:attr:`errors`), and it does not end the loop either."""
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
        """After a pool's shutdown: if it stopped at its limit of abandoned handlers, record
        what could not be recorded yet (one try) and raise
        :class:`TooManyAbandonedHandlers`."""
        if not pool.gave_up:
            return
        self._record_before_exit()
        raise TooManyAbandonedHandlers(pool.gave_up, pool.max_abandoned)


def default_workers() -> int:
    return get_settings().WORKERS


def tick(
    names: Sequence[str] | None = None,
    *,
    workers: int | None = None,
    chores: Iterable[Chore] = (),
) -> TickResult:
    """One pass over the named jobs (every job by default): :meth:`Dispatcher.tick`. For
    tests and scripts: it does no chore unless given some (``runjobs --once`` gives the
    app's)."""
    return Dispatcher(runnable_jobs(names), workers=workers, chores=chores).tick()


def loop(
    names: Sequence[str] | None = None,
    *,
    workers: int | None = None,
    max_ticks: int | None = None,
    chores: Iterable[Chore] | None = None,
) -> None:
    """Run the named jobs (every job by default) for ``max_ticks`` scans, or until the
    abandoned handlers' limit: :meth:`Dispatcher.loop`, with the app's chores unless
    given others (:meth:`~django_fencedjobs.apps.FencedJobsConfig.runner_chores`). To stop
    it from another thread or a signal handler, make the :class:`Dispatcher` and call its
    :meth:`request_stop`."""
    if chores is None:
        chores = app_chores(loop=True)
    Dispatcher(runnable_jobs(names), workers=workers, chores=chores).loop(max_ticks=max_ticks)


def app_chores(*, loop: bool) -> list[Chore]:
    """The app's runner chores, asked of its app config (where the app is wired), so that
    this module needs none of the modules they come from."""
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
