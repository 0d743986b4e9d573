"""What ``runjobs`` tells whoever runs it, on stderr, when the project's LOGGING does not
take that over.

Every run's start and end is a record on the ``django_fencedjobs`` logger (with ``extra=``
fields, for a JSON formatter); :class:`PassReport` adds a few for the operator: each job
that has not run yet and when it first runs, and at ``-v 2`` each pass and each due job
passed over. A new project configures no logging, so on their own these records would
show nowhere, or only the errors, bare (Python's ``logging.lastResort``). While
``runjobs`` runs, :func:`terminal_output` gives the logger a handler that writes one line
per record on the command's stderr, at the level of Django's ``-v/--verbosity``:

=========  ================================================================================
verbosity  shown
=========  ================================================================================
0          errors only: a run that failed, timed out or lost its fence; the database gone
1          the default: also each run's start and end, and each job not run yet with when
           it first runs
2          also each pass (which job runs next) and each due job passed over (paused, or
           its lease held by another runner); the logger's debug records
3          also the time and thread of each line, every structured field, and tracebacks
=========  ================================================================================

Runs go on worker threads, so lines of several runs interleave: each line is written
whole, and names its job first (``<job>: ...``).

A project whose LOGGING gives the logger a handler, or gives the root logger one that the
logger propagates to, keeps it: no handler is added, so nothing is printed twice.
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


def has_own_handler() -> bool:
    """Whether the project's LOGGING already shows the logger's records: a handler on it,
    or on an ancestor it propagates to (the root logger, typically)."""
    return logger.hasHandlers()


@contextlib.contextmanager
def terminal_output(stream: TextIO | OutputWrapper, verbosity: int) -> Iterator[bool]:
    """Write the logger's records on ``stream`` for the duration, one line each, at
    ``verbosity`` (Django's ``-v``), unless the project's LOGGING shows them already.
    Yields whether it does."""
    if has_own_handler():
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
    """One line per record, naming its job first; see the module's docstring."""

    def __init__(self, stream: TextIO | OutputWrapper, verbosity: int) -> None:
        super().__init__(LEVELS[max(0, min(verbosity, 3))])
        self.stream = stream
        self.detail = verbosity >= 3

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = line(record)
            if self.detail:
                text = _detailed(record, text)
            elif record.exc_info and record.exc_info[1] is not None:
                text += ": " + _last_line(record.exc_info[1])
            if not self.detail:  # e.g. PostgreSQL's "Is the server running ...?" line
                text = " ".join(part.strip() for part in text.splitlines() if part.strip())
            if isinstance(self.stream, OutputWrapper):
                self.stream.write(text, style_func=_plain)  # no colour: lines go to logs
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
        counts = f"{_count(fields.get('items', 0), 'item')}, {_batches(fields.get('batches', 0))}"
        if fields.get("capped"):
            counts += ", capped at max_batches with work left"
        why = f": {fields['error']}" if fields.get("error") else ""
        return (
            f"{job}: {fields.get('outcome')} in {_duration(fields.get('duration'))}"
            f" (slot {_slot(fields)}; {counts}){why}"
        )
    message = record.getMessage()
    if job and str(job) not in message:
        return f"{job}: {message}"
    return message


def _detailed(record: logging.LogRecord, text: str) -> str:
    when = datetime.fromtimestamp(record.created, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    extra = {k: v for k, v in vars(record).items() if k not in _STANDARD}
    fields = " ".join(f"{k}={v}" for k, v in extra.items())
    text = f"{when} UTC [{record.threadName}] {record.levelname} {text}"
    if fields:
        text += f"  {{{fields}}}"
    if record.exc_info:
        text += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
    return text


def _plain(text: str) -> str:
    return text


def _last_line(exc: BaseException) -> str:
    return traceback.format_exception_only(exc)[-1].strip()


def _slot(fields: dict[str, Any]) -> str:
    value = fields.get("scheduled_for")
    if not value:
        return "?"
    return format_instant(datetime.fromisoformat(str(value)), UTC)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 60:
        return f"{seconds:.3f}s"
    return str(timedelta(seconds=round(seconds)))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _batches(n: int) -> str:
    return "1 batch" if n == 1 else f"{n} batches"


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

    After each pass: each job that has never run (its lease never taken), once per process,
    with when it first runs, in its zone and in UTC (INFO); and, when the logger shows
    debug records (``-v 2``), each due job that was passed over and which job runs next
    (DEBUG). One read of the jobs' lease rows per pass, and none once every job has been
    reported and debug records are not shown.
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
            if paused:
                logger.debug("%s: paused; passed over", name, extra=_fields("passed_over", name))
            elif next_run_at <= now < lease_until:
                logger.debug(
                    "%s: due, but its lease is held by %s until %s; passed over",
                    name,
                    owner or "another runner",
                    format_instant(lease_until, UTC),
                    extra=_fields("passed_over", name),
                )
            else:
                upcoming.append((max(next_run_at, lease_until), name))
        if detail:
            later = [(when, name) for when, name in upcoming if when > now]
            if later:
                when, name = min(later)
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
        fields = _fields("job_registered", job.name, next_run_at=next_run_at.isoformat())
        if paused:
            logger.info("%s: registered, paused: it runs once resumed", job.name, extra=fields)
            return
        if next_run_at <= now:
            logger.info(
                "%s: registered, first run due since %s",
                job.name,
                format_instant(next_run_at, UTC),
                extra=fields,
            )
            return
        logger.info(
            "%s: registered, first run at %s (in %s)",
            job.name,
            format_with_utc(next_run_at, job.valid_schedule.tz),
            format_wait(next_run_at - now),
            extra=fields,
        )


def _fields(event: str, job: str, **more: Any) -> dict[str, Any]:
    return {"event": event, "job": job, **more}


__all__ = ["PassReport", "TerminalHandler", "runner_started", "terminal_output"]
