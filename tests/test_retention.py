"""Run retention: old runs are deleted by the runner itself, in bounded batches, keeping the
newest runs of every job."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_fencedjobs import job, retention
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.declared import runnable_jobs
from django_fencedjobs.loop import Dispatcher, app_chores, tick
from django_fencedjobs.models import JobRun, Outcome
from django_fencedjobs.registry import registry
from django_fencedjobs.retention import purge_runs

pytestmark = pytest.mark.django_db(transaction=True)

NOW = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
SETTINGS = {
    "CLOCK": "django_fencedjobs.clock.fake_clock",
    "RUN_RETENTION": timedelta(days=2),
    "RUNS_KEPT_PER_JOB": 3,
}


@pytest.fixture(autouse=True)
def settings_and_jobs() -> Iterator[None]:
    with registry.isolated(), override_settings(FENCEDJOBS=SETTINGS):
        yield


def runs(
    job_name: str,
    count: int,
    *,
    newest: datetime,
    step: timedelta,
    outcome: str = Outcome.SUCCEEDED,
) -> None:
    JobRun.objects.bulk_create(
        JobRun(
            job=job_name,
            scheduled_for=newest - n * step,
            started_at=newest - n * step,
            finished_at=newest - n * step,
            outcome=outcome,
        )
        for n in range(count)
    )


def kept(job_name: str) -> list[datetime]:
    return list(
        JobRun.objects.filter(job=job_name)
        .order_by("-scheduled_for")
        .values_list("scheduled_for", flat=True)
    )


def test_runs_older_than_the_retention_are_deleted_but_the_newest_of_each_job_are_kept():
    runs("r.hourly", 24 * 5, newest=NOW, step=timedelta(hours=1))  # 5 days of hourly runs
    runs("r.monthly", 5, newest=NOW - timedelta(days=10), step=timedelta(days=30))
    deleted = purge_runs(NOW)
    hourly = kept("r.hourly")
    assert len(hourly) == 49  # two days back, inclusive of the boundary
    assert hourly[-1] == NOW - timedelta(days=2)
    assert len(kept("r.monthly")) == 3  # all older than two days, the newest three kept
    assert deleted == 24 * 5 - 49 + 2


def test_a_run_still_running_is_never_deleted():
    runs(
        "r.stuck",
        5,
        newest=NOW - timedelta(days=9),
        step=timedelta(days=1),
        outcome=Outcome.RUNNING,
    )
    runs("r.stuck", 3, newest=NOW, step=timedelta(hours=1))
    purge_runs(NOW)
    assert JobRun.objects.filter(job="r.stuck", outcome=Outcome.RUNNING).count() == 5


def test_deleting_is_bounded_per_statement_and_per_call():
    runs("r.backlog", 30, newest=NOW - timedelta(days=10), step=timedelta(hours=1))
    runs("r.backlog", 3, newest=NOW, step=timedelta(hours=1))
    with CaptureQueriesContext(connection) as queries:
        assert purge_runs(NOW, batch_size=4, max_batches=3) == 12
    deletes = [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("DELETE")]
    # Per batch, one DELETE of runs, one of their task records (RunTask) and one of those
    # records' deliveries (TaskDelivery).
    assert sum('"fencedjobs_jobrun"' in sql.split("WHERE")[0] for sql in deletes) == 3
    assert len(deletes) == 9
    assert purge_runs(NOW, batch_size=4, max_batches=3) == 12
    assert purge_runs(NOW, batch_size=4, max_batches=3) == 6  # the backlog drains
    assert purge_runs(NOW, batch_size=4, max_batches=3) == 0
    assert JobRun.objects.filter(job="r.backlog").count() == 3


def test_a_turn_that_leaves_expired_runs_behind_is_followed_soon_until_none_are(monkeypatch):
    # More runs expire than one turn deletes (100,000 hourly jobs expire 2.4 million runs a
    # day): the next turn comes in seconds, not after the interval, until the backlog is gone.
    runs("r.backlog", 30, newest=NOW - timedelta(days=10), step=timedelta(hours=1))
    runs("r.backlog", 3, newest=NOW, step=timedelta(hours=1))
    monkeypatch.setattr(retention, "BATCH_SIZE", 4)
    monkeypatch.setattr(retention, "MAX_BATCHES", 3)
    purging = retention.Retention()
    assert purging.every() == retention.INTERVAL.total_seconds()
    left = []
    for _ in range(3):
        purging.turn(NOW)
        left.append((JobRun.objects.filter(job="r.backlog").count(), purging.every()))
    assert left == [
        (21, retention.BEHIND_EVERY),
        (9, retention.BEHIND_EVERY),
        (3, retention.INTERVAL.total_seconds()),
    ]


def test_a_turn_out_of_time_stops_after_its_batch_and_comes_back_soon(monkeypatch):
    runs("r.backlog", 30, newest=NOW - timedelta(days=10), step=timedelta(hours=1))
    monkeypatch.setattr(retention, "BATCH_SIZE", 4)
    monkeypatch.setattr(retention, "TURN_BUDGET", 0.0)
    purging = retention.Retention()
    purging.turn(NOW)  # one batch, whatever the time: a backlog always drains
    assert JobRun.objects.filter(job="r.backlog").count() == 26
    assert purging.every() == retention.BEHIND_EVERY


def test_a_runner_purges_after_its_pass_and_then_at_most_once_per_interval():
    @job("*/15 * * * *", name="r.live")
    def live(run):
        pass

    runs("r.old", 10, newest=NOW - timedelta(days=5), step=timedelta(days=1))
    fake_clock.set(NOW)
    tick()  # a pass without chores (tests, scripts) purges nothing
    assert len(kept("r.old")) == 10
    runner = Dispatcher(runnable_jobs(), chores=app_chores(loop=False))
    fake_clock.advance(timedelta(minutes=15))
    (run,) = runner.tick().runs
    assert run.outcome == Outcome.SUCCEEDED
    assert len(kept("r.old")) == 3
    runs("r.older", 10, newest=NOW - timedelta(days=5), step=timedelta(days=1))
    fake_clock.advance(timedelta(minutes=15))
    runner.tick()
    assert len(kept("r.older")) == 10  # its turn comes 10 minutes (monotonic) after the last
    tick(chores=app_chores(loop=False))  # another runner (the next runjobs --once)
    assert len(kept("r.older")) == 3


def test_a_deleted_run_takes_its_task_records_with_it_and_only_runs_are_counted():
    from django_fencedjobs.models import RunTask

    runs("r.tasks", 4, newest=NOW - timedelta(days=10), step=timedelta(days=1))
    for run in JobRun.objects.filter(job="r.tasks"):
        RunTask.objects.bulk_create(
            RunTask(run=run, job=run.job, fence=run.fence, task_path="t.x", backend="default")
            for _ in range(5)
        )
    deleted = purge_runs(NOW)
    assert deleted == 1  # four runs, the newest three kept
    assert RunTask.objects.count() == 15
    assert not RunTask.objects.exclude(run__in=JobRun.objects.all()).exists()
