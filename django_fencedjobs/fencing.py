"""``fenced_atomic``: a transaction that commits only while its run still holds the lease.

It has the shape of :func:`django.db.transaction.atomic`: a decorator, a decorator with
arguments, or a context manager. On entry it opens ``transaction.atomic`` and, inside it,
checks and locks the run's fence (:func:`django_fencedjobs.lease.lock_fence`). When the
fence is stale it raises :class:`FenceLost` and the block never runs; everything written
in it rolls back. The lock is held until the transaction ends, so no successor can take
the lease between the check and the commit.

A fenced block nested in another joins it (a savepoint, as ``atomic`` does) without a
second check: the outer block's lock already covers the whole transaction.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from contextlib import ContextDecorator
from types import TracebackType
from typing import Any, Protocol, TypeVar, overload

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_fencedjobs import lease
from django_fencedjobs.exceptions import FenceLost, NotInRun


class Run(Protocol):
    """What a fenced block asks of the current run (:class:`django_fencedjobs.run.Run`):
    to check, inside the block's transaction, that it may still write."""

    def check_fence(self, connection: BaseDatabaseWrapper) -> None: ...


_current_run: contextvars.ContextVar[Run | None] = contextvars.ContextVar(
    "fencedjobs_current_run", default=None
)


def current_run() -> Run:
    """The run whose handler is executing, or :class:`NotInRun`."""
    run = _current_run.get()
    if run is None:
        raise NotInRun()
    return run


def set_current_run(run: Run | None) -> contextvars.Token[Run | None]:
    return _current_run.set(run)


def reset_current_run(token: contextvars.Token[Run | None]) -> None:
    _current_run.reset(token)


class _Depth(threading.local):
    """Per thread, per database alias: how many fenced blocks are open. Per-entry state
    lives here, never on the decorator instance, which serves every call and thread."""

    def __init__(self) -> None:
        self.by_alias: dict[str, list[transaction.Atomic]] = {}


_depth = _Depth()


def in_fenced_block(using: str) -> bool:
    return bool(_depth.by_alias.get(using))


def forget_fenced_blocks(using: str) -> None:
    """Drop this thread's record of open fenced blocks (its connection is being discarded)."""
    _depth.by_alias.pop(using, None)


class FencedAtomic(ContextDecorator):
    def __init__(self, using: str | None, *, check: bool = True) -> None:
        self.using = using
        #: False only for ``run.batches()`` on PostgreSQL, whose first statement in the
        #: block (the claim) locks the fence itself (``lease.fence_held``).
        self.check = check

    def __enter__(self) -> None:
        run = current_run()
        leases = lease.lease_db()
        alias = self.using or leases
        if alias != leases:
            raise NotInRun(
                f"fenced_atomic(using={alias!r}): the job leases live in database "
                f"{leases!r}; the fence can only guard writes made in the same "
                "transaction, on the same database (see check fencedjobs.E009)."
            )
        stack = _depth.by_alias.setdefault(alias, [])
        atomic = transaction.atomic(using=alias)
        atomic.__enter__()
        stack.append(atomic)
        if len(stack) > 1 or not self.check:
            return  # joined the enclosing fenced block: its lock covers this transaction
        try:
            run.check_fence(connections[alias])
        except BaseException as exc:
            stack.pop()
            try:
                atomic.__exit__(type(exc), exc, exc.__traceback__)
            except Exception:
                # The rollback itself failed: typically the supervisor, which saw the fence
                # go too, interrupted the handler in the middle of it, leaving a command in
                # progress on the connection. Discard the connection (the server rolls the
                # transaction back) and raise the fence check's error, not the rollback's.
                connections[alias].close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        alias = self.using or lease.lease_db()
        atomic = _depth.by_alias[alias].pop()
        atomic.__exit__(exc_type, exc_value, traceback)
        return None


FuncT = TypeVar("FuncT", bound=Callable[..., Any])


@overload
def fenced_atomic(using: FuncT) -> FuncT: ...
@overload
def fenced_atomic(using: str | None = None) -> FencedAtomic: ...
def fenced_atomic(using: str | FuncT | None = None) -> FencedAtomic | FuncT:
    """Run a block in a transaction that commits only if this run still holds its lease.

    ::

        with fenced_atomic():
            write_invoices(window.start, window.end)
            run.advance_watermark(window.end)

    Raises :class:`FenceLost` (nothing in the block is committed) when another run has
    taken the lease, and :class:`NotInRun` outside a job's run.
    """
    if callable(using):
        return FencedAtomic(None)(using)
    return FencedAtomic(using)


__all__ = ["FenceLost", "FencedAtomic", "current_run", "fenced_atomic", "in_fenced_block"]
