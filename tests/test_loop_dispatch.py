"""How the loop hands a stampede of due jobs to its workers when other runners drain the
same jobs: in an order of its own, and from a fresh read once its read went stale."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from datetime import timedelta

import pytest
from django.db import transaction
from django.test import override_settings

from django_fencedjobs import clock, db, job, lease, loop, operations, signals
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.declared import runnable_jobs, sync

pytestmark = pytest.mark.django_db(transaction=True)

ORDER_OF_THIS_PROCESS = """
import django
django.setup()
from django_fencedjobs.loop import Dispatcher
names = [f"t.tenant{n:02d}" for n in range(40)]
print(",".join(sorted(names, key=Dispatcher([]).tiebreak)))
"""


def _order_in_a_new_process() -> list[str]:
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings")
    out = subprocess.run(
        [sys.executable, "-c", ORDER_OF_THIS_PROCESS],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.strip().split(",")


def _declare_tenants(count: int) -> list[str]:
    names = [f"t.tenant{n:02d}" for n in range(count)]
    for name in names:
        job(every=timedelta(minutes=1), name=name)(lambda run: None)
    return names


def test_jobs_due_at_one_instant_come_in_an_order_of_each_process(jobs):
    names = _declare_tenants(40)
    dispatcher = loop.Dispatcher(runnable_jobs())
    dispatcher.scan()  # creates the rows
    fake_clock.advance(timedelta(minutes=1, seconds=1))
    first = [row.name for row in dispatcher.scan()]
    again = [row.name for row in dispatcher.scan()]
    assert sorted(first) == names
    assert first == again  # one process: one order, read after read
    assert first != names  # not by name, which every runner would share
    # Two other processes: two other orders (all three equal: about 1 in 10^95).
    assert not (_order_in_a_new_process() == _order_in_a_new_process() == first)


def test_the_loop_reads_again_when_other_runners_took_the_jobs_it_read(jobs, monkeypatch, caplog):
    """Another runner takes all 30 due jobs right after this loop read them: the loop's
    claim offers a few (OFFERED_PER_WORKER for its one worker), is passed over, reads again
    and finds nothing left to try, instead of failing to acquire each of the 30 in turn."""
    _declare_tenants(30)
    sync(runnable_jobs(), clock.now())
    fake_clock.advance(timedelta(minutes=1, seconds=1))
    monkeypatch.setattr(loop, "RESCAN_AFTER", timedelta(0))

    taken: list[int | None] = []

    def another_runner_takes_them_all(sender, now, **kwargs):
        rows = lease.read([j.name for j in runnable_jobs()])
        with transaction.atomic(using=db.lease_db()):
            for row in rows.values():
                if row.is_due(now):
                    fence = lease.acquire(
                        row,
                        owner="elsewhere",
                        now=now,
                        ttl=timedelta(minutes=5),
                        next_run_at=now + timedelta(minutes=1),
                    )
                    taken.append(fence)

    signals.tick_finished.connect(another_runner_takes_them_all)
    quick = {
        "CLOCK": "django_fencedjobs.clock.fake_clock",
        "LOOP_MAX_SLEEP": timedelta(seconds=0.1),
    }
    try:
        with (
            override_settings(FENCEDJOBS=quick),
            caplog.at_level(logging.DEBUG, logger="django_fencedjobs"),
        ):
            loop.loop(workers=1, max_ticks=1)
    finally:
        signals.tick_finished.disconnect(another_runner_takes_them_all)
    assert len(taken) == 30 and None not in taken
    passed_over = [r for r in caplog.records if getattr(r, "event", None) == "passed_over"]
    assert 1 <= len(passed_over) <= 2 * loop.OFFERED_PER_WORKER, len(passed_over)


def test_the_next_wakeup_is_the_next_job_not_due_whatever_is_due_now(jobs):
    """A job due now (running, or about to) does not hide when the next one is due: the
    loop sleeps until that one's slot, not a fixed retry interval past it."""
    job(every=timedelta(hours=1), name="t.long")(lambda run: None)
    job(every=timedelta(minutes=1), name="t.frequent")(lambda run: None)
    sync(runnable_jobs(), clock.now())
    operations.make_due("t.long", clock.now())
    seen = lease.scan(["t.long", "t.frequent"], clock.now())
    assert [row.name for row in seen.due] == ["t.long"]
    assert seen.wakeup == lease.read(["t.frequent"])["t.frequent"].next_run_at
    assert seen.wakeup > clock.now()


def test_a_scan_reads_the_same_instants_as_the_orm_to_the_microsecond(jobs):
    """The tick's read of due rows (:func:`lease.scan`, PostgreSQL's own query) gives the
    values :func:`lease.acquire` compares against: the very instants the ORM reads, in UTC,
    down to the microsecond, or no acquisition could match them."""
    from django_fencedjobs.models import JobLease

    names = [f"t.instant{n}" for n in range(3)]
    for name in names:
        job(every=timedelta(minutes=1), name=name)(lambda run: None)
    sync(runnable_jobs(), clock.now())
    now = clock.now()
    for n, name in enumerate(names):
        JobLease.objects.filter(name=name).update(
            next_run_at=now - timedelta(seconds=n + 1, microseconds=123_457 + n),
            lease_until=now - timedelta(hours=n + 1, microseconds=999_999 - n),
        )
    due = {row.name: row for row in lease.scan(names, now).due}
    read = lease.read(names)
    assert sorted(due) == names
    for name in names:
        assert due[name] == read[name]
        assert due[name].next_run_at.utcoffset() == timedelta(0)
        assert due[name].lease_until.utcoffset() == timedelta(0)
