"""Runners are seen (docs/alerting.md, "Runners are seen"): a ``runjobs`` loop beats its
:class:`~django_fencedjobs.models.Runner` row from the loop itself (:class:`Presence`, so a
stuck loop stops beating too), a ``--once`` pass records its start (:func:`record_pass`),
and :func:`read` gives health a :class:`Coverage`: which jobs live runners serve. A runner
is live while its last beat is less than ``RUNNER_TIMEOUT`` old, stopped or dead alike.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, IntegrityError, connections

from django_fencedjobs import __version__, clock, db, signals
from django_fencedjobs.conf import get_settings
from django_fencedjobs.db import lease_db
from django_fencedjobs.models import Runner, RunnerMode
from django_fencedjobs.registry import Job

logger = logging.getLogger("django_fencedjobs")

__all__ = ["Coverage", "Presence", "Seen", "read", "record_pass"]

#: The default clock: the database's. With it, a beat stamps the server's own time in its
#: one statement (no round trip to read the clock first).
DATABASE_CLOCK = "django_fencedjobs.clock.database_now"
#: A live loop deletes the rows of runners gone for ``RUNNER_RETENTION`` at most this often.
PURGE_EVERY = timedelta(minutes=10)


def _stamp() -> Any:
    """The instant a beat writes: the database's clock as SQL where that is the configured
    clock and the database has one, else the configured clock's reading. The statement's
    time, not the real time: a stop writes it twice (``stopped_at`` and the last beat) and
    the two must be one instant."""
    database = db.statement_now() if get_settings().CLOCK == DATABASE_CLOCK else None
    return clock.now() if database is None else database


def _names(jobs: Iterable[Job | str]) -> list[str]:
    return sorted({job if isinstance(job, str) else job.name for job in jobs})


def purge(now: datetime | None = None) -> int:
    """Delete the rows of runners not seen for ``RUNNER_RETENTION``: one statement."""
    cutoff = (now or clock.now()) - get_settings().RUNNER_RETENTION
    deleted, _ = Runner.objects.using(lease_db()).filter(last_beat_at__lt=cutoff).delete()
    return deleted


class Presence:
    """A loop's row: :meth:`beat` registers it, then beats at most every ``RUNNER_BEAT``;
    :meth:`stop` marks it stopped. Called from the loop's own thread; none raises a
    ``DatabaseError`` (logged once per outage, and the next beat tries again)."""

    def __init__(self, jobs: Sequence[Job], workers: int, *, owner: str | None = None) -> None:
        self.key = uuid.uuid4().hex
        self.jobs = _names(jobs)
        self.workers = workers
        self.owner = owner or get_settings().owner
        self.pk: int | None = None
        self._next_beat = 0.0
        self._next_purge = 0.0
        self._failing = False
        #: No beat now: an end of the loop's runs waits to be recorded (:meth:`beat`).
        self._held = False

    @property
    def interval(self) -> float:
        return get_settings().RUNNER_BEAT.total_seconds()

    def due_in(self) -> float:
        """Seconds until the next beat is due (0: now)."""
        return max(0.0, self._next_beat - time.monotonic())

    def beat(self, *, unrecorded_for: float = 0.0) -> None:
        """Register, or beat, if a beat is due; a no-op otherwise.

        ``unrecorded_for``: how long, in seconds, the oldest end of the loop's runs has
        waited to be recorded. A beat says the runner works, recording its runs included:
        while an end has waited longer than ``RUNNER_BEAT`` there is no beat, so the runner
        reads gone (``no_runner``) ``RUNNER_TIMEOUT`` later, as a dead one does."""
        if time.monotonic() < self._next_beat:
            return
        self._next_beat = time.monotonic() + self.interval
        if unrecorded_for > self.interval:
            if not self._held:
                logger.error(
                    "runner %s: a run's end has waited %.1fs to be recorded; no beat until it "
                    "is, so that the runner reads not working after RUNNER_TIMEOUT",
                    self.owner,
                    unrecorded_for,
                    extra={"event": "runner_beat_held", "owner": self.owner},
                )
            self._held = True
        else:
            if self._held:
                self._held = False
                logger.info(
                    "runner %s: its runs' ends are recorded again; beating again",
                    self.owner,
                    extra={"event": "runner_beat_resumed", "owner": self.owner},
                )
            self._safely("beat", self._beat)
        if not self._failing:
            signals.send(signals.runner_beat, interval=self.interval)

    def stop(self) -> None:
        """The loop ends: ``stopped_at`` and a last beat, live until ``RUNNER_TIMEOUT`` after
        it as any runner, so a restart within the bound leaves no gap."""
        pk = self.pk
        if pk is None:
            return

        def stopped() -> None:
            now = _stamp()
            Runner.objects.using(lease_db()).filter(pk=pk).update(last_beat_at=now, stopped_at=now)

        self._safely("stop", stopped)

    def _beat(self) -> None:
        runners = Runner.objects.using(lease_db())
        if self.pk is None or not runners.filter(pk=self.pk).update(last_beat_at=_stamp()):
            # Not registered yet (the database was away at the start), or our row was
            # deleted as gone (this process was stopped for longer than RUNNER_RETENTION).
            self._register()
        if time.monotonic() >= self._next_purge:
            self._next_purge = time.monotonic() + PURGE_EVERY.total_seconds()
            purge()

    def _register(self) -> None:
        now = clock.now()
        row = Runner.objects.using(lease_db()).create(
            key=self.key,
            mode=RunnerMode.LOOP,
            owner=self.owner,
            host=socket.gethostname(),
            pid=os.getpid(),
            version=__version__,
            workers=self.workers,
            jobs="\n".join(self.jobs),
            started_at=now,
            last_beat_at=now,
        )
        self.pk = row.pk
        logger.debug(
            "runner registered: %s, %d job(s), beat every %ss",
            self.owner,
            len(self.jobs),
            f"{self.interval:g}",
            extra={"event": "runner_registered", "owner": self.owner},
        )

    def _safely(self, what: str, action: Callable[[], None]) -> None:
        try:
            action()
        except DatabaseError as exc:
            if not self._failing:
                logger.warning(
                    "runner %s: could not record its %s (database unavailable), trying again "
                    "at its next beat: %s",
                    self.owner,
                    what,
                    " ".join(str(exc).split()),
                    extra={"event": "runner_beat_failed", "owner": self.owner},
                )
            self._failing = True
            connection = connections[lease_db()]
            if not connection.in_atomic_block:
                connection.close()  # reconnect at the next statement
        else:
            if self._failing:
                logger.info(
                    "runner %s: beating again",
                    self.owner,
                    extra={"event": "runner_beat_resumed", "owner": self.owner},
                )
            self._failing = False


def record_pass(jobs: Sequence[Job], workers: int) -> None:
    """A ``runjobs --once`` pass starts: its host's row for this set of jobs says so (one
    ``UPDATE``; the first pass inserts it, and purges). A database error is logged and the
    pass goes on: the pass itself reports an unreachable database."""
    names, host = _names(jobs), socket.gethostname()
    digest = hashlib.blake2b("\n".join(names).encode(), digest_size=8).hexdigest()
    key = f"once:{host}:{digest}"
    runners = Runner.objects.using(lease_db())
    fields: dict[str, Any] = {
        "owner": get_settings().owner,
        "pid": os.getpid(),
        "version": __version__,
        "workers": workers,
        "stopped_at": None,
    }
    try:
        stamp = _stamp()
        if runners.filter(key=key).update(started_at=stamp, last_beat_at=stamp, **fields):
            return
        now = clock.now()
        fields.update(started_at=now, last_beat_at=now)
        try:
            runners.create(
                key=key, mode=RunnerMode.ONCE, host=host, jobs="\n".join(names), **fields
            )
        except IntegrityError:  # a pass of the same jobs on this host at the same moment
            runners.filter(key=key).update(**fields)
        purge(now)
    except DatabaseError as exc:
        logger.warning(
            "could not record this runjobs --once pass: %s",
            " ".join(str(exc).split()),
            extra={"event": "runner_beat_failed"},
        )


# -- what health reads -------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """A runner as health reads it."""

    owner: str
    mode: str
    started_at: datetime
    last_beat_at: datetime
    stopped_at: datetime | None
    jobs: frozenset[str]

    def live(self, now: datetime) -> bool:
        return now - self.last_beat_at < get_settings().RUNNER_TIMEOUT

    @property
    def label(self) -> str:
        return self.owner if self.mode == RunnerMode.LOOP else f"{self.owner} (--once)"


@dataclass(frozen=True)
class Coverage:
    """Every runner row, read once, against one clock reading: which runners serve a job,
    and why none does."""

    runners: tuple[Seen, ...]
    now: datetime

    def live(self) -> list[Seen]:
        """The live loops."""
        return [r for r in self.runners if r.mode == RunnerMode.LOOP and r.live(self.now)]

    def serving(self, name: str) -> list[Seen]:
        """The live loops that run ``name``, and the passes that do (within
        ``RUNNER_PASS_INTERVAL`` plus ``RUNNER_TIMEOUT``, when it is set)."""
        settings = get_settings()
        found = []
        for runner in self.runners:
            if name not in runner.jobs:
                continue
            if runner.mode == RunnerMode.LOOP:
                if runner.live(self.now):
                    found.append(runner)
            elif settings.RUNNER_PASS_INTERVAL is None or (
                self.now - runner.last_beat_at
                < settings.RUNNER_PASS_INTERVAL + settings.RUNNER_TIMEOUT
            ):
                found.append(runner)
        return found

    def problem(self, name: str, first_seen: datetime, at: Callable[[datetime], str]) -> str | None:
        """Why no runner serves ``name`` (a reason for ``no_runner``), or None: one serves
        it, no runner was ever seen, or the job is younger than ``RUNNER_TIMEOUT``.
        ``at`` writes an instant in the job's zone."""
        if not self.runners or self.serving(name):
            return None
        settings = get_settings()
        timeout = settings.RUNNER_TIMEOUT
        ran_it = [r for r in self.runners if name in r.jobs]
        if not ran_it and self.now - first_seen < timeout:
            return None  # just deployed: its runners have the bound to start
        bound = f"{timeout.total_seconds():g} s"
        if ran_it:
            last = max(ran_it, key=lambda r: r.last_beat_at)
            ago = duration_text(self.now - last.last_beat_at)
            if last.mode == RunnerMode.ONCE:
                every = settings.RUNNER_PASS_INTERVAL
                return (
                    f"no runner: its last runjobs --once pass, on {last.owner}, started at "
                    f"{at(last.last_beat_at)} ({ago} ago; passes are expected every "
                    f"{duration_text(every) if every else '?'}, RUNNER_PASS_INTERVAL)"
                )
            how = "stopped" if last.stopped_at is not None else "last seen"
            return (
                f"no live runner: {last.owner}, the last to run it, {how} at "
                f"{at(last.last_beat_at)} ({ago} ago; a runner is gone {bound} after its "
                "last beat)"
            )
        live = self.live()
        if live:
            owners = ", ".join(r.owner for r in live[:3]) + (", ..." if len(live) > 3 else "")
            return (
                f"no runner runs it: the live runners ({owners}) were started without it "
                "(before it was declared, or with --job)"
            )
        last = max(self.runners, key=lambda r: r.last_beat_at)
        return (
            f"no live runner: none has run it, and the last runner seen, {last.label}, at "
            f"{at(last.last_beat_at)}, is gone"
        )


def duration_text(delta: timedelta) -> str:
    """A duration to the second: 35 s, 5 min 45 s, 2 h 3 min."""
    total = max(0, int(delta.total_seconds()))
    hours, rest = divmod(total, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    if minutes:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    return f"{seconds} s"


def read(now: datetime) -> Coverage:
    """Every runner row (one query), for health."""
    rows = Runner.objects.using(lease_db()).values_list(
        "owner", "mode", "started_at", "last_beat_at", "stopped_at", "jobs"
    )
    return Coverage(
        tuple(
            Seen(owner, mode, started, beat, stopped, frozenset(jobs.splitlines()))
            for owner, mode, started, beat, stopped, jobs in rows
        ),
        now,
    )
