"""The soak's driver: the database, the runner processes, the faults, the phases.

1. **Set-up.** A database of its own on the ``DATABASE_URL`` server (dropped at the end),
   migrated (the app's tables, the jobs' tables, the triggers of :mod:`soak.soakapp.models`),
   :data:`~soak.plan.INITIAL_ITEMS` items.
2. **Faults**, for ``seconds``: runner ``A`` (``manage.py runjobs``, every job) and runner
   ``B`` (``manage.py runjobs --job ...``, three of the five jobs) run all along, and a
   cron-like launcher starts ``manage.py runjobs --once`` (``C1``, ``C2``...) every 2 to
   5 s. The plan's faults hit them; a loop runner that dies (SIGKILL, SIGTERM, or by
   itself) is started again after a drawn delay. New items keep arriving, and the plan's
   operations (:class:`~soak.plan.Op`) are applied from the driver's own connection:
   instances created, edited, disabled, enabled, deleted and re-created, backfills,
   one-offs and skips.
3. **Quiet period**, for ``quiet`` seconds: the final SIGCONT of anything still stopped,
   the loops restarted at once if they were down, the file ``calm`` written (the jobs stop
   misbehaving on purpose); runners and cron go on. The checker measures, from this
   moment, how long every job goes without progress.
4. **Shutdown**: SIGTERM to every runner (each must exit 0 within :data:`TERM_WAIT`), then
   ``runjobs --once`` (``F1``...) once every job is due again, so that runs left
   ``running`` by killed processes are marked abandoned; repeated (at most
   :data:`FINAL_PASSES` times) while an item is still pending or a job was not run.
5. **Check** (:mod:`soak.check`) and report (:mod:`soak.report`).

Every process's output goes to ``<dir>/logs/<label>-<pid>.log``; the jobs' acks to
``<dir>/acks/``.
"""

from __future__ import annotations

import contextlib
import ctypes
import heapq
import itertools
import os
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from soak.plan import AIM_WAIT, INITIAL_ITEMS, Fault, Op, Plan

REPO = Path(__file__).resolve().parent.parent
#: A runner asked to stop with SIGTERM must exit within this many seconds.
TERM_WAIT = 30.0
#: At most this many final ``runjobs --once`` passes.
FINAL_PASSES = 6
#: The jobs runner ``B`` runs (``--job``); ``A`` and the cron runs take every job.
B_JOBS = ("soak.windows", "soak.items", "soak.slow")

T = TypeVar("T")


