"""The thread that watches one run from beside its handler: it renews the lease, enforces
the timeout, and ends a run whose handler will not stop (docs/running.md, "Timeouts").

A renewal that finds the fence gone (a successor took over) stops the run; at the timeout
the run is *revoked* and recorded ``timed_out`` at once. Stopping the handler takes up to
three steps, each for what the one before cannot reach: ``JobTimeout`` (or ``FenceLost``)
raised inside it every :data:`INTERRUPT_EVERY` seconds (``BaseException``s, which its
``except Exception:`` cannot swallow; see also ``fencing._raise_if_stopped``); if it blocks
where no exception lands while holding the lease row, the transaction its latest fenced
block registered ended on the server; after :data:`GRACE`, the handler given up on.

Renewal never waits on its own handler: one that finds the lease row locked (the handler is
in a fenced transaction) waits at most until the next check, then tries again at once. While
the handler holds that lock no acquirer can take the lease over (they pass a locked row by),
and the queued renewal goes through the moment the handler commits, before any acquirer can
see an expired lease. Liveness only: a paused process pauses this thread too; the fence
check in ``fenced_atomic`` is what stops a stale holder.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections

from django_fencedjobs import clock, db, lease, outcomes
from django_fencedjobs.exceptions import FenceLost, JobTimeout, RunAborted, RunReplaced
from django_fencedjobs.models import Outcome

if TYPE_CHECKING:
    from django_fencedjobs.runstate import RunState

logger = logging.getLogger("django_fencedjobs")

#: Never renew more often than this, whatever the TTL.
MIN_RENEW_INTERVAL = 0.05
#: How often the interrupt is raised again in a handler that has not returned.
INTERRUPT_EVERY = 0.1
#: How long a handler interrupted at its timeout (or on losing its fence) may take to
#: return before it is given up on.
GRACE = 5.0
#: How long the revocation waits for a lease row the handler holds before ending the
#: handler's database session.
REVOKE_WAIT = 0.5


def _async_raise(thread_id: int, exc_type: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc_type) if exc_type else None
    )


class Supervisor(threading.Thread):
    """Started by the runner in the handler's thread, just before the handler is called.
    ``end(state, outcome, error, wait=seconds)`` is the runner's one function that records a
    run's end (raising ``DatabaseError`` when it could not); ``on_abandon()`` tells the runner
    that the handler was given up on."""

    def __init__(
        self,
        state: RunState,
        *,
        end: Callable[..., Any],
        on_abandon: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(name=f"fencedjobs-supervisor:{state.job.name}", daemon=True)
        self.state = state
        self._end = end
        self._on_abandon = on_abandon
        self.target_thread = threading.get_ident()
        #: SQLite: the handler's connection, to close if it holds the database's write lock
        #: outside a fenced block. (A fenced block registers its transaction on the run.)
        self._raw = db.holds_write_lock(connections[db.lease_db()])
        self._done = threading.Event()
        self._guard = threading.Lock()
        self._armed = True
        #: The exception delivered to the handler, if any.
        self.fired: type[RunAborted] | None = None
        #: Why the supervisor stopped the run, whether or not the interrupt reached the
        #: handler (inside a database call it may fail on its transaction being ended instead).
        self.stopped_by: type[RunAborted] | None = None
        #: True once the handler was given up on (it did not return within the grace).
        self.abandoned = False

    # -- called from the handler's thread ------------------------------------------------

    def disarm(self) -> None:
        """The handler has returned: deliver nothing from now on, cancel anything pending. A
        pending interrupt may still surface inside this call; the runner catches it around
        the handler either way, and :attr:`fired` says what happened."""
        with self._guard:
            self._armed = False
            if self.fired is not None:
                _async_raise(self.target_thread, None)
        self._done.set()

    # -- the thread ------------------------------------------------------------------------

    def run(self) -> None:
        run = self.state
        deadline = time.monotonic() + run.job.run_timeout.total_seconds()
        reason: type[RunAborted] = JobTimeout
        if run.replace_by is not None and run.replace_by < deadline:  # overlap="replace"
            deadline, reason = run.replace_by, RunReplaced
        interval = max(run.job.lease_ttl.total_seconds() / 3, MIN_RENEW_INTERVAL)
        wait = interval
        try:
            while True:
                remaining = deadline - time.monotonic()
                if self._done.wait(max(min(wait, remaining), 0)):
                    return
                if time.monotonic() >= deadline:
                    # A process paused past its lease meets its deadline when it resumes,
                    # too: if a successor has taken over meanwhile, that is what ended it.
                    lost = self._renew(REVOKE_WAIT) is False
                    self._stop_handler(FenceLost if lost else reason)
                    return
                renewed = self._renew(min(interval, max(deadline - time.monotonic(), 0.01)))
                if renewed is False:
                    self._stop_handler(FenceLost)
                    return
                # Locked by the handler's own transaction: queue behind it again at once.
                wait = interval if renewed else 0
        finally:
            connections.close_all()  # this thread's connections only

    def _renew(self, wait: float) -> bool | None:
        """True: renewed. False: the fence is gone. None: the row is locked (by the handler's
        own fenced transaction, or a takeover in progress); try again."""
        run = self.state
        try:
            with db.bounded_wait(wait):
                until = clock.now() + run.job.lease_ttl
                capped = run.replace_by is not None
                return lease.renew(run.lease_name, run.fence, until, to_next_slot=capped)
        except DatabaseError as exc:
            if db.is_lock_timeout(exc):
                return None
            # Transient (a restart): the lease has slack until it expires; try again.
            logger.warning(
                "lease renewal failed: %s",
                exc,
                extra={"event": "renew_failed", "job": run.job.name, "fence": run.fence},
            )
            connections[db.lease_db()].close()
            return True

    def _stop_handler(self, reason: type[RunAborted]) -> None:
        run = self.state
        self.stopped_by = reason
        run.stop()  # every fenced block and helper of the run fails from now on
        self._interrupt(reason)
        if reason is JobTimeout:
            logger.error(
                "run of %s timed out after %s",
                run.job.name,
                run.job.run_timeout,
                extra={"event": "run_timed_out", "job": run.job.name, "fence": run.fence},
            )
            self._revoke(Outcome.TIMED_OUT, outcomes.timed_out(run.job))
        elif reason is RunReplaced:
            logger.warning(
                "run of %s is still going at the job's next slot: replaced by that slot's run",
                run.job.name,
                extra={"event": "run_replaced", "job": run.job.name, "fence": run.fence},
            )
            self._revoke(Outcome.REPLACED, outcomes.replaced(run.job))
        else:
            logger.warning(
                "fence lost: another run took over job %s; stopping this run",
                run.job.name,
                extra={"event": "fence_lost", "job": run.job.name, "fence": run.fence},
            )
        grace_ends = time.monotonic() + GRACE
        while not self._done.wait(INTERRUPT_EVERY):
            if time.monotonic() >= grace_ends:
                self._abandon(reason)
                return
            self._interrupt(reason)

    def _revoke(self, outcome: str, error: str) -> None:
        """Revoke the lease and record the run ``outcome`` (timed out, replaced): the
        handler may hold the lease row (inside a fenced transaction); after
        :data:`REVOKE_WAIT`, end its session."""
        run = self.state
        try:
            self._end(run, outcome, error, wait=REVOKE_WAIT)
            return
        except DatabaseError:
            connections[db.lease_db()].close()
        self._end_transaction()
        try:
            self._end(run, outcome, error, wait=db.LOCK_WAIT)
        except DatabaseError as exc:
            # The runner records it when the handler returns, or on giving up.
            connections[db.lease_db()].close()
            logger.warning(
                "could not revoke the %s run of %s yet: %s",
                outcome,
                run.job.name,
                exc,
                extra={"event": "revoke_deferred", "job": run.job.name, "fence": run.fence},
            )

    def _end_transaction(self) -> None:
        """End the handler's open fenced transaction, if any (:func:`lease.end_transaction`):
        the one its latest fenced block registered, on whichever connection it was made;
        nothing else is touched. SQLite without a fenced block: close the handler's connection."""
        held = self.state.held
        try:
            if held is not None:
                lease.end_transaction(held)
            elif self._raw is not None:
                self._raw.close()
        except Exception:
            logger.warning("could not end the run's database transaction", exc_info=True)

    def _abandon(self, reason: type[RunAborted]) -> None:
        run = self.state
        self.abandoned = True
        self._end_transaction()
        if reason is JobTimeout:
            outcome, error = Outcome.TIMED_OUT, outcomes.timed_out(run.job)
        elif reason is RunReplaced:
            outcome, error = Outcome.REPLACED, outcomes.replaced(run.job)
        else:
            outcome, error = Outcome.FENCE_LOST, outcomes.fence_lost(run.fence)
        try:
            self._end(run, outcome, error)
            fate = "its fence is dead, so no fenced block of it can commit"
        except DatabaseError:
            logger.warning("recording the abandoned run failed", exc_info=True)
            fate = "its run could not be recorded yet; its lease expires after lease_ttl"
        logger.error(
            "gave up on the handler of %s: it did not return within %.0fs of being stopped "
            "(blocked in a call no interrupt reaches); its open fenced transaction, if any, "
            "was ended and %s",
            run.job.name,
            GRACE,
            fate,
            extra={"event": "handler_abandoned", "job": run.job.name, "fence": run.fence},
        )
        if self._on_abandon is not None:
            self._on_abandon()

    def _interrupt(self, exc_type: type[RunAborted]) -> None:
        with self._guard:
            if not self._armed:
                return
            self.fired = exc_type
            _async_raise(self.target_thread, exc_type)
