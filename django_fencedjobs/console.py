"""What ``runjobs`` prints on stderr when the project's LOGGING does not show the
``django_fencedjobs`` logger's records (docs/running.md: what each ``-v`` shows).

:func:`terminal_output` gives the logger, for the duration, a handler writing one line per
record, its job first, at the level of Django's ``-v``; :class:`PassReport` adds the jobs
not run yet and, at ``-v 2``, each pass. Runs go on worker threads, so each line is written
whole. A project whose LOGGING gives the logger (or the root logger) a handler keeps it:
none is added, so nothing is printed twice.
"""

from __future__ import annotations

import contextlib
import logging
import traceback
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

from django.core.management.base import OutputWrapper
from django.db import DatabaseError

from django_fencedjobs import lease, signals
from django_fencedjobs.db import lease_db
from django_fencedjobs.instants import format_instant, format_wait, format_with_utc
from django_fencedjobs.models import JobLease
from django_fencedjobs.registry import Job

logger = logging.getLogger("django_fencedjobs")

#: The handler's level for each ``-v`` value (and above 3: as 3).
LEVELS = {0: logging.ERROR, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}

#: Attributes every LogRecord has: the rest are a record's ``extra=`` fields.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


@contextlib.contextmanager
def terminal_output(stream: TextIO | OutputWrapper, verbosity: int) -> Iterator[bool]:
    """Write the logger's records on ``stream`` for the duration, one line each, at
    ``verbosity`` (Django's ``-v``), unless the project's LOGGING shows them already (a
    handler on the logger or an ancestor it propagates to). Yields whether it does."""
    if logger.hasHandlers():
        yield False
        return
    handler = TerminalHandler(stream, verbosity)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(handler.level)
    try:
        yield True
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


class TerminalHandler(logging.Handler):
    """One line per record, naming its job first; at ``-v 3`` with its time, thread, level,
    fields and traceback."""

    def __init__(self, stream: TextIO | OutputWrapper, verbosity: int) -> None:
        super().__init__(LEVELS[max(0, min(verbosity, 3))])
        self.stream = stream
        self.detail = verbosity >= 3

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = line(record)
            if self.detail:
                text = _detailed(record, text)
            else:
                if record.exc_info and record.exc_info[1] is not None:
                    text += ": " + traceback.format_exception_only(record.exc_info[1])[-1]
                # One line, e.g. with PostgreSQL's "Is the server running ...?" line.
                text = " ".join(part.strip() for part in text.splitlines() if part.strip())
            if isinstance(self.stream, OutputWrapper):
                self.stream.write(text, style_func=str)  # no colour: lines go to logs
            else:
                self.stream.write(text + "\n")
            self.stream.flush()
        except Exception:
            self.handleError(record)


def line(record: logging.LogRecord) -> str:
    """A record as one line, its job first."""
    fields: dict[str, Any] = vars(record)
    event, job = fields.get("event"), fields.get("job")
    if event == "run_started":
        earlier = fields.get("missed_slots") or 0
        coalesced = f"; {_count(earlier, 'earlier slot')} coalesced" if earlier else ""
        return f"{job}: started (slot {_slot(fields)}{coalesced})"
    if event == "run_finished":
        counts = f"{_count(fields.get('items', 0), 'item')}, "
        counts += _count(fields.get("batches", 0), "batch", "batches")
        if fields.get("capped"):
            counts += ", capped at max_batches with work left"
        why = f": {fields['error']}" if fields.get("error") else ""
        return (
            f"{job}: {fields.get('outcome')} in {_duration(fields.get('duration'))}"
            f" (slot {_slot(fields)}; {counts}){why}"
        )
    message = record.getMessage()
    return f"{job}: {message}" if job and str(job) not in message else message


