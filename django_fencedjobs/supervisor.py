"""The thread that watches one run: it renews the lease and enforces the timeout.

Renewing keeps a healthy run's lease from expiring while the handler computes. If a
renewal finds the fence gone (the run was paused past its lease and a successor took
over), the run is stopped at once. At the timeout the lease is *revoked*: the fence is
incremented, so the handler's next fenced write fails however long it keeps running,
and :class:`JobTimeout` is raised inside the handler to stop it sooner.

Liveness only: neither renewal nor the interrupt is what makes the run safe. A paused
process pauses this thread too; the fence check in ``fenced_atomic`` is what stops a
stale holder.

The interrupt is delivered with ``PyThreadState_SetAsyncExc``: it lands at the handler's
next Python bytecode, so a handler blocked in a long C call (a socket read, a slow query)
sees it when that call returns. The revocation has already taken effect by then.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from typing import TYPE_CHECKING

from django.db import DatabaseError, connections

from django_fencedjobs import clock, lease
from django_fencedjobs.exceptions import FencedJobsError, FenceLost, JobTimeout

if TYPE_CHECKING:
    from django_fencedjobs.runner import Run

logger = logging.getLogger("django_fencedjobs")

#: Never renew more often than this, whatever the TTL.
MIN_RENEW_INTERVAL = 0.05
#: How long the revocation of a timed-out run waits for the lease row.
REVOKE_LOCK_WAIT = 2.0


def _async_raise(thread_id: int, exc_type: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc_type) if exc_type else None
    )


class Supervisor(threading.Thread):
    def __init__(self, run: Run) -> None:
        super().__init__(name=f"fencedjobs-supervisor:{run.job.name}", daemon=True)
        self.run_ = run
        self.target_thread = threading.get_ident()
        self._done = threading.Event()
        self._guard = threading.Lock()
        self._armed = True
        #: The exception delivered to the handler, if any.
        self.fired: type[FencedJobsError] | None = None
        #: True once this thread revoked the lease and recorded the run as timed out.
        self.revoked = False

    # -- called from the handler's thread ------------------------------------------------

    def disarm(self) -> None:
        """The handler has returned: deliver nothing from now on, cancel anything pending.

        A pending interrupt may still surface inside this call; the runner catches it
        around the handler either way, and :attr:`fired` says what happened.
        """
        with self._guard:
            self._armed = False
            if self.fired is not None:
                _async_raise(self.target_thread, None)
        self._done.set()

    # -- the thread ------------------------------------------------------------------------

    def run(self) -> None:
        run = self.run_
        deadline = time.monotonic() + run.job.run_timeout.total_seconds()
        interval = max(run.job.lease_ttl.total_seconds() / 3, MIN_RENEW_INTERVAL)
        try:
            while True:
                remaining = deadline - time.monotonic()
                if self._done.wait(max(min(interval, remaining), 0)):
                    return
                if time.monotonic() >= deadline:
                    self._time_out()
                    return
                if not self._renew():
                    return
        finally:
            connections.close_all()  # this thread's connections only

    def _renew(self) -> bool:
        run = self.run_
        try:
            renewed = lease.renew(run.job.name, run.fence, clock.now() + run.job.lease_ttl)
        except DatabaseError as exc:
            # Transient (a restart, SQLite's write lock held by a long transaction): the
            # lease has slack until it expires; try again next interval.
            logger.warning(
                "lease renewal failed: %s",
                exc,
                extra={"event": "renew_failed", "job": run.job.name, "fence": run.fence},
            )
            connections[lease.lease_db()].close()
            return True
        if renewed:
            return True
        run.lost = True
        logger.warning(
            "fence lost: another run took over job %s; stopping this run",
            run.job.name,
            extra={"event": "fence_lost", "job": run.job.name, "fence": run.fence},
        )
        self._interrupt(FenceLost)
        return False

    def _time_out(self) -> None:
        """Revoke the lease, record the run as timed out, and interrupt the handler.

        The revocation waits at most :data:`REVOKE_LOCK_WAIT` for the lease row: the
        handler may be inside a fenced transaction that holds it. Then the interrupt goes
        first, the handler's transaction rolls back, and the runner revokes as it records
        the outcome (:attr:`revoked` tells it which happened).
        """
        run = self.run_
        try:
            self.revoked = lease.revoke_timed_out(run, wait=REVOKE_LOCK_WAIT)
        except DatabaseError as exc:
            logger.warning(
                "could not revoke the timed-out run yet (%s); interrupting it first",
                exc,
                extra={"event": "revoke_deferred", "job": run.job.name, "fence": run.fence},
            )
            connections[lease.lease_db()].close()
        run.lost = True
        logger.error(
            "run timed out after %s",
            run.job.run_timeout,
            extra={
                "event": "run_timed_out",
                "job": run.job.name,
                "fence": run.fence,
                "revoked": self.revoked,
            },
        )
        self._interrupt(JobTimeout)

    def _interrupt(self, exc_type: type[FencedJobsError]) -> None:
        with self._guard:
            if not self._armed:
                return
            self._armed = False
            self.fired = exc_type
            _async_raise(self.target_thread, exc_type)
