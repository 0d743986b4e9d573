"""``manage.py runjobs``: run due jobs once (for cron) or in a loop (for a supervisor), or
one job now (``--now NAME``); what it prints is :mod:`django_fencedjobs.console`'s."""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from django_fencedjobs import checks, console, db, loop, manual, preflight, runners
from django_fencedjobs.exceptions import FencedJobsError, UnknownJob
from django_fencedjobs.listing import describe_jobs
from django_fencedjobs.models import Outcome
from django_fencedjobs.registry import Job
from django_fencedjobs.text import error_excerpt, one_line

#: ``--now``: the run was recorded, and did not succeed. Not 2 (argparse's usage error) nor
#: 3 (:data:`~django_fencedjobs.preflight.DATABASE_UNAVAILABLE`).
RUN_DID_NOT_SUCCEED = 5
#: The loop or ``--once`` stopped because too many handlers it gave up on are still running
#: (``MAX_ABANDONED_HANDLERS``): its runs are recorded, and a new process should take over.
TOO_MANY_ABANDONED_HANDLERS = 4
#: The signals that stop a runner: the first gracefully, a second at once.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Command(BaseCommand):
    help = (
        "Run due scheduled jobs: once (--once, for cron) or in a loop until SIGTERM/SIGINT "
        "(for supervisor, systemd or a Kubernetes Deployment); or one job now (--now NAME). "
        "Says on stderr what it starts and how each run ends (-v 0: errors only; -v 2: each "
        "pass too), unless LOGGING configures the django_fencedjobs logger. Invalid jobs are "
        "skipped, one line each on stderr. Exits 4 when too many handlers it gave up on are "
        "still running (FENCEDJOBS['MAX_ABANDONED_HANDLERS']), for a new process to take over."
    )
    # The system checks run in handle(), after the invalid jobs are reported one line each:
    # an invalid job does not stop the others.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--skip-checks", action="store_true", help="Skip system checks.")
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument("--once", action="store_true", help="One pass over due jobs, then exit.")
        mode.add_argument(
            "--list",
            action="store_true",
            dest="list_jobs",
            help="List the jobs with their schedules and next three fire times, then exit.",
        )
        mode.add_argument(
            "--now",
            metavar="NAME",
            help="Run this job once, now, through its lease, recorded like any run; exit 0 when "
            f"it succeeded, {RUN_DID_NOT_SUCCEED} when it did not (failed, timed out, lost its "
            "fence, or stopped by a signal), 1 when it could not start (unknown, invalid or "
            "paused job, or its lease held by another run).",
        )
        parser.add_argument(
            "--workers",
            type=preflight.positive_int,
            metavar="N",
            help="Run up to N jobs side by side (default: FENCEDJOBS['WORKERS'], 4).",
        )
        parser.add_argument(
            "--job",
            action="append",
            dest="jobs",
            metavar="NAME",
            help="Only this job (repeatable). Default: every registered job.",
        )
        parser.add_argument(
            "--metrics",
            type=_address,
            metavar="[HOST:]PORT",
            help="Serve the Prometheus metrics from this process on HOST:PORT (HOST: "
            "127.0.0.1 unless given; 0.0.0.0 for every interface), with this runner's count "
            "of handlers given up on and still running. Needs prometheus-client.",
        )

    def handle(
        self,
        *args: Any,
        once: bool,
        list_jobs: bool,
        now: str | None,
        jobs: list[str] | None,
        workers: int | None,
        metrics: tuple[str, int] | None,
        **options: Any,
    ) -> None:
        if now is not None:
            if jobs:
                raise CommandError("--now NAME names its job: leave --job out")
            jobs = [now]
        if metrics is not None and (now is not None or list_jobs):
            raise CommandError("--metrics serves a runner's metrics: the loop's or --once's")
        valid, invalid = self._select(jobs, skip_checks=options["skip_checks"])
        if list_jobs:
            if valid or not invalid:
                self.stdout.write(describe_jobs(valid))
            return
        chores = loop.app_chores(loop=not once and now is None)
        dispatcher = loop.Dispatcher(valid, workers=workers, chores=chores)
        with _stopped_by_signals(dispatcher), _as_command_errors():
            with console.terminal_output(self.stderr, options["verbosity"]):
                _start(metrics)
                if now is not None:
                    _run_now(valid[0], dispatcher)
                elif once:
                    self._once(dispatcher, verbose=options["verbosity"] >= 2)
                else:
                    console.runner_started(len(valid), dispatcher.workers)
                    with console.PassReport(valid).connected():
                        dispatcher.loop()

    def _select(self, names: list[str] | None, *, skip_checks: bool) -> tuple[list[Job], list[Job]]:
        """The named jobs (all valid, or a one-line error), else every job (each invalid one
        reported on one line), split into valid and invalid; then the system checks."""
        with preflight.command_errors():
            preflight.check_settings()
        try:
            valid, invalid = preflight.select_jobs(names)  # an instance's name is looked up
        except UnknownJob as exc:
            raise CommandError(str(exc)) from None
        except DatabaseError as exc:
            raise preflight.unavailable(exc) from None
        if names and invalid:
            raise CommandError("; ".join(map(preflight.invalid_job_line, invalid)))
        for job in invalid:
            self.stderr.write(preflight.invalid_job_line(job))
        if not skip_checks:
            with checks.invalid_jobs_reported_separately():
                self.check()
        return valid, invalid

    def _once(self, dispatcher: loop.Dispatcher, *, verbose: bool) -> None:
        runners.record_pass(dispatcher.jobs, dispatcher.workers)
        with console.PassReport(dispatcher.jobs).connected():
            result = dispatcher.tick()
        if verbose:
            for record in result.runs:
                self.stdout.write(str(record))