def log(message: str) -> None:
    print(f"soak: {message}", flush=True)


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL it when the driver dies, however it dies."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def process_state(pid: int) -> str:
    """The state letter of /proc/<pid>/stat (R, S, T, Z...), or "gone"."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return "gone"
    return stat.rsplit(")", 1)[1].split()[0]


@dataclass
class Runner:
    label: str
    #: "A", "B", "C" (cron) or "F" (final pass).
    role: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    started: float = field(default_factory=time.monotonic)
    stopped: bool = False
    #: How the driver ended it, if it did: "kill" or "term".
    ended_by: str = ""
    #: At the SIGTERM: had it connected to the database (so its handlers were in place)?
    started_up: bool = True
    reaped: bool = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 3) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])


@dataclass
class Outcomes:
    """What the driver saw; the checker and the report read it."""

    faults: Counter[str] = field(default_factory=Counter)
    #: Where each SIGSTOP landed, from pg_stat_activity: "in a transaction" (idle in
    #: transaction: it holds its locks while stopped), "mid-statement", "outside a
    #: transaction", "no connection".
    landed: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    restarts: int = 0
    cron_started: int = 0
    cron_skipped: int = 0
    #: Exit codes of runjobs processes the driver did not end itself, by role and kind.
    exits: Counter[str] = field(default_factory=Counter)
    #: Loop runners that exited by themselves (not killed or terminated by the driver, not
    #: refused at start because the database was down): (label, code, tail of its log).
    loop_deaths: list[tuple[str, int, str]] = field(default_factory=list)
    #: SIGTERMed runners that did not exit 0 within TERM_WAIT: (label, code or None, tail).
    bad_stops: list[tuple[str, int | None, str]] = field(default_factory=list)
    items_created: list[int] = field(default_factory=list)
    #: The operations applied, by what they did ("upsert: created", "backfill: 3 slots",
    #: "delete: failed (OperationalError)"...).
    ops: Counter[str] = field(default_factory=Counter)
    producer_failures: int = 0
    backfilled_slots: int = 0
    final_passes: int = 0
    final_labels: list[str] = field(default_factory=list)
    #: The database's clock at the final SIGCONT, and at the end of the quiet period.
    calm_at: datetime | None = None
    quiet_end: datetime | None = None
    started_at: datetime | None = None
    #: Where the windows jobs start (``SOAK_ORIGIN``).
    origin: datetime | None = None
    pg_restart_seconds: list[float] = field(default_factory=list)
    server_version: str = ""
    #: From the runners' logs: Python tracebacks, and exceptions Python could only report
    #: ("Exception ignored in: <where>"), by where.
    tracebacks: int = 0
    ignored: Counter[str] = field(default_factory=Counter)
    wall_seconds: float = 0.0


class Driver:
    def __init__(
        self,
        plan: Plan,
        *,
        workdir: Path,
        database: str,
        pg_ctl: list[str] | None,
        python: str = sys.executable,
        sabotage: str | None = None,
    ) -> None:
        self.sabotage = sabotage
        self.plan = plan
        self.dir = workdir
        self.database = database
        self.pg_ctl = pg_ctl
        self.python = python
        self.seen = Outcomes()
        self.runners: list[Runner] = []
        self.loops: dict[str, Runner | None] = {"A": None, "B": None}
        self.cron_count = 0
        self.final_count = 0
        self.origin = datetime.now(UTC).replace(microsecond=0)
        self.seen.origin = self.origin
        self._restart_delays = iter(plan.restart_delays)
        self._restart_at: dict[str, float] = {}
        self._releases: dict[int, int] = {}  # pid -> stop number still to be released
        self._stop_numbers = itertools.count(1)
        self._order = itertools.count()
        #: Aimed faults waiting for a runner in a run, or inside a transaction.
        self._aimed: list[tuple[Fault, float]] = []
        self._calm = False
        self._shutting_down = False
        #: Per instance key, its arguments' generation (every upsert a new one).
        self._gen: Counter[str] = Counter()
        #: Per backfilled job, where its last backfill ended: backfills never overlap, so
        #: each backfill slot's row is armed once.
        self._backfilled: dict[str, datetime] = {}

    # -- processes ----------------------------------------------------------------------------

    def env(self, label: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            DJANGO_SETTINGS_MODULE="soak.settings",
            FENCEDJOBS_SOAK_DB=self.database,
            SOAK_DIR=str(self.dir),
            SOAK_SEED=str(self.plan.seed),
            SOAK_ORIGIN=self.origin.isoformat(),
            SOAK_RUNNER=label,
            PYTHONUNBUFFERED="1",
        )
        if self.sabotage and label[0] != "F":  # the final passes run the real thing
            env["SOAK_SABOTAGE"] = self.sabotage
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        return env

    def spawn(self, role: str, label: str, args: list[str]) -> Runner:
        path = self.dir / "logs" / f"{label}.log"
        with open(path, "ab") as out:
            proc = subprocess.Popen(
                [self.python, str(REPO / "manage.py"), "runjobs", *args],
                cwd=REPO,
                env=self.env(label),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,  # safe: the driver is single-threaded
            )
        runner = Runner(label, role, proc, path)
        self.runners.append(runner)
        return runner

    def start_loop(self, role: str) -> None:
        args = [] if role == "A" else [arg for name in B_JOBS for arg in ("--job", name)]
        number = sum(r.role == role for r in self.runners) + 1
        self.loops[role] = self.spawn(role, f"{role}{number}", args)
        self._restart_at.pop(role, None)

    def cron_tick(self) -> None:
        running = [r for r in self.runners if r.role == "C" and r.alive]
        if len(running) >= 3:
            self.seen.cron_skipped += 1
            return
        self.cron_count += 1
        self.seen.cron_started += 1
        self.spawn("C", f"C{self.cron_count}", ["--once"])

    def target(self, name: str) -> Runner | None:
        """The running, not stopped, process a fault aims at."""
        if name in ("A", "B"):
            runner = self.loops[name]
            return runner if runner is not None and runner.alive else None
        crons = [r for r in self.runners if r.role == "C" and r.alive and not r.stopped]
        return crons[-1] if crons else None

    def reap(self) -> None:
        """Notice exits; schedule the restart of a loop runner that is gone."""
        for runner in self.runners:
            if runner.reaped or runner.alive:
                continue
            runner.reaped = True
            code = runner.proc.returncode
            self._releases.pop(runner.pid, None)
            if runner.ended_by == "kill":
                continue
            tail = runner.tail()
            # Refused at start: every command's exit status for a database it cannot read
            # (django_fencedjobs.preflight.DATABASE_UNAVAILABLE).
            refused = code == 3 and "database unavailable" in tail
            early = code == -signal.SIGTERM and not runner.started_up
            if runner.ended_by == "term":
                kind = "SIGTERM, exit 0" if code == 0 else f"SIGTERM, exit {code}"
                kind += " (during start-up)" if early else ""
            elif refused:
                kind = "exit 3: database unavailable"
            else:
                kind = f"exit {code}"
            self.seen.exits[f"{'loop' if runner.role in 'AB' else 'once'}: {kind}"] += 1
            if runner.role in ("A", "B") and not runner.ended_by and not refused:
                self.seen.loop_deaths.append((runner.label, code, tail))
            if runner.ended_by == "term" and code != 0 and not early and runner.role in "AB":
                self.seen.bad_stops.append((runner.label, code, tail))
        if self._shutting_down:
            return
        for role, loop in self.loops.items():
            if (loop is None or not loop.alive) and role not in self._restart_at:
                delay = 0.0 if self._calm else next(self._restart_delays, 1.0)
                self._restart_at[role] = time.monotonic() + delay

    def restart_due_loops(self) -> None:
        now = time.monotonic()
        for role, at in list(self._restart_at.items()):
            if at <= now:
                self.seen.restarts += 1
                self.start_loop(role)

    # -- signals --------------------------------------------------------------------------------

    def stop(self, runner: Runner, fault: Fault, events: list[Any]) -> None:
        try:
            os.kill(runner.pid, signal.SIGSTOP)
        except ProcessLookupError:
            self.seen.skipped[f"{fault.kind}: target gone"] += 1
            return
        deadline = time.monotonic() + 5
        while process_state(runner.pid) not in ("T", "t", "gone", "Z"):
            if time.monotonic() > deadline:
                break
            time.sleep(0.002)
        runner.stopped = True
        self.seen.faults["SIGSTOP"] += 1
        self.seen.landed[self.where_stopped(runner)] += 1
        number = next(self._stop_numbers)
        self._releases[runner.pid] = number
        heapq.heappush(
            events,
            (
                time.monotonic() + fault.hold,
                0,
                next(self._order),
                "release",
                (runner, number, fault),
            ),
        )

    def release(self, runner: Runner, number: int, how: str) -> None:
        if self._releases.get(runner.pid) != number or not runner.alive:
            return
        del self._releases[runner.pid]
        if how == "kill":
            self.kill(runner)
        else:
            os.kill(runner.pid, signal.SIGCONT)
            runner.stopped = False
            self.seen.faults["SIGCONT"] += 1

    def kill(self, runner: Runner) -> None:
        self.seen.faults["SIGKILL (stopped)" if runner.stopped else "SIGKILL (running)"] += 1
        runner.ended_by = "kill"
        with contextlib.suppress(ProcessLookupError):
            os.kill(runner.pid, signal.SIGKILL)
        runner.proc.wait(10)
        runner.stopped = False

    def sessions(self, runner: Runner) -> list[str] | None:
        """The states of the process's sessions in pg_stat_activity; None if the server
        does not answer."""
        name = f"soak:{runner.label}:{runner.pid}"
        return self.db(
            lambda cursor: [
                row[0]
                for row in _fetch(
                    cursor,
                    "SELECT coalesce(state, '') FROM pg_stat_activity WHERE application_name = %s",
                    [name],
                )
            ],
            default=None,
        )

    def where_stopped(self, runner: Runner) -> str:
        """Where the SIGSTOP caught the process, from its sessions in pg_stat_activity."""
        states = self.sessions(runner)
        if states is None:
            return "unknown (database down)"
        if any(state.startswith("idle in transaction") for state in states):
            return "in a transaction"
        if "active" in states:
            return "mid-statement"
        return "outside a transaction" if states else "no connection"

    def restart_server(self) -> None:
        if self.pg_ctl is None:
            self.seen.skipped["pg_restart: no pg_ctl (DATABASE_URL given)"] += 1
            return
        started = time.monotonic()
        proc = subprocess.run(
            [*self.pg_ctl, "restart", "-m", "fast", "-w", "-t", "60"],
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"pg_ctl restart failed ({proc.returncode}): {proc.stdout}")
        self.seen.faults["PostgreSQL restart"] += 1
        self.seen.pg_restart_seconds.append(time.monotonic() - started)
        from django.db import connections

        connections.close_all()

    def apply(self, fault: Fault, events: list[Any]) -> None:
        if fault.kind == "pg_restart":
            self.restart_server()
            return
        if fault.kind == "stop_inside" or fault.aim:
            self._aimed.append((fault, time.monotonic() + AIM_WAIT))
            return
        self.hit(fault, self.target(fault.target), events)

    def hit(self, fault: Fault, runner: Runner | None, events: list[Any]) -> None:
        if fault.kind == "term" and (runner is None or runner.stopped or runner.ended_by):
            # The rarest fault (often drawn once in a soak) is not lost to bad timing: when
            # its loop is down, stopped or already stopping on an earlier SIGTERM (a second
            # one interrupts at once, by design: `runjobs`), the other loop gets it, and
            # when neither can, it is tried again half a second later (until the fault
            # phase ends).
            others = (self.target(name) for name in ("A", "B"))
            runner = next(
                (r for r in others if r is not None and not r.stopped and not r.ended_by), None
            )
            if runner is None:
                when = time.monotonic() + 0.5
                heapq.heappush(events, (when, 1, next(self._order), "fault", fault))
                return
        if runner is None or (runner.stopped and fault.kind != "kill"):
            self.seen.skipped[f"{fault.kind}: {fault.target} not running or stopped"] += 1
            return
        if fault.kind in ("stop", "stop_inside"):
            self.stop(runner, fault, events)
        elif fault.kind == "kill":
            self._releases.pop(runner.pid, None)
            self.kill(runner)
        elif fault.kind == "term":
            self.terminate(runner)
            self.seen.faults["SIGTERM"] += 1

    def terminate(self, runner: Runner) -> None:
        """SIGTERM, noting whether the process had got as far as connecting: before that it
        may not have installed its signal handlers, and dies of the signal (-15) by
        Python's default, which is not the app's doing."""
        runner.ended_by = "term"
        runner.started_up = bool(self.sessions(runner))
        with contextlib.suppress(ProcessLookupError):
            os.kill(runner.pid, signal.SIGTERM)

    def poll_aimed(self, events: list[Any]) -> None:
        """Aimed faults: hit the first runner found in a run (``<dir>/busy/``) or sleeping
        inside a fenced transaction (``<dir>/inside/``); the runners mark themselves there.
        Past the wait, an aimed ``stop``/``kill`` hits its planned runner instead, and a
        ``stop_inside`` is dropped."""
        if not self._aimed:
            return
        by_pid = {r.pid: r for r in self.runners if r.alive and not r.stopped}
        marked = {
            where: [
                by_pid[int(name)]
                for name in sorted(os.listdir(self.dir / where))
                if name.isdigit() and int(name) in by_pid
            ]
            for where in ("busy", "inside")
        }
        waiting: list[tuple[Fault, float]] = []
        for fault, deadline in self._aimed:
            inside = fault.kind == "stop_inside"
            found = [r for r in marked["inside" if inside else "busy"] if r.alive and not r.stopped]
            if found:
                self.seen.faults[
                    "SIGSTOP aimed inside a transaction"
                    if inside
                    else f"{fault.kind} aimed at a run"
                ] += 1
                self.hit(fault, found[0], events)
            elif time.monotonic() <= deadline:
                waiting.append((fault, deadline))
            elif inside:
                self.seen.skipped["stop_inside: nobody inside in time"] += 1
            else:
                self.seen.faults[f"{fault.kind} aimed at a run: nobody in one, planned target"] += 1
                self.hit(fault, self.target(fault.target), events)
        self._aimed = waiting

    # -- the database -----------------------------------------------------------------------

    def db(self, action: Callable[[Any], T], default: T) -> T:
        """Run ``action(cursor)`` on the driver's connection; ``default`` when the server is
        away (the connection is then dropped, to be reopened next time)."""
        from django.db import Error, connection

        try:
            with connection.cursor() as cursor:
                return action(cursor)
        except Error:
            with contextlib.suppress(Error):
                connection.close()
            return default

    def db_now(self) -> datetime:
        for _ in range(100):
            value = self.db(lambda c: _fetch(c, "SELECT clock_timestamp()", [])[0][0], None)
            if value is not None:
                return value.astimezone(UTC)
            time.sleep(0.2)
        raise RuntimeError("the database did not answer for 20 s")

    def produce(self, count: int) -> None:
        if count <= 0:
            return
        from django.db import Error, connection

        from soak.soakapp.models import Item

        try:
            created = Item.objects.bulk_create([Item() for _ in range(count)])
        except Error:
            self.seen.producer_failures += 1
            with contextlib.suppress(Error):
                connection.close()
            return
        self.seen.items_created.extend(item.pk for item in created)

    # -- operations -----------------------------------------------------------------------

    def operate(self, op: Op) -> None:
        """Apply one operation; a refusal (the server away, a row locked past the bounded
        wait, a backfill with nothing to do) is counted, not fatal."""
        from django.core.exceptions import ValidationError
        from django.db import Error, connection

        from django_fencedjobs.exceptions import FencedJobsError

        try:
            what = self._operate(op)
        except (Error, FencedJobsError, ValidationError) as exc:
            what = f"refused ({type(exc).__name__})"
            if isinstance(exc, Error):
                with contextlib.suppress(Error):
                    connection.close()
        self.seen.ops[f"{op.kind}: {what}"] += 1

    def _operate(self, op: Op) -> str:
        from django_fencedjobs import backfills, manual
        from django_fencedjobs.instances import Instances
        from django_fencedjobs.registry import registry
        from soak.specs import INSTANCES

        instances = Instances(INSTANCES)
        if op.kind in ("upsert", "recreate"):
            existed = instances.all().filter(key=op.target).exists()
            if op.kind == "recreate":
                if not instances.delete(op.target):
                    return "nothing to delete"
            self._gen[op.target] += 1
            instances.upsert(
                op.target,
                every=timedelta(seconds=op.every),
                kwargs={"gen": self._gen[op.target], "tag": op.kind},
            )
            if op.kind == "recreate":
                return "deleted and created"
            return "edited" if existed else "created"
        if op.kind in ("disable", "enable"):
            changed = instances.set_enabled([op.target], op.kind == "enable")
            return "done" if changed else "no such instance"
        if op.kind == "delete":
            return "deleted" if instances.delete(op.target) else "no such instance"
        now = self.db_now()
        if op.kind == "backfill":
            end = now - timedelta(seconds=0.5)
            start = max(
                end - timedelta(seconds=op.span), self._backfilled.get(op.target, self.origin)
            )
            if start >= end:
                return "nothing new to backfill"
            _, plan = backfills.backfill(
                op.target,
                start,
                end,
                selection=op.selection,
                concurrency=op.concurrency,
                requested_by="soak",
            )
            self._backfilled[op.target] = end
            self.seen.backfilled_slots += len(plan.slots)
            return f"{min(len(plan.slots), 3)}{'+' if len(plan.slots) > 3 else ''} slot(s)"
        if op.kind == "once":
            at = now + timedelta(seconds=op.span)
            # An instance's one-off runs with an argument of its own over the instance's.
            kwargs = {"tag": "once"} if op.target.startswith(f"{INSTANCES}[") else None
            backfills.run_once(op.target, at, kwargs=kwargs)
            return "queued"
        if op.kind == "skip":
            manual.skip_next_slot(registry.get(op.target), by="soak")
            return "skipped"
        raise ValueError(f"unknown operation {op.kind!r}")

    # -- phases -------------------------------------------------------------------------------

    def setup(self) -> None:
        from django.core.management import call_command

        from soak.soakapp.models import JobTick
        from soak.specs import SPECS

        for sub in ("logs", "acks", "inside", "busy"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        call_command("migrate", verbosity=0)
        JobTick.objects.bulk_create([JobTick(job=name) for name in SPECS], ignore_conflicts=True)
        self.quiet_minutes()
        self.produce(INITIAL_ITEMS)
        self.seen.started_at = self.db_now()
        self.seen.server_version = self.db(
            lambda cursor: _fetch(cursor, "SELECT version()", [])[0][0], ""
        ).split(" on ")[0]

    def quiet_minutes(self) -> None:
        """The calendar ``soak.retrying`` avoids: a window over the first seconds of each
        minute from the start to well past the end (a window of the day recurs daily; the
        soak is shorter than a day)."""
        from django_fencedjobs.models import Calendar, CalendarExclusion
        from soak.specs import QUIET, QUIET_SECONDS

        calendar, _ = Calendar.objects.get_or_create(name=QUIET, defaults={"timezone": "UTC"})
        minute = self.origin.replace(second=0) - timedelta(minutes=1)
        end = self.origin + timedelta(seconds=self.plan.seconds + self.plan.quiet + 1800)
        windows = []
        while minute < end and len(windows) < 1440:
            windows.append(
                CalendarExclusion(
                    calendar=calendar,
                    label=f"quiet {minute:%H:%M}",
                    starts=minute.time(),
                    ends=(minute + timedelta(seconds=QUIET_SECONDS)).time(),
                )
            )
            minute += timedelta(minutes=1)
        CalendarExclusion.objects.bulk_create(windows)

    def run(self) -> Outcomes:
        began = time.monotonic()
        try:
            return self._run()
        finally:
            self.seen.wall_seconds = time.monotonic() - began

    def _run(self) -> Outcomes:
        self.setup()
        events: list[Any] = []
        start = time.monotonic()
        for fault in self.plan.faults:
            heapq.heappush(events, (start + fault.at, 1, next(self._order), "fault", fault))
        for at in self.plan.cron:
            heapq.heappush(events, (start + at, 2, next(self._order), "cron", None))
        for at, count in self.plan.produce:
            heapq.heappush(events, (start + at, 3, next(self._order), "produce", count))
        for op in self.plan.ops:
            heapq.heappush(events, (start + op.at, 4, next(self._order), "op", op))
        calm_at = start + self.plan.seconds
        heapq.heappush(events, (calm_at, 0, next(self._order), "calm", None))
        end = calm_at + self.plan.quiet
        self.start_loop("A")
        self.start_loop("B")
        log(f"fault phase: {self.plan.seconds:.0f}s, then a quiet period of {self.plan.quiet:.0f}s")
        last_note = start
        while True:
            now = time.monotonic()
            if now >= end:
                break
            self.reap()
            self.restart_due_loops()
            while events and events[0][0] <= time.monotonic():
                _, _, _, kind, payload = heapq.heappop(events)
                if kind == "fault" and not self._calm:
                    self.apply(payload, events)
                elif kind == "release" and not self._calm:
                    runner, number, fault = payload
                    self.release(runner, number, fault.release)
                elif kind == "cron":
                    self.cron_tick()
                elif kind == "produce":
                    self.produce(payload)
                elif kind == "op" and not self._calm:
                    self.operate(payload)
                elif kind == "calm":
                    self.calm_down()
            if not self._calm:
                self.poll_aimed(events)
            if now - last_note >= 30:
                last_note = now
                log(
                    f"{now - start:5.0f}s: "
                    + ", ".join(f"{k} {v}" for k, v in sorted(self.seen.faults.items()))
                )
            wait = 0.02 if self._aimed else 0.1
            if events:
                wait = min(wait, max(events[0][0] - time.monotonic(), 0))
            time.sleep(max(wait, 0.005))
        self.seen.quiet_end = self.db_now()
        self.shutdown()
        self.final_passes()
        self.read_logs()
        return self.seen

    def read_logs(self) -> None:
        for path in sorted((self.dir / "logs").glob("*.log")):
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("Traceback (most recent call last)"):
                    self.seen.tracebacks += 1
                elif line.startswith("Exception ignored in: "):
                    self.seen.ignored[line.removeprefix("Exception ignored in: ")] += 1

    def calm_down(self) -> None:
        """The end of the faults: SIGCONT whatever is stopped, loops up at once, calm."""
        self._calm = True
        self._aimed.clear()
        for runner in self.runners:
            if runner.alive and runner.stopped:
                os.kill(runner.pid, signal.SIGCONT)
                runner.stopped = False
                self.seen.faults["SIGCONT"] += 1
        self._releases.clear()
        (self.dir / "calm").touch()
        self.seen.calm_at = self.db_now()
        self.reap()
        for role in list(self._restart_at):
            self._restart_at[role] = 0.0
        self.restart_due_loops()
        log(f"final SIGCONT at {self.seen.calm_at:%H:%M:%S} (database clock); quiet period")

    def shutdown(self) -> None:
        """SIGTERM every runner; each must exit 0 within TERM_WAIT."""
        self._shutting_down = True
        self.reap()
        alive = [r for r in self.runners if r.alive]
        for runner in alive:
            if not runner.ended_by:  # one SIGTERM each: a second one interrupts at once
                self.terminate(runner)
        for runner in alive:
            try:
                runner.proc.wait(TERM_WAIT)
            except subprocess.TimeoutExpired:
                self.seen.bad_stops.append((runner.label, None, runner.tail()))
                runner.ended_by = "kill"
                runner.proc.kill()
                runner.proc.wait(10)
        self.reap()
        log(f"runners stopped with SIGTERM ({len(alive)})")

    def kill_all(self) -> None:
        """Whatever happened: no runner outlives the driver."""
        for runner in self.runners:
            if runner.alive:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(runner.pid, signal.SIGCONT)
                    runner.proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    runner.proc.wait(10)

    def final_passes(self) -> None:
        """``runjobs --once`` once every job is due again, until every job ran in a final
        pass and no item is pending (at most FINAL_PASSES passes)."""
        from django_fencedjobs.models import JobRun
        from soak.soakapp.models import Item
        from soak.specs import SPECS

        ran: set[str] = set()
        for _ in range(FINAL_PASSES):
            self.wait_all_due()
            self.final_count += 1
            label = f"F{self.final_count}"
            runner = self.spawn("F", label, ["--once"])
            try:
                runner.proc.wait(120)
            except subprocess.TimeoutExpired:
                runner.proc.kill()
                runner.proc.wait(10)
            self.seen.final_passes += 1
            self.seen.final_labels.append(f"{label}:{runner.pid}")
            if runner.proc.returncode != 0:
                self.seen.exits[f"final: exit {runner.proc.returncode}"] += 1
            ran |= set(
                JobRun.objects.filter(owner=f"{label}:{runner.pid}").values_list("job", flat=True)
            )
            pending = Item.objects.filter(done_at=None).exists()
            if ran >= set(SPECS) and not pending:
                break

    def wait_all_due(self, timeout: float = 60.0) -> None:
        from django.db.models import Q

        from django_fencedjobs.models import JobLease
        from soak.specs import SPECS

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = self.db_now()
            waiting = (
                JobLease.objects.filter(name__in=list(SPECS))
                .filter(Q(next_run_at__gt=now) | Q(lease_until__gte=now) | Q(paused=True))
                .exists()
            )
            if not waiting:
                return
            time.sleep(0.2)


def _fetch(cursor: Any, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    cursor.execute(sql, params)
    return list(cursor.fetchall())


# -- the soak's own database ---------------------------------------------------------------------


def server_params() -> dict[str, Any]:
    from tests.settings import parse_database_url

    db = parse_database_url(os.environ["DATABASE_URL"])
    params: dict[str, Any] = {
        "dbname": db["NAME"],
        "user": db["USER"] or None,
        "password": db["PASSWORD"] or None,
        "host": db["HOST"] or None,
        "port": db["PORT"] or None,
    }
    params.update(db["OPTIONS"])
    return {k: v for k, v in params.items() if v is not None}


@contextlib.contextmanager
def own_database(name: str, *, keep: bool) -> Iterator[str]:
    """Create database ``name`` on the server for the soak; drop it afterwards unless
    ``keep``."""
    import psycopg

    with psycopg.connect(**server_params(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        from django.db import connections

        connections.close_all()
        if keep:
            log(f"kept database {name}")
        else:
            with contextlib.suppress(Exception):
                with psycopg.connect(**server_params(), autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pg_ctl_prefix() -> list[str] | None:
    value = os.environ.get("FENCEDJOBS_TEST_PG_CTL")
    return shlex.split(value) if value else None
