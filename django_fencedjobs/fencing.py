"""``fenced_atomic``: a transaction that commits only while its run still holds the lease.

It has the shape of :func:`django.db.transaction.atomic`: a decorator, a decorator with
arguments, or a context manager. On entry it opens ``transaction.atomic`` and, inside it,
checks and locks the run's fence (:func:`django_fencedjobs.lease.guard`). When the
fence is stale it raises :class:`FenceLost` and the block never runs; everything written
in it rolls back. The lock is held until the transaction ends, so no successor can take
the lease between the check and the commit.

A fenced block nested in another joins it (a savepoint, as ``atomic`` does) without a
second check: the outer block's lock already covers the whole transaction.

Like ``atomic``, one :class:`FencedAtomic` serves every call and thread: what is open is
kept on the database connection, where Django keeps its own atomic blocks
(``connection.atomic_blocks``), never on the decorator. A fenced block's transaction is a
:class:`_FencedTransaction` among them, so a connection that is thrown away takes the
record of its open fenced blocks with it.
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
    """What a fenced block asks of the fence it writes under: a run's
    (:class:`~django_fencedjobs.runstate.RunState`) or a task's that a run enqueued
    (:class:`~django_fencedjobs.integrations.tasks.TaskFence`). To check, inside the
    block's transaction, that it may still write; whether it was stopped (a run timed out,
    or its fence found gone), when every fenced block must fail before its ``BEGIN``; and
    to record what the block did, in its transaction."""

    def check_fence(self, connection: BaseDatabaseWrapper) -> None: ...

    def stopped_error(self) -> RunAborted | None: ...

    def save_progress(self, connection: BaseDatabaseWrapper) -> None: ...


_current: contextvars.ContextVar[FenceHolder | None] = contextvars.ContextVar(
    "fencedjobs_current_fence", default=None
)


def current_holder() -> FenceHolder:
    """The fence the code executing now writes under (a run's handler, or a task of a
    run), or :class:`NotInRun`."""
    holder = _current.get()
    if holder is None:
        raise NotInRun()
    return holder


def set_current_holder(holder: FenceHolder | None) -> contextvars.Token[FenceHolder | None]:
    return _current.set(holder)


def reset_current_holder(token: contextvars.Token[FenceHolder | None]) -> None:
    _current.reset(token)


class _FencedTransaction(transaction.Atomic):
    """The ``transaction.atomic`` a fenced block opens: its type marks it, among the
    connection's atomic blocks, as a fenced block's. It also keeps the writes deferred to
    the block's end (:func:`at_exit`)."""

    def __init__(self, using: str | None, savepoint: bool, durable: bool) -> None:
        super().__init__(using, savepoint, durable)
        self.deferred: dict[str, Callable[[], None]] = {}


DeferredT = TypeVar("DeferredT", bound=Callable[[], None])


def at_exit(using: str, key: str, factory: Callable[[], DeferredT]) -> DeferredT:
    """The callable registered under ``key`` on the innermost open fenced block on
    ``using``, made by ``factory()`` on first use. It is called when that block ends
    without an error, just before it is released (and, for the outermost, committed):
    inside the block's transaction, so what it writes commits or rolls back with the
    block. A block that rolls back drops it uncalled.

    For writes cheaper made together than one by one: the records of the tasks a run
    enqueues in a block are inserted by one statement when the block ends.
    """
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

    The supervisor's interrupt can land between two steps of a database call: typically
    after the COMMIT was sent, before its result was read. The library's cleanup then
    meets a connection with a command still in progress, and its error (``can't change
    'autocommit' now``, ``another command is already in progress``) replaces the
    interrupt; the next blocks fail the same way, or on the session the supervisor ended.
    Such an error is raised as the interrupt it hides (or ``FenceLost``), and a
    connection left mid-command (``connection``, when given) is discarded.
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