def _start(metrics: tuple[str, int] | None) -> None:
    """Fail fast on a database unreachable, not migrated or at a stricter isolation level
    (once running, the loop survives it going away); then serve the metrics if asked."""
    preflight.check_tables()
    problem = db.isolation_problem()
    if problem:
        raise CommandError(problem)
    if metrics is None:
        return
    host, port = metrics
    try:
        from django_fencedjobs.integrations import prometheus
    except ImportError as exc:
        raise CommandError(one_line(exc)) from None
    try:
        prometheus.serve(host, port)
    except OSError as exc:
        raise CommandError(f"cannot serve the metrics on {host}:{port}: {exc}") from None


@contextlib.contextmanager
def _as_command_errors() -> Iterator[None]:
    """What ends a runner early, as a one-line error and its exit status."""
    try:
        with preflight.command_errors():  # e.g. a clock that returns no aware datetime
            yield
    except loop.TooManyAbandonedHandlers as exc:
        raise CommandError(str(exc), returncode=TOO_MANY_ABANDONED_HANDLERS) from None
    except FencedJobsError as exc:  # --now: paused, or its lease is held
        raise CommandError(str(exc)) from None


@contextlib.contextmanager
def _stopped_by_signals(dispatcher: loop.Dispatcher) -> Iterator[None]:
    """SIGTERM and SIGINT stop ``dispatcher`` for the duration: the first gracefully, a
    second at once (:func:`_exit_now`). The handler only puts the signal on a ``SimpleQueue``
    for a thread that stops the dispatcher: a handler runs in the main thread between two
    bytecodes, perhaps while it holds the lock of one of the dispatcher's events
    (``Event.clear()``, ``wait()``), and setting the event there would wait for it forever."""
    received: queue.SimpleQueue[int | None] = queue.SimpleQueue()

    def stop_gracefully(signum: int, frame: FrameType | None) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, _exit_now)
        received.put(signum)

    def relay() -> None:
        signum = received.get()
        if signum is not None:
            # The line first: once stopped, the process may end before this thread runs again.
            print(
                f"received {signal.Signals(signum).name}: stopping after the current batch",
                file=sys.stderr,
                flush=True,
            )
            dispatcher.request_stop()  # finish the batch, record, release, end

    threading.Thread(target=relay, name="fencedjobs-stop-signal", daemon=True).start()
    previous = {sig: signal.signal(sig, stop_gracefully) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        received.put(None)  # the relay ends, if no signal came


def _run_now(job: Job, dispatcher: loop.Dispatcher) -> None:
    """``--now``: exit 0 when the run succeeded, else :data:`RUN_DID_NOT_SUCCEED`, with one
    line saying why. A run a signal stopped did not succeed either: the work it was asked
    for is not all done, and a script that runs ``--now`` before its next step must not go
    on (the loop and ``--once`` exit 0 on that signal: for them it is the way to stop)."""
    record = manual.run_now(job, stop=dispatcher.stop)
    if record.outcome == Outcome.INTERRUPTED:
        raise CommandError(
            f"the run of {job.name} was interrupted by a signal: it stopped after its "
            "current batch, recorded; the next run goes on from there",
            returncode=RUN_DID_NOT_SUCCEED,
        )
    if record.outcome != Outcome.SUCCEEDED:
        why = error_excerpt(record.error)
        raise CommandError(
            f"the run of {job.name} {record.outcome}" + (f": {why}" if why else ""),
            returncode=RUN_DID_NOT_SUCCEED,
        )


def _exit_now(signum: int, frame: FrameType | None) -> None:
    """A second SIGTERM or SIGINT, while stopping: one line, and the process is killed by
    that signal (exit status 128 + its number). Nothing is recorded: the runs in progress
    keep their leases, roll back, and are marked abandoned by their job's next run."""
    sys.stderr.write(
        f"received {signal.Signals(signum).name} while stopping: exiting now; runs in "
        "progress roll back their open transactions and are marked abandoned by their "
        "job's next run, once their leases expire\n"
    )
    sys.stderr.flush()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _address(text: str) -> tuple[str, int]:
    """``[HOST:]PORT``: the host (127.0.0.1 when not given) and the port."""
    host, _, port = text.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 0 < number < 65536:
        raise argparse.ArgumentTypeError(f"expected [HOST:]PORT, e.g. 127.0.0.1:9108, got {text!r}")
    return host or "127.0.0.1", number
