"""``manage.py demo`` (what ``make demo`` runs): set up the example project and run the
scheduler and the admin together in the foreground until Ctrl-C.

1. apply migrations; create or reset the ``admin`` login; seed reminders and events, and
   the instances of ``demo.tenant_digest`` that are missing;
2. ask for one run of every job now ("run now", through the lease as any run), and of
   every enabled instance (a job of its own, ``job[key]``), so each has a recorded run in
   the first seconds, unless its next slot is that close anyway; then they run on their
   own schedules;
3. start ``manage.py runjobs`` (with notifications on: each change of a job's state is a
   mail, printed by the console backend), ``manage.py db_worker`` (django-tasks-db's worker, which
   runs the tasks the scheduled job ``demo.write_digest`` enqueues) and ``manage.py
   runserver --noreload``, each in its own process group, report once every job has a
   succeeded run and once the worker has run a task a run enqueued, then print the admin's
   address and the login in a box, below the log lines of those first runs;
4. on Ctrl-C (or SIGTERM, SIGHUP): forward it, wait for all three (runjobs finishes its
   current batch and releases its lease, db_worker its current task), kill what is left
   after a bounded wait, and check that nothing is left.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from django_fencedjobs import clock, declared, lease, operations
from django_fencedjobs.instances import instance_job
from django_fencedjobs.models import JobInstance, JobRun, Outcome, RunTask, TaskStatus
from django_fencedjobs.registry import Job
from example_project.demo.management.commands.demo_seed import seed, seed_instances
from example_project.demo.models import Digest, Reminder, Rollup, TenantDigest
from example_project.demo.supervise import Supervisor

REPO_ROOT = Path(__file__).resolve().parents[4]
MANAGE_PY = REPO_ROOT / "manage.py"
#: Where a generated admin password is kept between demo runs (git-ignored).
PASSWORD_FILE = REPO_ROOT / ".demo" / "admin-password"
#: How long to watch for every job's first succeeded run before saying it is missing.
FIRST_RUNS_DEADLINE = 120.0
#: The scheduled task's job: its runs enqueue a task that db_worker runs.
TASK_JOB = "demo.write_digest"
#: A job whose next slot is this close is not asked to run now as well: it runs at that
#: slot within seconds anyway, and a run just before its slot is superseded by the slot's
#: run at once. For ``demo.write_digest`` that would end the task the first run enqueued
#: in ``FenceLost`` (its writes are fenced by the run that enqueued it) whenever the
#: worker, still starting, had not run it before the slot.
RUN_NOW_MARGIN = timedelta(seconds=10)
#: The job declared with instances: its instances (rows) are edited in the admin.
INSTANCES_JOB = "demo.tenant_digest"


class Command(BaseCommand):
    help = (
        "Run the demo: migrate, seed, then the scheduler, a task worker and the admin until Ctrl-C."
    )
    requires_system_checks: list[str] = []  # the children run them

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--port",
            type=int,
            default=int(os.environ.get("DEMO_PORT") or 8000),
            help="Port of the admin on 127.0.0.1 (default: $DEMO_PORT or 8000).",
        )

    def handle(self, *args: Any, port: int, **options: Any) -> None:
        started = time.monotonic()
        address = f"127.0.0.1:{port}"
        if not _port_free(port):
            raise CommandError(f"port {port} is in use; run e.g. `make demo DEMO_PORT={port + 1}`")
        say = self._say

        try:
            call_command("migrate", interactive=False, verbosity=0)
            say(f"database ready: {_describe_db()}")
            password = _ensure_admin()
            reminders, events = seed()
            say(f"seeded {reminders} reminders (3 due now, then one a minute) and {events} events")
            added = seed_instances()
            for line in _describe_instances(added):
                say(line)
            names, soon, paused, kicked_at = _run_every_job_now()
            for name in paused:
                say(f"{name} is paused: not asked to run")
            for name in names:
                if name in soon:
                    seconds = max((soon[name] - kicked_at).total_seconds(), 0)
                    say(f"{name}: its next slot is {seconds:.0f}s away; it runs then")
                else:
                    say(f"run now: {name} (made due at once, through the lease like any run)")
        except KeyboardInterrupt:
            raise CommandError("interrupted while setting up", returncode=130) from None
        connections.close_all()  # the children open their own

        supervisor = Supervisor()
        supervisor.install_signal_handlers()
        python = sys.executable
        try:
            # Notifications on for the runner: each change of a job's state is a mail, which
            # the console backend prints among its lines.
            notify = {**os.environ, "FENCEDJOBS_NOTIFY": os.environ.get("FENCEDJOBS_NOTIFY", "1")}
            jobs = supervisor.start("runjobs", [python, str(MANAGE_PY), "runjobs"], env=notify)
            # --no-reload: the worker is this process, not a reloader's child (DEBUG
            # turns the reloader on by default).
            worker = supervisor.start(
                "db_worker", [python, str(MANAGE_PY), "db_worker", "--no-reload"]
            )
            web = supervisor.start(
                "runserver", [python, str(MANAGE_PY), "runserver", address, "--noreload"]
            )
            say(
                f"started runjobs (pid {jobs.pid}), db_worker (pid {worker.pid}) and "
                f"runserver (pid {web.pid})"
            )
            supervisor.wait(30, until=lambda: _accepts(port))
            if not supervisor.stopping and supervisor.first_exited() is None:
                say(
                    f"admin at http://{address}/admin/; the login follows once the first runs "
                    "are in"
                )
            self._watch(supervisor, names, kicked_at, started, _login_box(address, password), port)
        finally:
            if supervisor.children:
                say(
                    "stopping: runjobs finishes its current batch and releases its lease, "
                    "db_worker its current task"
                )
                supervisor.stop()
        left = supervisor.leftovers()
        if left:
            raise CommandError(f"process groups still alive after stopping: {left}")
        crashed = [
            c for c in supervisor.children if c.process and c.process.returncode not in (0, None)
        ]
        if not supervisor.stopping and crashed:
            raise CommandError(
                ", ".join(
                    f"{c.name} exited with {c.process.returncode}" for c in crashed if c.process
                )
            )
        say("demo stopped; no process left behind")

    def _watch(
        self,
        supervisor: Supervisor,
        names: list[str],
        since: datetime,
        started: float,
        login_box: list[str],
        port: int,
    ) -> None:
        """Say when every job has a succeeded run and when the worker has run a task, then
        print ``login_box``: after the burst of log lines of the first runs, where it is
        seen, not above them."""
        pending = set(names)
        task_pending = TASK_JOB in names
        box_pending = True
        deadline = time.monotonic() + FIRST_RUNS_DEADLINE
        while not supervisor.stopping:
            exited = supervisor.first_exited()
            if exited is not None:
                assert exited.process is not None
                self._say(
                    f"{exited.name} exited with {exited.process.returncode}; stopping the demo"
                )
                if exited.name == "runserver":
                    self._say(
                        f"if its port was taken meanwhile (its log says 'That port is already "
                        f"in use'), run e.g. `make demo DEMO_PORT={port + 1}`"
                    )
                return
            if pending:
                pending -= _succeeded(pending, since)
                if not pending:
                    self._say(
                        f"every demo job has a succeeded run, {time.monotonic() - started:.1f}s "
                        f"after the demo started ({', '.join(names)})"
                    )
                    connections.close_all()
                elif time.monotonic() > deadline:
                    self._say(
                        f"still no succeeded run of {', '.join(sorted(pending))}; see the log"
                    )
                    pending.clear()
                    connections.close_all()
            if task_pending:
                ran = _task_run_by_worker(since)
                if ran is not None:
                    self._say(ran)
                    task_pending = False
                    connections.close_all()
                elif time.monotonic() > deadline:
                    self._say(f"no task of {TASK_JOB} has finished yet; see db_worker's log")
                    task_pending = False
                    connections.close_all()
            if box_pending and not pending and not task_pending:
                self.stdout.write("\n".join(login_box))
                self.stdout.flush()
                box_pending = False
            supervisor.wait(1.0)

    def _say(self, text: str) -> None:
        self.stdout.write(f"demo: {text}" if text else "")
        self.stdout.flush()


def _login_box(address: str, password: str) -> list[str]:
    """The admin's address, the login and the admin's pages, between two rules and blank
    lines, without the ``demo:`` prefix: it stands out among the log lines."""
    lines = [("admin", f"http://{address}/admin/"), ("login", f"admin / {password}")]
    lines += [(label, f"http://{address}{path}") for label, path in _admin_pages()]
    rows = [f"  {label + ':':<11}{value}" for label, value in lines]
    rows.append("  Ctrl-C stops the scheduler, the worker and the web server.")
    rule = "=" * max(len(row) + 2 for row in rows)
    return ["", rule, *rows, rule, ""]


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _admin_pages() -> list[tuple[str, str]]:
    """The admin pages of the jobs and their runs, where django_fencedjobs registers them."""
    from django.contrib import admin
    from django.urls import reverse

    from django_fencedjobs.models import JobLease, Runner

    pages = [
        ("jobs", JobLease),
        ("instances", JobInstance),
        ("runs", JobRun),
        ("runners", Runner),
        ("digests", Digest),
        ("tenants", TenantDigest),
        ("rollups", Rollup),
        ("reminders", Reminder),
    ]
    return [
        (label, reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist"))
        for label, model in pages
        if admin.site.is_registered(model)
    ]


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


def _describe_db() -> str:
    settings_dict = connections["default"].settings_dict
    return f"{connections['default'].vendor} {settings_dict['NAME']}"


def _ensure_admin() -> str:
    """Create the ``admin`` superuser, or reset its password: $DEMO_ADMIN_PASSWORD, else the
    one generated on the first demo run and kept in .demo/admin-password."""
    password = os.environ.get("DEMO_ADMIN_PASSWORD", "")
    if not password:
        try:
            password = PASSWORD_FILE.read_text().strip()
        except FileNotFoundError:
            password = ""
        if not password:
            password = secrets.token_urlsafe(12)
            PASSWORD_FILE.parent.mkdir(exist_ok=True)
            PASSWORD_FILE.write_text(password + "\n")
            PASSWORD_FILE.chmod(0o600)
    User = get_user_model()
    user, _ = User.objects.get_or_create(username="admin", defaults={"email": "admin@localhost"})
    user.is_staff = user.is_superuser = user.is_active = True
    user.set_password(password)
    user.save()
    return password


def _run_every_job_now() -> tuple[list[str], dict[str, datetime], list[str], datetime]:
    """Create the jobs' lease rows if needed and make every job due now: "run now", which
    still goes through the lease (``operations.make_due``, then ``acquire`` in runjobs), but for
    the jobs whose next slot is within :data:`RUN_NOW_MARGIN`.

    A job declared with instances has no schedule and no lease row of its own: each of its
    enabled, valid instances is a job here, by its name ``job[key]`` (what ``runjobs
    --now`` takes too). A disabled instance, or a job an operator paused, is left alone.

    Returns the names of the jobs asked to run (now or at their slot), the next slots of
    those left to their schedule, the paused ones, and the instant the others were made
    due."""
    jobs = declared.runnable_jobs()
    now = clock.now()
    declared.sync(jobs, now)
    candidates = [job.name for job in jobs if not job.instances] + _instance_names(jobs)
    rows = lease.read(candidates)
    paused = [name for name in candidates if name in rows and rows[name].paused]
    names = [name for name in candidates if name in rows and not rows[name].paused]
    soon = {
        name: rows[name].next_run_at
        for name in names
        if rows[name].next_run_at - now <= RUN_NOW_MARGIN
    }
    for name in names:
        if name not in soon:
            operations.make_due(name, now)
    return names, soon, paused, now


def _instance_names(jobs: list[Job]) -> list[str]:
    """The names ``job[key]`` of the enabled and valid instances of the jobs declared with
    instances among ``jobs`` (an invalid one never runs)."""
    names = []
    for base in jobs:
        if base.instances:
            for instance in JobInstance.objects.filter(job=base.name, enabled=True):
                if instance_job(base, instance).valid:
                    names.append(instance.name)
    return names


def _describe_instances(added: list[str]) -> list[str]:
    """Lines on the instances of :data:`INSTANCES_JOB`: which the demo added now, each one's
    schedule, and where to change them."""
    instances = list(JobInstance.objects.filter(job=INSTANCES_JOB))
    lines = [
        f"{INSTANCES_JOB} has {len(instances)} instance(s), each a job of its own "
        f"(added now: {', '.join(added) or 'none, they were there'}):"
    ]
    for instance in instances:
        every = instance.every.total_seconds() if instance.every is not None else 0
        schedule = instance.cron or f"every {every:g}s"
        jitter = f", jitter {instance.jitter.total_seconds():g}s" if instance.jitter else ""
        state = "" if instance.enabled else ", disabled"
        lines.append(
            f"  {instance.name}: {schedule} in {instance.timezone}{jitter}{state}, "
            f"arguments {json.dumps(instance.kwargs)}"
        )
    lines.append(
        "  change a schedule or a zone, disable one or add one on the admin's instances page "
        "(below): the scheduler follows within a second, no restart"
    )
    return lines


def _succeeded(names: set[str], since: datetime) -> set[str]:
    """The jobs among ``names`` with a run started at or after ``since`` that succeeded."""
    return set(
        JobRun.objects.filter(job__in=names, outcome=Outcome.SUCCEEDED, started_at__gte=since)
        .values_list("job", flat=True)
        .distinct()
    )


def _task_run_by_worker(since: datetime) -> str | None:
    """What to say once a task that a run of ``demo.write_digest`` enqueued (at or after
    ``since``) has finished on the worker; None before."""
    task = (
        RunTask.objects.filter(
            job=TASK_JOB,
            run__started_at__gte=since,
            status__in=[TaskStatus.SUCCESSFUL, TaskStatus.FAILED],
        )
        .order_by("finished_at")
        .first()
    )
    if task is None:
        return None
    if task.status == TaskStatus.FAILED:
        return f"the task {task.task_path} of run fence {task.fence} failed: {task.error[-300:]}"
    digest = Digest.objects.filter(fence=task.fence).order_by("written_at").first()
    wrote = f", wrote digest #{digest.pk} in worker pid {digest.worker_pid}" if digest else ""
    return (
        f"db_worker ran the task {task.task_path} that the run of {TASK_JOB} with fence "
        f"{task.fence} enqueued{wrote}"
    )
