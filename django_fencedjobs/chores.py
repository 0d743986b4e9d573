"""A runner's chores: the work it does beside its runs, each on a timer of its own.

The orphan sweep, retention, the task relay and notifications are each a :class:`Chore`,
run when due by the dispatcher's :class:`Chores` after each pass, between runs. The timers
are the dispatcher's, not the module's. A chore that fails never stops the runner and is
never swallowed: logged (``chore_failed``), counted, and tried again at its next turn. The
app picks them (:meth:`django_fencedjobs.apps.FencedJobsConfig.runner_chores`): they live
in modules above the dispatcher's, which never imports them.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db import DatabaseError, connections

from django_fencedjobs import clock
from django_fencedjobs.db import lease_db
from django_fencedjobs.text import one_line

logger = logging.getLogger("django_fencedjobs")


@dataclass(frozen=True)
class Chore:
    """One chore: ``action(now)`` at most every ``every()`` seconds, when ``enabled()``.
    ``every()`` is read after each turn: a changed setting applies, and a chore may say
    how soon it needs its next turn from what its last one found."""

    name: str
    every: Callable[[], float]
    action: Callable[[datetime], object]
    enabled: Callable[[], bool] = lambda: True


class Chores:
    """A dispatcher's chores and their timers. The first turn of each is due at once."""

    def __init__(self, chores: Iterable[Chore] = ()) -> None:
        self.chores = list(chores)
        self._next: dict[str, float] = {}
        #: Failures so far, by chore name.
        self.failures: Counter[str] = Counter()

    def add(self, chore: Chore) -> None:
        """Add ``chore``, or put it in place of the one of the same name."""
        self.chores = [c for c in self.chores if c.name != chore.name] + [chore]

    def run_due(self, now: datetime | None = None) -> list[str]:
        """Run each chore whose turn has come, each given ``now`` (the clock, read once when
        a chore is due, if not given): the names of those run (failed or not). Never raises
        an ``Exception``."""
        ran = []
        for chore in self.chores:
            if time.monotonic() < self._next.get(chore.name, 0.0):
                continue
            try:
                if not chore.enabled():
                    continue
                ran.append(chore.name)
                if now is None:
                    now = clock.now()
                try:
                    chore.action(now)
                finally:
                    # Read after the turn: how soon the next comes may depend on what this
                    # one found (retention comes back in seconds while it is behind).
                    self._next[chore.name] = time.monotonic() + chore.every()
            except Exception as exc:
                self._failed(chore, exc)
        return ran

    def _failed(self, chore: Chore, exc: Exception) -> None:
        """Count and log a failed turn: the database away as a warning (and reconnect),
        anything else as an error with its traceback."""
        self.failures[chore.name] += 1
        count, away = self.failures[chore.name], isinstance(exc, DatabaseError)
        (logger.warning if away else logger.error)(
            "runner chore %s failed (%d time(s) so far), tried again at its next turn: %s",
            chore.name,
            count,
            one_line(exc),
            exc_info=None if away else exc,
            extra={"event": "chore_failed", "chore": chore.name, "failures": count},
        )
        if away:
            connection = connections[lease_db()]
            if not connection.in_atomic_block:
                connection.close()
