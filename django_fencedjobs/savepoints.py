"""What a transaction keeps of what was noted inside it: entries noted under savepoints
that rolled back are dropped, as their rows are (a run's progress, the tasks it enqueued).

Django drops a ``transaction.on_commit`` callback registered under a savepoint that rolls
back, so a :class:`Ledger` keeps its entries in groups, one per level of open savepoints,
each with a do-nothing marker callback: a group whose marker is gone is dropped, a released
one merges into the enclosing level's. One marker per level, not per entry, as each rollback
scans Django's list. The one Django internal read is ``connection.run_on_commit``.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

T = TypeVar("T")

Sids = tuple[str | None, ...]


class Ledger(Generic[T]):
    """Entries noted in one transaction on ``alias``, by the savepoint level open when each
    was noted. Create it inside the transaction."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        #: The groups of levels that may still be open, outermost first, each one's
        #: savepoints extending the previous one's.
        self._groups: list[_Group[T]] = []

    def note(self, entry: T) -> None:
        connection = connections[self.alias]
        sids = tuple(connection.savepoint_ids)
        self._settle(connection, sids)
        groups = self._groups
        if not groups or groups[-1].sids != sids:
            groups.append(_Group(sids))
            transaction.on_commit(groups[-1], using=self.alias)
        groups[-1].entries.append(entry)

    def kept(self) -> list[T]:
        """The entries whose savepoints did not roll back, in the order they were noted. A
        transaction that must roll back as a whole (a block joined without a savepoint,
        ``atomic(savepoint=False)``, failed) keeps none."""
        connection = connections[self.alias]
        if connection.needs_rollback:
            return []
        self._settle(connection, tuple(connection.savepoint_ids))
        return [
            entry
            for group in self._groups
            if _registered(connection, group) is not None
            for entry in group.entries
        ]

    def _settle(self, connection: BaseDatabaseWrapper, sids: Sids) -> None:
        """Settle the groups of which a savepoint has ended (``sids`` are the ones open):
        dropped if it rolled back, else theirs are the entries of the level still open."""
        groups = self._groups
        while groups and groups[-1].sids != sids[: len(groups[-1].sids)]:
            group = groups.pop()
            at = _registered(connection, group)
            if at is None:
                continue  # a savepoint of it rolled back: so did its entries
            # Released: the group now stands or falls with its savepoints still open.
            level = _common_prefix(group.sids, sids)
            if groups and len(groups[-1].sids) >= len(level):
                # The enclosing group does too (its own savepoints past that level were
                # released as well): one group, one callback for both.
                del connection.run_on_commit[at]
                groups[-1].entries += group.entries
            else:
                group.sids = level
                groups.append(group)


class _Group(Generic[T]):
    """The entries noted at one level of savepoints (``sids``: the connection's
    ``savepoint_ids`` open), and the ``on_commit`` marker of that level."""

    __slots__ = ("entries", "sids")

    def __init__(self, sids: Sids) -> None:
        self.sids = sids
        self.entries: list[T] = []

    def __call__(self) -> None:
        return None


def _common_prefix(sids: Sids, other: Sids) -> Sids:
    n = 0
    for sid, same in zip(sids, other, strict=False):
        if sid != same:
            break
        n += 1
    return sids[:n]


def _registered(connection: BaseDatabaseWrapper, group: _Group[T]) -> int | None:
    """Where ``group`` is in the connection's ``on_commit`` callbacks, None when Django
    discarded it (a savepoint open when it was registered rolled back); usually last."""
    entries = connection.run_on_commit
    return next((at for at in range(len(entries) - 1, -1, -1) if entries[at][1] is group), None)


__all__ = ["Ledger"]
