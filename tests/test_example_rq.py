"""The example project's scheduled task on RQ (docs/demo.md, "The scheduled task on RQ"),
with real processes: the example's settings with ``TASKS_BACKEND=rq`` on a SQLite file of
its own and a throwaway ``redis-server``; one ``runjobs --once`` pass whose run of
``demo.write_digest`` enqueues the task ``write_digest`` on django-tasks-rq, then one burst
``rqworker`` that runs it.

Why it matters: the documented way to run the example on RQ must work as written. The task
is handed to RQ after its run commits (RQ's queue is not in the database), so the run
itself never runs it: the RQ worker does, under the run's fence (its write carries the
run's fence), and reports its end, so that its record reads successful.

The example always uses its own SQLite file, whatever database the suite runs on, so it is
marked ``system``, as tests/test_demo.py: it runs once, on the PostgreSQL pass.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from redis import Redis
from rq.job import Job as RQJob

from tests.redis_harness import RedisServer

REPO_ROOT = Path(__file__).resolve().parent.parent
JOB, TASK_PATH = "demo.write_digest", "example_project.demo.tasks.write_digest"
TIMEOUT = 120

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

#: Make the example's scheduled task due now, through its lease row (what "run now" in the
#: admin does), so that one ``runjobs --once`` pass runs it.
MAKE_DUE = f"""
from django_fencedjobs import clock, operations
from django_fencedjobs.declared import sync
from django_fencedjobs.registry import registry
job = registry.get({JOB!r})
sync([job], clock.now())
operations.make_due(job.name, clock.now())
"""


def example_env(db: Path, redis_url: str) -> dict[str, str]:
    """The environment of a process of the example project on RQ, on its own SQLite file."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")
        and not key.startswith("FENCEDJOBS_TEST")
    }
    env.update(
        DATABASE_URL=f"sqlite:///{db}",
        TASKS_BACKEND="rq",
        REDIS_URL=redis_url,
        LOG_LEVEL="WARNING",
    )
    return env


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "manage.py"), *args],
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, f"manage.py {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def query(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
        return conn.execute(sql).fetchall()


def test_the_examples_scheduled_task_is_enqueued_on_rq_and_run_by_an_rqworker_under_its_runs_fence(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    db = tmp_path / "example.sqlite3"
    env = example_env(db, redis_server.url)
    manage(env, "migrate", "--verbosity", "0")
    manage(env, "shell", "--command", MAKE_DUE)

    manage(env, "runjobs", "--once", "--job", JOB)
    runs = query(db, f"SELECT id, outcome, fence FROM fencedjobs_jobrun WHERE job = '{JOB}'")
    assert len(runs) == 1 and runs[0][1] == "succeeded", runs
    run_id, _, fence = runs[0]
    # Recorded with its run and handed to RQ after the commit: the record has RQ's job id,
    # and nothing has run the task yet (the run does not run it; no worker is running).
    tasks = query(
        db,
        "SELECT id, task_path, backend, status, result_id, fence FROM fencedjobs_runtask "
        f"WHERE run_id = {run_id}",
    )
    assert len(tasks) == 1, tasks
    task_id, task_path, backend, status, result_id, task_fence = tasks[0]
    assert (task_path, backend, status, task_fence) == (TASK_PATH, "default", "ready", fence)
    assert result_id
    assert query(db, "SELECT count(*) FROM demo_digest") == [(0,)]
    redis = Redis.from_url(redis_server.url)
    assert RQJob.fetch(result_id, connection=redis).get_status() == "queued"

    worker = manage(
        env, "rqworker", "--burst", "--job-class", "django_tasks_rq.Job", "--name", "W", "default"
    )
    log = worker.stdout + worker.stderr
    # RQ ran the job, on W, once; the task's record says it succeeded (the worker's report).
    job = RQJob.fetch(result_id, connection=redis)
    assert job.get_status() == "finished", log
    assert [result.worker_name for result in job.results()] == ["W"], log
    status, started_at, finished_at, error = query(
        db,
        "SELECT status, started_at, finished_at, error FROM fencedjobs_runtask "
        f"WHERE id = {task_id}",
    )[0]
    assert (status, error) == ("successful", ""), log
    assert started_at is not None and finished_at is not None
    # Its fenced write committed once, under the fence of the run that enqueued it.
    assert query(db, "SELECT fence FROM demo_digest") == [(fence,)], log
