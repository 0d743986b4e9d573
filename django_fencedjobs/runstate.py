"""What the runner knows of one run, beside its handler (which sees a
:class:`~django_fencedjobs.run.Run`): :class:`RunState`, shared by the runner, the run's
supervisor and its fenced blocks, whose fence holder it is."""

from __future__ import annotations

import threading
import time
from collections.abc import Generator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django_fencedjobs import lease, outcomes
from django_fencedjobs.exceptions import FenceLost
from django_fencedjobs.models import JobRun
from django_fencedjobs.savepoints import Ledger

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from django_fencedjobs.registry import Job

WatermarkValue = datetime | int


@dataclass
class Progress:
    """What a run's fenced transactions did: items, batches completed, default watermark."""

    items: int = 0
    batches: int = 0
    watermark: str | None = None

    def __bool__(self) -> bool:
        return bool(self.items or self.batches or self.watermark is not None)

    def add(self, other: Progress) -> None:
        self.items += other.items
        self.batches += other.batches
        if other.watermark is not None:
            self.watermark = other.watermark


class RunState:
    """One run as its runner, its supervisor and its fenced blocks see it."""

    def __init__(
        self,
        job: Job,
        record: JobRun,
        *,
        watermarks: dict[str, WatermarkValue],
        stop_requested: threading.Event | None = None,
        lease_name: str | None = None,
        replace_in: float | None = None,
    ) -> None:
        self.job = job
        #: ``overlap="replace"``: when the supervisor stops the run (the next slot), on the
        #: monotonic clock; its lease is never renewed past that slot.
        self.replace_by = None if replace_in is None else time.monotonic() + replace_in
        #: The lease row the run holds (fence, renewals, end, watermarks): the job's own,
        #: or a backfill slot's or one-off's.
        self.lease_name = job.name if lease_name is None else lease_name
        self.record = record
        self.fence: int = record.fence
        #: Set when the runner was asked to stop: the handler's helpers stop between batches.
        self.stop_requested = stop_requested or threading.Event()
        #: The watermarks as committed: what ``windows()`` goes on from.
        self.watermarks = dict(watermarks)
        #: Batches (windows, claimed batches) begun: what ``max_batches`` caps.
        self.batch_count = 0
        #: The run stopped at ``max_batches`` with work left.
        self.capped = False
        #: The run stopped between batches because the process was asked to stop.
        self.interrupted = False
        #: Items counted outside any fenced block (added when the run is recorded).
        self.loose_items = 0
        #: The transaction of the run's latest fenced block: what the supervisor ends if the
        #: handler will not stop (only while still open: a stale one is harmless).
        self.held: lease.HeldTransaction | None = None
        #: The handler's open ``windows()`` and ``batches()`` generators.
        self.iterators: list[Generator[Any, None, None]] = []
        #: True while :meth:`close_iterators` closes them after the handler failed.
        self.aborting = False
        self.stopped = False  # set by stop()
        self._pending: Ledger[Progress] | None = None

    def stop(self) -> None:
        """The run is over (its fence gone, or recorded): every fenced block and helper of
        it fails from now on, in whichever thread."""
        self.stopped = True

    def stopped_error(self) -> FenceLost | None:
        """The error every fenced block and helper raises once the run was stopped."""
        return FenceLost(outcomes.fence_gone(self.job, self.fence)) if self.stopped else None

    def raise_if_stopped(self) -> None:
        """Raise :meth:`stopped_error`'s error, if any: the handler's helpers call it."""
        error = self.stopped_error()
        if error is not None:
            raise error

    def check_fence(self, connection: BaseDatabaseWrapper) -> None:
        """Check and lock the run's fence as the first statement of a fenced block's
        transaction (:class:`FenceLost` when it is gone); that transaction is the one the
        supervisor would end, and may sit idle no longer than the lease lasts."""
        job = self.job
        held = lease.guard(connection, self.lease_name, self.fence, job.exclusion, job.lease_ttl)
        if held is None:
            if job.exclusion != "advisory":
                self.stop()
            raise FenceLost(outcomes.fence_refused(job, self.fence))
        self.held = held
        self._pending = Ledger(connection.alias)  # a new transaction: nothing of it is done

    def note(self, progress: Progress) -> None:
        """Note what the open fenced transaction did, at the savepoint level it did it: a
        savepoint that rolls back takes its part with it (:class:`Ledger`)."""
        if self._pending is not None:
            self._pending.note(progress)

    def save_progress(self, connection: BaseDatabaseWrapper) -> None:
        """Called by ``fenced_atomic`` just before the run's outermost fenced block commits:
        what it did (items, completed batches, the watermark) goes on the run's row in the
        same transaction, so the row says what committed whoever records the run's end (the
        run, its supervisor, a successor finding it abandoned after a SIGKILL)."""
        ledger, self._pending = self._pending, None
        progress = Progress()
        for done in ledger.kept() if ledger is not None else ():
            progress.add(done)
        if not progress:
            return
        table = connection.ops.quote_name(JobRun._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET items = items + %s, batches = batches + %s,"
                " watermark_after = COALESCE(%s, watermark_after) WHERE id = %s",
                [progress.items, progress.batches, progress.watermark, self.record.pk],
            )

    def close_iterators(self, *, abort: bool) -> None:
        """The handler returned (or failed, ``abort``): end its open windows and batches (a
        failed one's open batch rolls back)."""
        self.aborting = abort
        for gen in self.iterators:
            gen.close()
        self.iterators.clear()


__all__ = ["Progress", "RunState", "WatermarkValue"]
