"""What a job's handler touches: the :class:`Run` it receives and the :class:`Window` it
iterates over. What the runner keeps beside it is its :class:`~.runstate.RunState`."""

from __future__ import annotations

import functools
import operator
import reprlib
import threading
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import connections, transaction
from django.db.models import Model, Q, QuerySet
from django.utils import timezone as dj_timezone

from django_fencedjobs import clock, db, lease
from django_fencedjobs.exceptions import NotInRun, WatermarkError
from django_fencedjobs.fencing import FencedAtomic, current_holder, in_fenced_block
from django_fencedjobs.instants import iso_utc
from django_fencedjobs.models import RunKind, Watermark
from django_fencedjobs.runstate import Progress, RunState, WatermarkValue

if TYPE_CHECKING:
    from django.tasks import Task, TaskResult

ModelT = TypeVar("ModelT", bound=Model)

#: The most items a run's record holds (a ``BigIntegerField``: signed 64-bit everywhere).
ITEMS_MAX = 2**63 - 1


@dataclass(frozen=True)
class Window:
    """A half-open interval of time ``[start, end)`` a run processes."""

    start: datetime
    end: datetime


class Run:
    """What a job's handler receives: the run's fence and slot, and the helpers that keep
    its work idempotent (watermark windows, per-item batches)."""

    def __init__(self, state: RunState, *, now: datetime) -> None:
        # The attributes are documented in docs/api.md (``Run``).
        self._state = state
        self.job = state.job
        self.lease_name: str = state.lease_name
        self.record = state.record
        self.fence: int = state.fence
        self.scheduled_for: datetime = state.record.scheduled_for
        self.attempt: int = state.record.attempt
        self.kind: str = state.record.kind
        #: The clock's reading when the run acquired its lease (aware, UTC).
        self.now: datetime = now
        self.owner: str = state.record.owner
        self._watermarks_at_start = dict(state.watermarks)
        #: The end of the window each windows() key is in: advancing to it completes a batch.
        self._window_ends: dict[str, datetime] = {}
        #: Every item :meth:`add_items` counted (committed or not): what it keeps in range.
        self._tally = 0
        self._tally_lock = threading.Lock()

    def __repr__(self) -> str:
        slot = f"{self.scheduled_for:%Y-%m-%dT%H:%M:%SZ}"
        return f"<Run {self.job.name} fence={self.fence} scheduled_for={slot}>"

    @functools.cached_property
    def interval(self) -> Window:
        """The run's data interval, ``[previous slot, slot)``; a run covering coalesced
        missed slots starts where the first of them did; a one-off's is empty (docs/time.md)."""
        start = self.record.interval_start
        if start is None and self.kind != RunKind.ONCE and self.job.schedule is not None:
            start = self.job.schedule.previous_before(self.scheduled_for)
        return Window(start or self.scheduled_for, self.scheduled_for)

    @property
    def upto(self) -> datetime:
        """How far the run's windows go: :attr:`now`, or a backfill run's :attr:`interval`
        end (a backfill works on its own range, never past it)."""
        return self.interval.end if self.kind == RunKind.BACKFILL else self.now

    @property
    def watermark(self) -> WatermarkValue | None:
        """The watermark (default key) as it was when the run started."""
        return self._watermarks_at_start.get("")

    def watermark_for(self, key: str) -> WatermarkValue | None:
        """The watermark of ``key`` as it was when the run started."""
        return self._watermarks_at_start.get(key)

    def advance_watermark(self, value: WatermarkValue, key: str = "") -> None:
        """Move the watermark forward to ``value``, in the current fenced transaction: in
        the same ``fenced_atomic`` block as the work it covers, so both commit or neither
        does. :class:`WatermarkError` outside the run's fenced block, for a naive datetime,
        an int outside 64 bits, or a value behind the stored watermark.
        """
        alias = db.lease_db()
        if current_holder() is not self._state or not in_fenced_block(alias):
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
            if not -ITEMS_MAX - 1 <= value <= ITEMS_MAX:  # the cursor's column, as items'
                raise WatermarkError(
                    f"job {self.job.name!r}: an int watermark is a signed 64-bit integer, "
                    f"got {_digits(value)}"
                )
            column = "cursor"
        else:
            raise WatermarkError(
                f"job {self.job.name!r}: a watermark is an aware datetime or an int, got {value!r}"
            )
        rows = Watermark.objects.using(alias).filter(job=self.lease_name, key=key)
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
                job=self.lease_name, key=key, fence=self.fence, **{column: value}
            )
        # The run's own view follows what commits: if this transaction rolls back (the
        # handler caught the error and went on), the window it covered is not done.
        transaction.on_commit(lambda: self._state.watermarks.__setitem__(key, value), using=alias)
        if not key:
            self._state.note(Progress(watermark=watermark_text(value)))
        window_end = self._window_ends.get(key)
        if window_end is not None and value >= window_end:  # type: ignore[operator]
            del self._window_ends[key]
            self._state.note(Progress(batches=1))

    def _may_continue(self) -> bool:
        self._state.raise_if_stopped()
        if self._state.stop_requested.is_set():
            self._state.interrupted = True
            return False
        return True

    def windows(
        self, step: timedelta, *, start: datetime | None = None, key: str = ""
    ) -> Iterator[Window]:
        """Consecutive whole windows ``[w, w + step)`` from the watermark (else ``start``, else
        a multiple of ``step`` one window before now) up to :attr:`now`, at most
        ``max_batches``. Advance the watermark to ``window.end`` inside the window's fenced
        block before the next one. A backfill run's windows tile its :attr:`interval`, under
        a watermark of its own.
        """
        if step <= timedelta(0):
            raise ValueError(
                f"job {self.job.name!r}: windows(step={step!r}): step must be a positive "
                "timedelta, e.g. timedelta(hours=1)"
            )
        position = self._state.watermarks.get(key)
        if position is None and self.kind == RunKind.BACKFILL:
            position = self.interval.start
        if position is None:
            position = start if start is not None else _floor(self.now, step) - step
        if not isinstance(position, datetime):
            raise WatermarkError(
                f"job {self.job.name!r}: windows() needs a datetime watermark, found {position!r}"
            )
        gen = self._windows(position, step, key)
        self._state.iterators.append(gen)
        return gen

    def _windows(
        self, position: datetime, step: timedelta, key: str
    ) -> Generator[Window, None, None]:
        while position + step <= self.upto:
            if self._state.batch_count >= self.job.max_batches:
                self._state.capped = True
                return
            if not self._may_continue():
                return
            window = Window(position, position + step)
            self._window_ends[key] = window.end
            yield window
            self._window_ends.pop(key, None)
            self._state.batch_count += 1
            reached = self._state.watermarks.get(key)
            if not isinstance(reached, datetime) or reached < window.end:
                raise WatermarkError(
                    f"job {self.job.name!r}: window {window.start.isoformat()} to "
                    f"{window.end.isoformat()} was not committed: advance the watermark to "
                    "window.end inside the window's fenced_atomic block, and let an error "
                    "in it end the run (its transaction rolled back, so the window is not "
                    "done; the next run starts from it)"
                )
            position = window.end

    def batches(self, queryset: QuerySet[ModelT], size: int = 100) -> Iterator[list[ModelT]]:
        """Claim (``SELECT ... FOR UPDATE SKIP LOCKED``) and yield the rows of ``queryset``
        in batches of ``size``, at most ``max_batches``, each in its own fenced transaction:
        it commits when the loop asks for the next batch (or ends), and rolls back if the
        loop body raises. The queryset must exclude finished items, and the body must mark
        them finished, in the same transaction (docs/writing-jobs.md).
        """
        if size < 1:
            raise ValueError(
                f"job {self.job.name!r}: batches(size={size!r}): size must be at least 1"
            )
        gen = self._batches(queryset, size)
        self._state.iterators.append(gen)
        return gen

    def _batches(
        self, queryset: QuerySet[ModelT], size: int
    ) -> Generator[list[ModelT], None, None]:
        alias = db.lease_db()
        features = connections[alias].features
        claim = queryset.using(alias).select_for_update(
            skip_locked=features.has_select_for_update_skip_locked,
            of=("self",) if features.has_select_for_update_of else (),
        )
        # Each batch is a fenced block: the fence check goes with its BEGIN, then the claim.
        fenced = FencedAtomic(None)
        while True:
            if self._state.batch_count >= self.job.max_batches:
                self._state.capped = queryset.using(alias).exists()
                return
            if not self._may_continue():
                return
            with fenced:
                items = list(claim[:size])
                if not items:
                    return
                try:
                    yield items
                except GeneratorExit:
                    if self._state.aborting:
                        raise  # the loop body failed: roll this batch back
                    # The loop stopped early (``break``): the batch it finished commits.
                    self._state.batch_count += 1
                    self._state.note(Progress(batches=1))
                    return
                self._state.note(Progress(batches=1))
            self._state.batch_count += 1

    def enqueue(
        self, task: Task[Any, Any], /, *args: Any, **kwargs: Any
    ) -> TaskResult[Any, Any] | None:
        """Enqueue a ``django.tasks`` task once, recorded with the run in its fenced
        transaction; inside the task, ``fenced_atomic()`` checks this run's fence. The
        backend's result, or None when it is handed over after the commit (docs/tasks.md).
        """
        from django_fencedjobs.integrations import tasks

        return tasks.enqueue(self, task, args, kwargs)

    def add_items(self, n: int = 1) -> None:
        """Count items processed: inside a fenced block in its transaction (counted only if
        it commits), else at once. ``n`` is checked here, so that no count can keep the run's
        end from being recorded: an int (else ``TypeError``), 0 or more, and within
        :data:`ITEMS_MAX` in all (else ``ValueError``), either the run's failure.
        """
        n = self._count(n)
        try:
            inside = current_holder() is self._state and in_fenced_block(db.lease_db())
        except NotInRun:  # a thread without the run's context
            inside = False
        if inside:
            self._state.note(Progress(items=n))
        else:
            self._state.loose_items += n

    def _count(self, n: Any) -> int:
        """``n`` as a count of items :meth:`add_items` takes, added to this run's tally."""
        job = self.job.name
        try:
            if isinstance(n, bool):
                raise TypeError
            count = operator.index(n)  # an int, or a type that is one (numpy's)
        except TypeError:
            raise TypeError(
                f"job {job!r}: add_items() takes an int count of items, got "
                f"{type(n).__name__} {reprlib.repr(n)}"
            ) from None
        if count < 0:
            raise ValueError(
                f"job {job!r}: add_items({_digits(count)}): a count of items is 0 or more"
            )
        with self._tally_lock:  # a handler's own threads may count too
            if count > ITEMS_MAX - self._tally:
                raise ValueError(
                    f"job {job!r}: add_items() of {_digits(count)} items would take the run "
                    f"past the {ITEMS_MAX} items its record holds"
                )
            self._tally += count
        return count

    def heartbeat(self) -> None:
        """Renew the lease now; :class:`FenceLost` when it is no longer this run's. The
        supervisor renews in the background; call this from a long computation to find out
        at once that the run has been superseded."""
        self._state.raise_if_stopped()
        until = clock.now() + self.job.lease_ttl
        connection = connections[db.lease_db()]
        if connection.in_atomic_block:
            # In a transaction of the handler's the renewal locks the lease row until it
            # ends: it is checked (bounded, endable) as a fenced block is; a lock timeout
            # set here would outlive this statement.
            if not in_fenced_block(connection.alias):  # else the block's check covers it
                self._state.check_fence(connection)
            renewed = lease.renew(self.lease_name, self.fence, until)
        else:
            with db.bounded_wait():
                renewed = lease.renew(self.lease_name, self.fence, until)
        if not renewed:
            self._state.stop()
            self._state.raise_if_stopped()

    @property
    def stopping(self) -> bool:
        """True once the runner was asked to stop (SIGTERM): finish what is committed."""
        return self._state.stop_requested.is_set()


def _digits(n: int) -> str:
    """``n`` written out, or its size in bits past Python's limit for writing one out."""
    try:
        return str(n)
    except ValueError:
        return f"a {n.bit_length()}-bit number"


def _floor(value: datetime, step: timedelta) -> datetime:
    seconds = step.total_seconds()
    epoch = value.timestamp()
    return datetime.fromtimestamp(epoch - (epoch % seconds), tz=UTC)


def watermark_text(value: WatermarkValue | None) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return iso_utc(value)
    return str(value)


__all__ = ["Run", "Window"]
