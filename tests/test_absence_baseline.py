"""The absence baseline: a job counts as deployed from the first time its code is seen live
(`migrate`, `checkjobs`, the admin), and once its first slot + run_timeout + grace has
passed with no success it is late, even when no runner ever ran it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.urls import reverse

from django_fencedjobs import job
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.health import Severity, State, job_health
from django_fencedjobs.loop import tick
from django_fencedjobs.models import JobLease
from tests.conftest import JOBS_T0, REPO_ROOT, database_url

pytestmark = pytest.mark.django_db(transaction=True)

T0 = JOBS_T0  # 2026-11-29 09:00 UTC
# "*/15 * * * *" with no declared timeout: half the interval, 7.5 minutes; grace 5 minutes.
DEADLINE_AFTER_SLOT = timedelta(minutes=7, seconds=30) + timedelta(minutes=5)
SECOND = timedelta(seconds=1)


def quarterly(name: str):
    def declare(func):
        return job("*/15 * * * *", name=name)(func)

    return declare


def checkjobs(*args: str) -> tuple[int, str, str]:
    out = StringIO()
    try:
        call_command("checkjobs", *args, stdout=out, stderr=StringIO())
    except CommandError as exc:
        return exc.returncode, out.getvalue(), str(exc)
    return 0, out.getvalue(), ""


# -- migrate, then checkjobs, as separate processes on a fresh database ---------------------

#: The job of tests/checkapps/healthy: "7 * * * *" in Europe/Berlin, no declared timeout
#: (half the hour: 30 minutes), grace 5 minutes. Migrated at 09:00 UTC, its first slot is
#: 09:07 UTC, so it must have succeeded by 09:42 UTC.
HOURLY = "checks.healthy"
HOURLY_EXPECTED_BY = datetime(2026, 11, 29, 9, 42, tzinfo=UTC)


@pytest.fixture
def fresh_database(child_env, tmp_path, on_postgres) -> Iterator[dict[str, str]]:
    """The environment of a project whose database was just created and never migrated:
    its own SQLite file, or its own database on the test server."""
    env = {
        **child_env,
        "DJANGO_SETTINGS_MODULE": "tests.check_settings",
        "FENCEDJOBS_CHECK_APP": "healthy",
        "FENCEDJOBS_TEST_CLOCK": "tests.monitoring_jobs.env_clock",
    }
    if not on_postgres:
        path = tmp_path / "fresh.sqlite3"
        yield {**env, "DATABASE_URL": database_url({"ENGINE": "sqlite3", "NAME": str(path)})}
        return
    name = f"fencedjobs_fresh_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{name}"')
    try:
        yield {**env, "DATABASE_URL": database_url({**connection.settings_dict, "NAME": name})}
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}"')


def manage(env: dict[str, str], now: datetime, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        env={**env, "FENCEDJOBS_TEST_NOW": now.isoformat()},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_after_migrate_a_job_no_runner_ever_ran_makes_checkjobs_exit_2(fresh_database):
    # Another app migrated first: the fencedjobs tables do not exist yet, nothing fails.
    early = manage(fresh_database, T0, "migrate", "contenttypes", "--no-input")
    assert early.returncode == 0, early.stdout + early.stderr

    migrated = manage(fresh_database, T0, "migrate", "--no-input")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr

    # No runner, ever. At the deadline itself the job is not late yet...
    on_time = manage(fresh_database, HOURLY_EXPECTED_BY, "checkjobs", "--json")
    assert on_time.returncode == 0, on_time.stdout + on_time.stderr
    (entry,) = json.loads(on_time.stdout)["jobs"]
    assert (entry["name"], entry["state"]) == (HOURLY, "never_run")
    assert entry["expected_by"] == HOURLY_EXPECTED_BY.isoformat()

    # ...one second later it is, counted from `migrate`, not from checkjobs' first look.
    late = manage(fresh_database, HOURLY_EXPECTED_BY + SECOND, "checkjobs")
    assert late.returncode == 2, late.stdout + late.stderr
    assert late.stdout.splitlines()[1].split()[:2] == [HOURLY, "LATE"]
    assert late.stderr.strip().splitlines() == [
        f"CommandError: 1 of 1 job(s) need attention: {HOURLY} (late)"
    ]


def test_migrate_records_the_declared_jobs_but_not_in_the_test_environment(jobs, monkeypatch):
    @quarterly("b.deployed")
    def deployed(run):
        pass

    @job("61 * * * *", name="b.invalid")
    def invalid(run):
        pass

    # The test runner migrating the test database: nothing recorded (the test's own first
    # tick, under the test's clock, creates the rows).
    call_command("migrate", verbosity=0, skip_checks=True)
    assert not JobLease.objects.exists()

    # The same outside the test environment: every job with a valid schedule, seen now.
    monkeypatch.delattr("django.core.mail.outbox")
    call_command("flush", verbosity=0, interactive=False)  # flush is not a deployment
    assert not JobLease.objects.exists()
    call_command("migrate", verbosity=0, skip_checks=True)
    (row,) = JobLease.objects.all()
    assert (row.name, row.created_at) == ("b.deployed", T0)
    assert row.next_run_at == T0 + timedelta(minutes=15)


# -- a job added later, while the runner still runs the old code -----------------------------


def test_a_job_added_after_migrate_is_late_once_checkjobs_saw_it_plus_its_deadline(jobs):
    @quarterly("b.old")
    def old(run):
        pass

    tick(["b.old"])  # the runner, with the code it was started with

    fake_clock.set(T0 + timedelta(minutes=5))  # new code deployed; the runner was not restarted

    @quarterly("b.new")
    def new(run):
        pass

    status, out, _ = checkjobs()  # the first observer to see b.new
    assert status == 0, out
    first_seen = JobLease.objects.get(name="b.new").created_at
    assert first_seen == T0 + timedelta(minutes=5)

    deadline = T0 + timedelta(minutes=15) + DEADLINE_AFTER_SLOT  # 09:27:30
    for when in (T0 + timedelta(minutes=15), deadline):
        fake_clock.set(when)
        tick(["b.old"])  # the old runner goes on running b.old, and only b.old
    assert checkjobs()[0] == 0

    fake_clock.set(deadline + SECOND)
    status, out, error = checkjobs("--json")
    assert status == 2
    states = {entry["name"]: entry["state"] for entry in json.loads(out)["jobs"]}
    assert states == {"b.new": "late", "b.old": "ok"}
    assert error == "1 of 2 job(s) need attention: b.new (late)"


# -- the admin -------------------------------------------------------------------------------


@pytest.fixture
def superuser_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    return client


def changelist() -> str:
    return reverse("admin:fencedjobs_joblease_changelist")


def states_listed(client: Client) -> list[str]:
    html = client.get(changelist()).content.decode()
    return [state for state in ("never_run", "late") if f'class="fj-badge fj-{state}"' in html]


def test_the_admin_shows_a_job_no_runner_ever_ran_as_late(jobs, superuser_client):
    @quarterly("b.unrun")
    def unrun(run):
        pass

    assert states_listed(superuser_client) == ["never_run"]  # seen: the baseline is now
    fake_clock.set(T0 + timedelta(minutes=15) + DEADLINE_AFTER_SLOT + SECOND)
    response = superuser_client.get(changelist())
    html = response.content.decode()
    assert 'class="fj-badge fj-late"' in html
    assert "never succeeded; its first slot 2026-11-29 09:15:00 UTC" in html

    page = superuser_client.get(
        reverse("admin:fencedjobs_joblease_change", args=[JobLease.objects.get().pk])
    )
    assert 'class="fj-badge fj-late"' in page.content.decode()


# -- an observer that may not write ----------------------------------------------------------


@contextmanager
def read_only_session() -> Iterator[None]:
    """This connection's writes are refused by the database itself, as for a database user
    granted SELECT only."""
    if connection.vendor == "postgresql":
        on = "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY"
        off = "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE"
    else:
        on, off = "PRAGMA query_only = ON", "PRAGMA query_only = OFF"
    with connection.cursor() as cursor:
        cursor.execute(on)
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(off)


@pytest.mark.parametrize(
    "atomic_requests",
    [
        pytest.param(False, id="autocommit"),
        # SQLite refuses even BEGIN IMMEDIATE on a read-only connection: PostgreSQL only.
        pytest.param(True, id="atomic_requests", marks=pytest.mark.postgres_only),
    ],
)
def test_the_admin_still_shows_what_is_there_when_it_may_not_write(
    jobs, superuser_client, monkeypatch, atomic_requests
):
    @quarterly("b.known")
    def known(run):
        pass

    tick()  # b.known has its lease row

    @quarterly("b.unrecorded")
    def unrecorded(run):
        pass

    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", atomic_requests)
    with read_only_session():
        response = superuser_client.get(changelist())
    html = response.content.decode()
    assert response.status_code == 200, html[:2000]
    assert ">b.known<" in html
    assert ">b.unrecorded<" not in html
    assert "Could not record b.unrecorded, declared in code" in html
    assert not JobLease.objects.filter(name="b.unrecorded").exists()


def test_checkjobs_reports_honestly_when_it_may_not_write(jobs):
    @quarterly("b.unrecorded")
    def unrecorded(run):
        pass

    fake_clock.set(T0 + timedelta(days=1))
    with read_only_session():
        status, out, _ = checkjobs("--json")
        strict = checkjobs("--strict")[0]
    (entry,) = json.loads(out)["jobs"]
    assert (entry["state"], entry["severity"]) == ("never_run", "warning")
    assert "no lease row" in entry["reason"] and "cannot be late" in entry["reason"]
    assert (status, strict) == (0, 1)
    assert not JobLease.objects.exists()


def test_a_job_seen_for_the_first_time_is_never_run_and_healthy(jobs):
    @quarterly("b.fresh")
    def fresh(run):
        pass

    assert checkjobs()[0] == 0
    health = job_health("b.fresh")
    assert (health.state, health.severity) == (State.NEVER_RUN, Severity.HEALTHY)
    assert health.expected_by == T0 + timedelta(minutes=15) + DEADLINE_AFTER_SLOT


def test_a_job_with_instances_is_a_first_sighting_once_never_again_at_each_command(jobs, caplog):
    # It has no lease row of its own (its instances have theirs): it was "seen for the
    # first time" by every command, one log line each time.
    from django_fencedjobs import baseline

    @job("*/15 * * * *", name="t.plain")
    def plain(run):
        pass

    @job(instances=True, name="t.fleet")
    def fleet(run):
        pass

    caplog.set_level("INFO", logger="django_fencedjobs")
    assert baseline.record_first_sightings(fake_clock()).recorded == ["t.plain"]
    assert baseline.record_first_sightings(fake_clock()).recorded == []
    sightings = [r for r in caplog.records if getattr(r, "event", "") == "first_sighting"]
    assert [r.jobs for r in sightings] == [["t.plain"]]
