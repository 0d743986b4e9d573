"""``fenced_atomic``: a transaction that commits only while its run still holds the lease.

Shaped like ``transaction.atomic``, it checks and locks the run's fence first thing in its
transaction (:func:`django_fencedjobs.lease.guard`: :class:`FenceLost`, the block never
run, if it is stale) and holds the lock to the end, so no successor takes the lease between
check and commit; a nested block joins the outer one without a second check. What is open
lives on the connection (a :class:`_FencedTransaction` among its ``atomic_blocks``), not on
the decorator: one :class:`FencedAtomic` serves every thread, and a connection thrown away
takes its open fenced blocks with it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from contextlib import ContextDecorator
from types import TracebackType
from typing import Any, Protocol, TypeVar, overload

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_fencedjobs import db
from django_fencedjobs.checkids import CheckId
from django_fencedjobs.exceptions import NotInRun, RunAborted


class FenceHolder(Protocol):
    """The fence a fenced block writes under: a run's (``RunState``) or an enqueued task's
    (``TaskFence``). It checks, in the block's transaction, that it may still write; says
    whether it was stopped (every fenced block then fails before ``BEGIN``); and records
    what the block did, in its transaction."""

    def check_fence(self, connection: BaseDatabaseWrapper) -> None: ...

    def stopped_error(self) -> RunAborted | None: ...

    def save_progress(self, connection: BaseDatabaseWrapper) -> None: ...


_current: contextvars.ContextVar[FenceHolder | None] = contextvars.ContextVar(
    "fencedjobs_current_fence", default=None
)


def current_holder() -> FenceHolder:
    """The fence the code running now writes under (a run's, or its task's); else NotInRun."""
    holder = _current.get()
    if holder is None:
        raise NotInRun()
    return holder


def set_current_holder(holder: FenceHolder | None) -> contextvars.Token[FenceHolder | None]:
    return _current.set(holder)


def reset_current_holder(token: contextvars.Token[FenceHolder | None]) -> None:
    _current.reset(token)


class _FencedTransaction(transaction.Atomic):
    """A fenced block's ``atomic``, marked by its type; it keeps its :func:`at_exit` writes."""

    def __init__(self, using: str | None, savepoint: bool, durable: bool) -> None:
        super().__init__(using, savepoint, durable)
        self.deferred: dict[str, Callable[[], None]] = {}


DeferredT = TypeVar("DeferredT", bound=Callable[[], None])


def at_exit(using: str, key: str, factory: Callable[[], DeferredT]) -> DeferredT:
    """The callable registered under ``key`` on the innermost open fenced block on
    ``using`` (made by ``factory()`` on first use), called in its transaction when it ends
    without an error, so that what it writes commits or rolls back with the block: for
    writes cheaper made together (one insert for the tasks a run enqueued in a block)."""
    blocks = connections[using].atomic_blocks
    block = next((b for b in reversed(blocks) if isinstance(b, _FencedTransaction)), None)
    if block is None:
        raise NotInRun("at_exit() outside a fenced block")
    if key not in block.deferred:
        block.deferred[key] = factory()
    return block.deferred[key]  # type: ignore[return-value]


def in_fenced_block(using: str) -> bool:
    """Whether a fenced block is open on this thread's connection to ``using``."""
    return any(isinstance(block, _FencedTransaction) for block in connections[using].atomic_blocks)


class FencedAtomic(ContextDecorator):
    def __init__(self, using: str | None) -> None:
        self.using = using

    def __enter__(self) -> None:
        holder = current_holder()
        stopped = holder.stopped_error()
        if stopped is not None:
            raise stopped  # before BEGIN: the run's session may already have been ended
        leases = db.lease_db()
        alias = self.using or leases
        if alias != leases:
            raise NotInRun(
                f"fenced_atomic(using={alias!r}): the job leases live in database "
                f"{leases!r}; the fence can only guard writes made in the same "
                f"transaction, on the same database (see check {CheckId.ROUTING})."
            )
        joined = in_fenced_block(alias)
        atomic = _FencedTransaction(alias, savepoint=True, durable=False)
        atomic.__enter__()
        if joined:
            return  # joined the enclosing fenced block: its lock covers this transaction
        try:
            holder.check_fence(connections[alias])
        except BaseException as exc:
            try:
                atomic.__exit__(type(exc), exc, exc.__traceback__)
            except Exception:
                # The rollback failed (the supervisor's interrupt landed in it, leaving a
                # command in progress): discard the connection (the server rolls back) and
                # raise the fence check's error, not the rollback's.
                connections[alias].close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        # Blocks end in the order they began: the innermost open one is this entry's.
        connection = connections[self.using or db.lease_db()]
        block = connection.atomic_blocks[-1]
        deferred = block.deferred if isinstance(block, _FencedTransaction) else {}
        outer = connection.atomic_blocks[:-1]
        outermost = not any(isinstance(b, _FencedTransaction) for b in outer)
        try:
            if exc_type is None and (deferred or outermost):
                try:
                    for func in deferred.values():
                        func()
                    if outermost:
                        # What the run did in this transaction, recorded with it.
                        current_holder().save_progress(connection)
                except BaseException as exc:
                    block.__exit__(type(exc), exc, exc.__traceback__)
                    raise
            block.__exit__(exc_type, exc_value, traceback)
        except Exception as error:
            _raise_if_stopped(error, connection)
            raise
        if isinstance(exc_value, Exception):
            _raise_if_stopped(exc_value, None)
        return None


def _raise_if_stopped(error: Exception, connection: BaseDatabaseWrapper | None) -> None:
    """Once the run was stopped, a fenced block ends in the stop, never in an ordinary
    error a handler's ``except Exception:`` would swallow and go on from.

    The supervisor's interrupt can land mid database call (after COMMIT was sent, before
    its result was read): the cleanup's error (``another command is already in
    progress``...) then replaces the interrupt, and the next blocks fail the same way. Such
    an error is raised as the interrupt it hides (or ``FenceLost``), and a connection left
    mid-command (``connection``, when given) is discarded.
    """
    holder = _current.get()
    reason = holder.stopped_error() if holder is not None else None
    if reason is None:
        return
    if connection is not None:
        connection.close()
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, RunAborted):
        cause = cause.__context__
    raise (reason if cause is None else type(cause)(*cause.args)) from error


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


__all__ = ["FenceHolder", "FencedAtomic", "current_holder", "fenced_atomic", "in_fenced_block"]
