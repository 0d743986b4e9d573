"""Runners are seen: each ``runjobs`` loop has a row and beats; when no live runner serves a
job, it is ``no_runner`` within ``RUNNER_TIMEOUT`` of the last beat, whatever the job's
interval (issue: a stopped runner was noticed only through each job's deadline, 5 min 45 s
later for a job run every minute, up to a day for a daily one).

Real ``runjobs`` processes, SIGKILL and SIGTERM, the database's clock; bounded waits only.
The in-process tests use the fake clock and :class:`~django_fencedjobs.runners.Presence`,
as the loop does.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connection, connections
from django.test import Client, override_settings

import django_fencedjobs
from django_fencedjobs import runners
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.db import lease_db
from django_fencedjobs.health import Severity, State, job_health
from django_fencedjobs.loop import tick
from django_fencedjobs.models import Runner, RunnerMode
from django_fencedjobs.registry import registry
from tests.conftest import REPO_ROOT
from tests.faults.harness import wait_until
from tests.runner_jobs import DAILY, MINUTELY, declare

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
FAKE = "django_fencedjobs.clock.fake_clock"
#: Bounds small enough for a test to watch a runner die, in seconds.
QUICK = {"RUNNER_BEAT": 0.2, "RUNNER_TIMEOUT": 2.0}
QUICK_SETTINGS = {key: timedelta(seconds=value) for key, value in QUICK.items()}
TIMEOUT = QUICK_SETTINGS["RUNNER_TIMEOUT"]


# -- real runner processes ---------------------------------------------------------------------


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


@pytest.fixture
def quick(child_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """The child's environment, and this process's settings: the database's clock, and the
    quick beat and bound."""
    env = {**child_env, "FENCEDJOBS_TEST_EXTRA": json.dumps(QUICK)}
    env.pop("FENCEDJOBS_TEST_CLOCK", None)
    with (
        registry.isolated(),
        override_settings(
            FENCEDJOBS={"CLOCK": "django_fencedjobs.clock.database_now", **QUICK_SETTINGS}
        ),
    ):
        declare()
        yield env


def start(
    env: dict[str, str], processes: list[subprocess.Popen[bytes]], tmp: Path, *args: str
) -> subprocess.Popen[bytes]:
    log = (tmp / f"runner-{len(processes)}.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.runner_jobs", "runjobs", *args],
        env=env,
        cwd=REPO_ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    processes.append(proc)
    return proc


def loop_row(pid: int) -> Runner | None:
    return Runner.objects.filter(mode=RunnerMode.LOOP, pid=pid).first()


def checkjobs_process(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.runner_jobs", "checkjobs", "--job", DAILY],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_runner_that_dies_leaves_its_jobs_no_runner_within_the_bound_whatever_their_interval(
    quick, processes, tmp_path
):
    proc = start(quick, processes, tmp_path, "--workers", "2")
    row = wait_until(lambda: loop_row(proc.pid), what="the runner's row")
    assert (row.host, row.version, row.workers) == (
        socket.gethostname(),
        django_fencedjobs.__version__,
        2,
    )
    assert row.job_names == [DAILY, MINUTELY]
    assert row.stopped_at is None and row.started_at <= row.last_beat_at

    served = wait_until(lambda: job_health(DAILY).runners, what="the daily job served")
    assert served == (row.owner,)
    # Alive, it beats: past twice the bound after its first beat, it is still live.
    first_beat = row.last_beat_at
    wait_until(
        lambda: Runner.objects.get(pk=row.pk).last_beat_at > first_beat + 2 * TIMEOUT,
        what="beats past twice the bound",
    )
    health = job_health(DAILY)
    assert health.state is not State.NO_RUNNER and health.runners == (row.owner,)

    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    gone = wait_until(
        lambda: (h := job_health(DAILY)).state is State.NO_RUNNER and h,
        what="no_runner after the kill",
    )
    assert gone.severity is Severity.CRITICAL
    assert gone.reason.startswith(f"no live runner: {row.owner}, the last to run it, last seen at ")
    assert gone.reason.endswith("ago; a runner is gone 2 s after its last beat)")
    # Its own deadline is hours away: the runner's absence alone says so.
    assert gone.expected_by is not None and gone.expected_by > gone.checked_at + timedelta(hours=1)

    result = checkjobs_process(quick)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"CommandError: 1 of 1 job(s) need attention: {DAILY} (no_runner)"
    )
    assert "NO_RUNNER" in result.stdout
    assert f"Runners: none live; last seen {row.owner} at " in result.stdout


def test_a_runner_stopped_by_sigterm_records_its_stop_and_its_jobs_read_no_runner_after_the_bound(
    quick, processes, tmp_path
):
    proc = start(quick, processes, tmp_path)
    row = wait_until(lambda: loop_row(proc.pid), what="the runner's row")
    wait_until(lambda: job_health(DAILY).runners, what="the daily job served")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    stopped = Runner.objects.get(pk=row.pk)
    assert stopped.stopped_at is not None and stopped.stopped_at == stopped.last_beat_at
    gone = wait_until(
        lambda: (h := job_health(DAILY)).state is State.NO_RUNNER and h,
        what="no_runner after the stop",
    )
    assert gone.reason.startswith(f"no live runner: {row.owner}, the last to run it, stopped at ")


# -- in process, with the fake clock -----------------------------------------------------------


@pytest.fixture
def clocked() -> Iterator[None]:
    """The fake clock at T0, an empty registry, beats that happen whenever asked."""
    with (
        registry.isolated(),
        override_settings(
            FENCEDJOBS={
                "CLOCK": FAKE,
                "RUNNER_BEAT": timedelta(microseconds=1),
                "RUNNER_TIMEOUT": timedelta(seconds=30),
            }
        ),
    ):
        fake_clock.set(T0)
        yield


def test_a_job_no_live_runner_was_started_with_reads_no_runner_once_older_than_the_bound(clocked):
    declare()
    tick()  # the jobs are first seen at T0 (no runner row: judged by deadlines alone)
    assert job_health(DAILY).state is State.NEVER_RUN and not Runner.objects.exists()
    presence = runners.Presence([registry.get(MINUTELY)], workers=1, owner="host-a:1")
    presence.beat()
    assert job_health(MINUTELY).runners == ("host-a:1",)
    fake_clock.set(T0 + timedelta(seconds=31))
    presence.beat()
    health = job_health(DAILY)
    assert (health.state, health.severity) == (State.NO_RUNNER, Severity.CRITICAL)
    assert health.reason == (
        "no runner runs it: the live runners (host-a:1) were started without it (before it "
        "was declared, or with --job)"
    )
    assert job_health(MINUTELY).state is State.NEVER_RUN
    out = StringIO()
    with pytest.raises(CommandError) as failed:
        call_command("checkjobs", "--json", stdout=out, stderr=StringIO())
    assert failed.value.returncode == 2
    data = json.loads(out.getvalue())
    by_name = {entry["name"]: entry for entry in data["jobs"]}
    assert (by_name[DAILY]["state"], by_name[DAILY]["runners"]) == ("no_runner", [])
    assert by_name[MINUTELY]["runners"] == ["host-a:1"]
    (seen,) = data["runners"]
    assert (seen["owner"], seen["mode"], seen["live"], seen["jobs"]) == (
        "host-a:1",
        "loop",
        True,
        [MINUTELY],
    )
    assert seen["last_seen_at"] == "2026-11-29T09:00:31+00:00"


def test_a_newly_declared_job_has_the_bound_for_its_runners_to_start_with_it(clocked):
    declare()
    presence = runners.Presence([registry.get(MINUTELY)], workers=1, owner="host-a:1")
    presence.beat()
    tick()  # DAILY first seen now
    fake_clock.set(T0 + timedelta(seconds=29))
    presence.beat()
    assert job_health(DAILY).state is State.NEVER_RUN
    fake_clock.set(T0 + timedelta(seconds=31))
    presence.beat()
    assert job_health(DAILY).state is State.NO_RUNNER


def test_cron_passes_are_judged_by_deadlines_or_by_the_last_pass_when_its_interval_is_set(clocked):
    declare()
    call_command("runjobs", "--once", verbosity=0, stdout=StringIO(), stderr=StringIO())
    (row,) = Runner.objects.all()
    assert (row.mode, row.job_names, row.last_beat_at) == (RunnerMode.ONCE, [DAILY, MINUTELY], T0)
    later = T0 + timedelta(hours=2)
    fake_clock.set(later)
    # By default a job run by passes is judged by its deadlines: the daily job's is far.
    assert job_health(DAILY).state is State.NEVER_RUN
    assert job_health(DAILY).runners == (f"{row.owner} (--once)",)
    every_minute = {
        "CLOCK": FAKE,
        "RUNNER_PASS_INTERVAL": timedelta(minutes=1),
        "RUNNER_TIMEOUT": timedelta(seconds=30),
    }
    with override_settings(FENCEDJOBS=every_minute):
        health = job_health(DAILY)
        assert (health.state, health.severity) == (State.NO_RUNNER, Severity.CRITICAL)
        assert health.reason == (
            f"no runner: its last runjobs --once pass, on {row.owner}, started at 2026-11-29 "
            "09:00:00 UTC (2 h ago; passes are expected every 1 min, RUNNER_PASS_INTERVAL)"
        )
        call_command("runjobs", "--once", verbosity=0, stdout=StringIO(), stderr=StringIO())
        assert Runner.objects.get().last_beat_at == later  # one row per host and job set
        assert job_health(DAILY).state is State.NEVER_RUN


def test_rows_of_runners_gone_longer_than_the_retention_are_deleted_when_a_runner_registers(
    clocked,
):
    declare()

    def gone(key: str, seen: datetime) -> Runner:
        return Runner.objects.create(
            key=key,
            mode=RunnerMode.LOOP,
            owner=key,
            host="old",
            pid=1,
            workers=1,
            started_at=seen,
            last_beat_at=seen,
        )

    gone("two-days", T0 - timedelta(days=2))
    gone("an-hour", T0 - timedelta(hours=1))
    runners.Presence([registry.get(DAILY)], workers=1, owner="host-a:1").beat()
    assert sorted(Runner.objects.values_list("owner", flat=True)) == ["an-hour", "host-a:1"]


def test_the_metrics_count_the_live_runners(clocked, settings):
    from django.urls import path
    from prometheus_client.parser import text_string_to_metric_families

    from django_fencedjobs.integrations.prometheus import metrics_view

    declare()
    settings.ROOT_URLCONF = type("urls", (), {"urlpatterns": [path("m", metrics_view)]})

    def live() -> float:
        body = Client().get("/m").content.decode()
        (sample,) = [
            s
            for family in text_string_to_metric_families(body)
            for s in family.samples
            if s.name == "fencedjobs_runners_live"
        ]
        return sample.value

    assert live() == 0
    runners.Presence([registry.get(DAILY)], workers=1, owner="host-a:1").beat()
    assert live() == 1
    fake_clock.set(T0 + timedelta(seconds=30))
    assert live() == 0


def test_the_admin_lists_the_runners_and_when_each_was_last_seen(clocked):
    declare()
    runners.Presence([registry.get(DAILY)], workers=3, owner="host-a:1").beat()
    gone = runners.Presence([registry.get(MINUTELY)], workers=1, owner="host-b:2")
    gone.beat()
    gone.stop()
    fake_clock.set(T0 + timedelta(seconds=20))
    runners.Presence([registry.get(DAILY)], workers=3, owner="host-c:3").beat()
    fake_clock.set(T0 + timedelta(seconds=40))
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    response = client.get("/admin/fencedjobs/runner/")
    assert response.status_code == 200
    html = response.content.decode()
    for owner in ("host-a:1", "host-b:2", "host-c:3"):
        assert owner in html
    assert html.index("host-c:3") < html.index("host-a:1")  # the latest seen first
    assert (
        '<span class="fj-badge fj-ok" title="live while its last beat is under 30 s old">live'
        in html
    )
    assert ">gone</span>" in html and ">stopped</span>" in html
    assert "20 s ago" in html and "40 s ago" in html
    index = client.get("/admin/").content.decode()
    assert "/admin/fencedjobs/runner/" in index


@pytest.mark.postgres_only
def test_a_beat_survives_the_database_ending_its_session_and_registers_again(clocked):
    declare()
    presence = runners.Presence([registry.get(DAILY)], workers=1, owner="host-a:1")
    presence.beat()
    first = Runner.objects.get()
    db = connections[lease_db()]
    pid = db.connection.info.backend_pid
    with _other_session() as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    fake_clock.set(T0 + timedelta(seconds=5))
    presence.beat()  # its session is gone: logged, not raised
    fake_clock.set(T0 + timedelta(seconds=10))
    presence.beat()  # a new session
    assert Runner.objects.get(pk=first.pk).last_beat_at == T0 + timedelta(seconds=10)


@contextmanager
def _other_session() -> Iterator[Any]:
    """A cursor on a second session of the test database."""
    import psycopg

    settings = connection.settings_dict
    conninfo = psycopg.conninfo.make_conninfo(
        dbname=settings["NAME"],
        user=settings["USER"] or None,
        password=settings["PASSWORD"] or None,
        host=settings["HOST"] or None,
        port=settings["PORT"] or None,
    )
    with psycopg.connect(conninfo, autocommit=True) as session, session.cursor() as cursor:
        yield cursor


def test_runner_settings_are_checked(clocked):
    from django_fencedjobs import conf

    with override_settings(
        FENCEDJOBS={"RUNNER_BEAT": timedelta(seconds=20), "RUNNER_TIMEOUT": timedelta(seconds=30)}
    ):
        assert [message for _, message in conf.problems()] == [
            "FENCEDJOBS['RUNNER_TIMEOUT'] must be at least twice RUNNER_BEAT, so that one late "
            "beat does not make a live runner read dead"
        ]


def test_the_admin_badge_says_no_runner(clocked):
    from tests.test_admin import badges

    declare()
    tick()
    presence = runners.Presence([registry.get(MINUTELY)], workers=1, owner="host-a:1")
    presence.beat()
    fake_clock.set(T0 + timedelta(seconds=31))
    presence.beat()
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    html = client.get("/admin/fencedjobs/joblease/").content.decode()
    assert badges(html) == [("no_runner", DAILY), ("never_run", MINUTELY)]
