"""``make demo``, end to end: the real demo command (``manage.py demo``, what the Makefile
runs once the virtualenv exists) on a fresh SQLite file and a free port.

It must record a succeeded run of every demo job and of each instance of
``demo.tenant_digest`` it creates (each a job of its own, ``demo.tenant_digest[key]``, with
its own lease row and its own write), have its ``db_worker`` process run the task a run of
the scheduled task ``demo.write_digest`` enqueued, serve the admin's login page, and on
Ctrl-C (SIGINT to its process group, as a terminal sends it) stop the
scheduler, the worker and the web server, release the leases, and leave no process
behind.

The demo always uses its own SQLite file, whatever database the suite runs on, so it is
marked ``system`` and the SQLite pass of ``make test`` deselects it: it runs once.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
DEMO_JOBS = {
    "demo.send_due_reminders",
    "demo.minutely_rollup",
    "demo.weekday_report_berlin",
    "demo.write_digest",
    "demo.flaky_upstream",
}
#: The job declared with instances, and the instances ``manage.py demo`` creates: the
#: tenant each one's handler is called with (its kwargs), by instance name.
INSTANCES_JOB = "demo.tenant_digest"
DEMO_INSTANCES = {
    f"{INSTANCES_JOB}[paris]": "Paris bakery",
    f"{INSTANCES_JOB}[new-york]": "New York deli",
    f"{INSTANCES_JOB}[tokyo]": "Tokyo noodle bar",
}
#: The console mail backend prints the runner's notification of the flaky job's first
#: failure (its third run, a minute after the first), and the runners page is in the box.
FLAKY_MAIL = "Subject: [Django] demo.flaky_upstream: ok -> failing (warning)"
NOTIFICATION_TIMEOUT = 150
#: The scheduled task's job, and the path of the task its runs enqueue.
TASK_JOB, TASK_PATH = "demo.write_digest", "example_project.demo.tasks.write_digest"
#: Bound on the wait for every job's first succeeded run (the demo asks for them at once).
FIRST_RUNS_TIMEOUT = 90

pytestmark = [pytest.mark.system, pytest.mark.timeout(180)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _gone(pid: int) -> bool:
    """No process ``pid`` and no process in the group ``pid`` (each child leads its own)."""
    for probe in (os.kill, os.killpg):
        try:
            probe(pid, 0)
        except ProcessLookupError:
            continue
        return False
    return True


def _query(db: Path, sql: str) -> list[tuple]:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            return conn.execute(sql).fetchall()
    except sqlite3.OperationalError:  # not created or not migrated yet
        return []


def _first_task_run_by_the_worker(db: Path) -> tuple | None:
    """The first task a run of TASK_JOB enqueued that finished: (the run's job, the run's
    fence, the task's fence, its path, its status, its result id), or None yet."""
    rows = _query(
        db,
        "SELECT r.job, r.fence, t.fence, t.task_path, t.status, t.result_id "
        "FROM fencedjobs_runtask t JOIN fencedjobs_jobrun r ON r.id = t.run_id "
        f"WHERE t.job = '{TASK_JOB}' AND t.status IN ('successful', 'failed') "
        "ORDER BY t.finished_at, t.id LIMIT 1",
    )
    return rows[0] if rows else None


def _demo_env(db: Path, **more: str) -> dict[str, str]:
    """This environment for a process of the example project on its own SQLite file ``db``
    (not the suite's settings or database)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")
    }
    env.update(DATABASE_URL=f"sqlite:///{db}", **more)
    return env


def test_the_demo_runs_every_job_and_a_scheduled_task_on_its_worker_and_stops_on_ctrl_c(tmp_path):
    db = tmp_path / "demo.sqlite3"
    log_path = tmp_path / "demo.log"
    port = _free_port()
    env = _demo_env(
        db,
        DEMO_PORT=str(port),
        DEMO_ADMIN_PASSWORD="demo-test-password",  # leaves the checkout's .demo/ alone
        PYTHONUNBUFFERED="1",
    )

    def log() -> str:
        return log_path.read_text(errors="replace")[-6000:]

    child_pids: list[int] = []
    worker_pid = 0
    task = None
    with log_path.open("wb") as out:
        demo = subprocess.Popen(
            [sys.executable, str(REPO_ROOT / "manage.py"), "demo"],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, like a terminal's foreground job
        )
    try:
        started = time.monotonic()
        succeeded: set[str] = set()
        while time.monotonic() - started < FIRST_RUNS_TIMEOUT:
            assert demo.poll() is None, f"the demo exited with {demo.returncode}:\n{log()}"
            if not child_pids and (
                m := re.search(
                    r"runjobs \(pid (\d+)\), db_worker \(pid (\d+)\) and runserver \(pid (\d+)\)",
                    log(),
                )
            ):
                child_pids = [int(m[1]), int(m[2]), int(m[3])]
                worker_pid = int(m[2])
            succeeded = {
                job
                for (job,) in _query(
                    db, "SELECT job FROM fencedjobs_jobrun WHERE outcome = 'succeeded'"
                )
            }
            task = _first_task_run_by_the_worker(db)
            if succeeded >= DEMO_JOBS | DEMO_INSTANCES.keys() and child_pids and task is not None:
                break
            time.sleep(0.5)
        assert succeeded >= DEMO_JOBS | DEMO_INSTANCES.keys(), (
            f"succeeded runs only of {sorted(succeeded)}:\n{log()}"
        )
        # A lease row per job declared with a schedule and per instance; none for the job
        # declared with instances, which has no schedule of its own (and no run).
        assert {
            name for (name,) in _query(db, "SELECT name FROM fencedjobs_joblease")
        } == DEMO_JOBS | DEMO_INSTANCES.keys()
        assert INSTANCES_JOB not in succeeded
        assert _query(
            db, "SELECT job, key, enabled, kwargs FROM fencedjobs_jobinstance ORDER BY key"
        ) == sorted(
            (INSTANCES_JOB, name[len(INSTANCES_JOB) + 1 : -1], 1, json.dumps({"tenant": tenant}))
            for name, tenant in DEMO_INSTANCES.items()
        )

        # Each instance's run wrote its row, with its own argument and under its own fence:
        # every row a succeeded run of an instance wrote is that run's (instance, slot, fence).
        instance_runs = _query(
            db,
            "SELECT job, scheduled_for, fence FROM fencedjobs_jobrun "
            f"WHERE job LIKE '{INSTANCES_JOB}[%' AND outcome = 'succeeded'",
        )
        written = _query(db, "SELECT instance, tenant, slot, fence FROM demo_tenantdigest")
        rows = {(instance, slot, fence): tenant for instance, tenant, slot, fence in written}
        for job, slot, fence in instance_runs:
            assert rows.get((job, slot, fence)) == DEMO_INSTANCES[job], (job, slot, fence, written)
        # checkjobs, on the demo's database: every job healthy (exit 0), the instances
        # counted under their job, none listed (each is ok or running).
        checked = subprocess.run(
            [sys.executable, str(REPO_ROOT / "manage.py"), "checkjobs"],
            cwd=REPO_ROOT,
            env=_demo_env(db),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert f"{INSTANCES_JOB}: 3 instance(s): 3 ok" in checked.stdout, checked.stdout
        assert f"{INSTANCES_JOB}[" not in checked.stdout, checked.stdout

        # The scheduled task: enqueued by a run of its job (recorded with the run, under the
        # run's fence), run to success by the db_worker process (not runjobs), its write
        # fenced and carrying that run's fence.
        assert task is not None, f"no task of {TASK_JOB} finished:\n{log()}"
        run_job, run_fence, task_fence, task_path, status, result_id = task
        assert (run_job, task_path, status) == (TASK_JOB, TASK_PATH, "successful"), log()
        assert task_fence == run_fence
        queued = _query(
            db,
            "SELECT status, worker_ids FROM django_tasks_database_dbtaskresult "
            f"WHERE id = '{result_id.replace('-', '')}'",
        )
        assert len(queued) == 1 and queued[0][0] == "SUCCESSFUL", queued
        assert json.loads(queued[0][1]), "no worker claimed the task in the queue table"
        digests = _query(db, f"SELECT worker_pid FROM demo_digest WHERE fence = {run_fence}")
        assert digests == [(worker_pid,)], (digests, worker_pid, log())
        assert worker_pid not in (demo.pid, child_pids[0], child_pids[2])
        while "db_worker ran the task" not in log():  # the demo says so too
            assert time.monotonic() - started < FIRST_RUNS_TIMEOUT, log()
            time.sleep(0.2)
        while "every demo job has a succeeded run" not in log():  # the demo says so too
            assert time.monotonic() - started < FIRST_RUNS_TIMEOUT, log()
            time.sleep(0.2)

        # The login stands out: in a box of its own, below the burst of log lines of the
        # first runs, not buried among them.
        login = "  login:     admin / demo-test-password"
        while login not in (text := log_path.read_text(errors="replace")):
            assert time.monotonic() - started < FIRST_RUNS_TIMEOUT, log()
            time.sleep(0.2)
        at = text.index(login)
        assert text.count(login) == 1, log()
        assert text.index("every demo job has a succeeded run") < at, log()
        assert text.index("db_worker ran the task") < at, log()
        before = text[:at].splitlines()
        assert before[-1].startswith("  admin:     http://127.0.0.1:"), log()
        assert set(before[-2]) == {"="} and before[-3] == "", log()

        assert "  runners:   http://127.0.0.1:" in text, log()
        # The runner is seen (its row), and it tells the flaky job's first failure by mail.
        (owner,) = _query(db, "SELECT owner FROM fencedjobs_runner WHERE mode = 'loop'")[0]
        assert owner.endswith(f":{child_pids[0]}"), owner
        while FLAKY_MAIL not in log_path.read_text(errors="replace"):
            assert time.monotonic() - started < NOTIFICATION_TIMEOUT, log()
            time.sleep(0.5)
        assert "Why: the last run failed (1 in a row; critical at 3)" in log(), log()

        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/admin/login/", timeout=10
        ) as response:
            assert response.status == 200
            assert b"csrfmiddlewaretoken" in response.read()

        os.killpg(demo.pid, signal.SIGINT)  # Ctrl-C
        assert demo.wait(timeout=30) == 0, log()
        assert "no process left behind" in log()
        deadline = time.monotonic() + 5
        while (
            not all(_gone(pid) for pid in [demo.pid, *child_pids]) and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        assert [pid for pid in [demo.pid, *child_pids] if not _gone(pid)] == [], log()
        # runjobs stopped gracefully: no run left running, every lease released.
        assert _query(db, "SELECT count(*) FROM fencedjobs_jobrun WHERE outcome = 'running'") == [
            (0,)
        ]
        assert _query(db, "SELECT name FROM fencedjobs_joblease WHERE owner != ''") == []
        # db_worker stopped gracefully too: it finished the task it had started, if any.
        assert _query(db, "SELECT count(*) FROM fencedjobs_runtask WHERE status = 'running'") == [
            (0,)
        ]
    finally:
        for pid in [demo.pid, *child_pids]:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        demo.wait(timeout=10)


RUN_NOW_NEAR_A_SLOT = """
import json
from datetime import UTC, datetime

import django
django.setup()
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

from django_fencedjobs import lease
from django_fencedjobs.clock import fake_clock
from example_project.demo.jobs import tenant_digest
from example_project.demo.management.commands.demo import _run_every_job_now
from example_project.demo.management.commands.demo_seed import seed_instances

fenced = {**getattr(settings, "FENCEDJOBS", {}), "CLOCK": "django_fencedjobs.clock.fake_clock"}
with override_settings(FENCEDJOBS=fenced):
    now = datetime(2026, 12, 2, 12, 3, 28, tzinfo=UTC)  # 2 s before a 30-s slot
    fake_clock.set(now)
    call_command("migrate", verbosity=0)  # which records the jobs' first sighting, now
    added = seed_instances()
    tenant_digest.instances.set_enabled(%(disable)r, False)
    names, soon, paused, _ = _run_every_job_now()
    rows = lease.read(%(names)r)
    print(json.dumps({
        "added": added,
        "asked": sorted(names),
        "left_to_slot": sorted(soon),
        "paused": paused,
        "again": seed_instances(),
        "next_slot_in": {
            name: (row.next_run_at - now).total_seconds() for name, row in rows.items()
        },
    }))
"""


def _run_now_near_a_slot(tmp_path: Path, disable: list[str]) -> dict[str, Any]:
    """The demo's setup (migrate, its instances, "run now") on a fake clock at 12:03:28 UTC,
    with the instances ``disable`` disabled first: what it did, and each lease row's next
    slot, in seconds from then."""
    env = _demo_env(tmp_path / "demo.sqlite3", DJANGO_SETTINGS_MODULE="example_project.settings")
    names = sorted(DEMO_JOBS | DEMO_INSTANCES.keys() | {INSTANCES_JOB})
    out = subprocess.run(
        [sys.executable, "-c", RUN_NOW_NEAR_A_SLOT % {"names": names, "disable": disable}],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_demo_asks_no_job_to_run_now_whose_next_slot_is_seconds_away(tmp_path):
    """A run made due just before its job's slot is superseded by the slot's run at once;
    the task ``demo.write_digest``'s first run enqueued then ended in ``FenceLost`` when the
    worker, still starting, had not run it before the slot. Two seconds before a 30-s slot,
    the demo leaves the 30-s jobs and the 30-s instance to that slot and makes the others
    due now: an instance is asked by its name, as ``runjobs --now`` takes it, and the job
    declared with instances, which has no lease row, is not asked at all."""
    done = _run_now_near_a_slot(tmp_path, disable=[])
    assert done["added"] == ["paris", "new-york", "tokyo"]
    assert done["again"] == []  # created once: a second start adds nothing
    assert done["paused"] == []
    assert done["asked"] == sorted(DEMO_JOBS | DEMO_INSTANCES.keys())
    assert done["next_slot_in"] == {
        "demo.send_due_reminders": 2.0,  # left to its slot
        "demo.write_digest": 2.0,  # left to its slot
        "demo.flaky_upstream": 2.0,  # left to its slot
        "demo.tenant_digest[new-york]": 2.0,  # every 30 s: left to its slot
        "demo.minutely_rollup": 0.0,  # made due now
        "demo.weekday_report_berlin": 0.0,  # made due now
        "demo.tenant_digest[paris]": 0.0,  # made due now (its slot is 12:04)
        "demo.tenant_digest[tokyo]": 0.0,  # made due now (its slot is 12:04 plus jitter)
    }
    assert sorted(done["left_to_slot"]) == sorted(
        name for name, seconds in done["next_slot_in"].items() if seconds == 2.0
    )


def test_the_demo_asks_no_disabled_instance_to_run(tmp_path):
    """An instance disabled in the admin stays as it is across a restart of the demo: it
    is not made due, and the demo does not wait for a run of it."""
    done = _run_now_near_a_slot(tmp_path, disable=["tokyo"])
    assert "demo.tenant_digest[tokyo]" not in done["asked"]
    assert done["asked"] == sorted(
        DEMO_JOBS | {"demo.tenant_digest[paris]", "demo.tenant_digest[new-york]"}
    )
    # Its next slot: 12:04:00 plus its stable jitter (40 s at most), not now.
    assert 32.0 <= done["next_slot_in"]["demo.tenant_digest[tokyo]"] < 72.0
    assert done["next_slot_in"]["demo.tenant_digest[paris]"] == 0.0