def _detailed(record: logging.LogRecord, text: str) -> str:
    when = datetime.fromtimestamp(record.created, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    fields = " ".join(f"{k}={v}" for k, v in vars(record).items() if k not in _STANDARD)
    text = f"{when} UTC [{record.threadName}] {record.levelname} {text}"
    if fields:
        text += f"  {{{fields}}}"
    if record.exc_info:
        text += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
    return text


def _slot(fields: dict[str, Any]) -> str:
    value = fields.get("scheduled_for")
    return format_instant(datetime.fromisoformat(str(value)), UTC) if value else "?"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    return f"{seconds:.3f}s" if seconds < 60 else str(timedelta(seconds=round(seconds)))


def _count(n: int, noun: str, plural: str = "") -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"


# -- what a runner adds: jobs not run yet, each pass -----------------------------------------


def runner_started(jobs: int, workers: int) -> None:
    """The loop's first line: what it runs, and how to stop it."""
    logger.info(
        "running %s on up to %s; stop with Ctrl-C or SIGTERM",
        _count(jobs, "job"),
        _count(workers, "worker"),
        extra={"event": "runner_started", "jobs": jobs, "workers": workers},
    )


class PassReport:
    """A ``tick_finished`` receiver for one runner (``runjobs --once`` or the loop).

    After each pass: each job never run yet (its lease never taken), once per process, with
    when it first runs (INFO); at ``-v 2``, each due job passed over and which job runs next
    (DEBUG). One read of the jobs' lease rows per pass, none once every job is reported and
    debug records are not shown.
    """

    def __init__(self, jobs: Sequence[Job]) -> None:
        self.jobs = {job.name: job for job in jobs}
        self.unreported = set(self.jobs)

    @contextlib.contextmanager
    def connected(self) -> Iterator[None]:
        signals.tick_finished.connect(self.receive, dispatch_uid=id(self))
        try:
            yield
        finally:
            signals.tick_finished.disconnect(dispatch_uid=id(self))

    def receive(self, sender: Any = None, *, now: datetime, **kwargs: Any) -> None:
        detail = logger.isEnabledFor(logging.DEBUG)
        shown = self.unreported and logger.isEnabledFor(logging.INFO)
        if not (shown or detail) or not self.jobs:
            return  # nothing would be shown (-v 0, as cron runs it): no read, no work
        try:
            rows = list(
                JobLease.objects.using(lease_db())
                .filter(name__in=list(self.jobs))
                .order_by("next_run_at", "name")
                .values_list("name", "id", "fence", "next_run_at", "lease_until", "owner", "paused")
            )
        except DatabaseError:
            return  # the loop reports the database gone, and reconnects; report next pass
        upcoming: list[tuple[datetime, str]] = []
        for name, pk, fence, next_run_at, lease_until, owner, paused in rows:
            if name in self.unreported:
                self.unreported.discard(name)
                if lease.never_taken(pk, fence):
                    self._first_run(self.jobs[name], next_run_at, paused, now)
            passed = {"event": "passed_over", "job": name}
            if paused:
                logger.debug("%s: paused; passed over", name, extra=passed)
            elif next_run_at <= now < lease_until:
                logger.debug(
                    "%s: due, but its lease is held by %s until %s; passed over",
                    name,
                    owner or "another runner",
                    format_instant(lease_until, UTC),
                    extra=passed,
                )
            elif (when := max(next_run_at, lease_until)) > now:
                upcoming.append((when, name))
        if not detail:
            return
        if upcoming:
            when, name = min(upcoming)
            logger.debug(
                "pass done; next run: %s at %s (in %s)",
                name,
                format_instant(when, UTC),
                format_wait(when - now),
                extra={"event": "pass_done", "next_job": name, "next_run_at": when.isoformat()},
            )
        else:
            logger.debug("pass done; no run scheduled", extra={"event": "pass_done"})

    def _first_run(self, job: Job, next_run_at: datetime, paused: bool, now: datetime) -> None:
        if paused:
            when = "paused: it runs once resumed"
        elif next_run_at <= now:
            when = f"first run due since {format_instant(next_run_at, UTC)}"
        else:
            at = format_with_utc(next_run_at, job.valid_schedule.tz)
            when = f"first run at {at} (in {format_wait(next_run_at - now)})"
        fields = dict(event="job_registered", job=job.name, next_run_at=next_run_at.isoformat())
        logger.info("%s: registered, %s", job.name, when, extra=fields)


__all__ = ["PassReport", "TerminalHandler", "runner_started", "terminal_output"]
