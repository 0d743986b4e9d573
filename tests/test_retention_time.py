"""Retention of backfills and one-offs: their done lease rows go with their watermarks once
older than ``RUN_RETENTION``, then the backfills left without rows; pending ones stay."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from django.test import override_settings

from django_fencedjobs import backfills, clock, job
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.fencing import fenced_atomic
from django_fencedjobs.loop import app_chores, tick
from django_fencedjobs.models import Backfill, JobLease, RunKind, Watermark
from django_fencedjobs.registry import registry
from django_fencedjobs.retention import purge_oneshots

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
SETTINGS = {"CLOCK": "django_fencedjobs.clock.fake_clock", "RUN_RETENTION": timedelta(days=2)}


@pytest.fixture(autouse=True)
def settings_and_jobs() -> Iterator[None]:
    with registry.isolated(), override_settings(FENCEDJOBS=SETTINGS):
        fake_clock.set(T0)
        yield


def declare() -> None:
    @job("0 * * * *", name="k.hourly")
    def hourly(run):
        for window in run.windows(timedelta(minutes=30)):
            with fenced_atomic():
                run.advance_watermark(window.end)

    tick()  # its row, next slot 10:00


def oneshot_rows() -> set[str]:
    return set(JobLease.objects.exclude(kind=RunKind.SCHEDULED).values_list("name", flat=True))


def test_done_backfill_slots_and_one_offs_older_than_the_retention_are_deleted():
    declare()
    request, _ = backfills.backfill("k.hourly", T0 - timedelta(hours=3), T0 - timedelta(hours=1))
    done_once = backfills.run_once("k.hourly", T0 + timedelta(minutes=10))
    later_once = backfills.run_once("k.hourly", T0 + timedelta(days=5))  # pending
    fake_clock.set(T0 + timedelta(minutes=11))
    while tick(["k.hourly"]).runs:
        pass
    backfilled = {f"k.hourly@backfill:2026-11-29T0{h}:00:00+00:00" for h in (6, 7)}
    assert backfilled <= set(Watermark.objects.values_list("job", flat=True))
    assert set(JobLease.objects.filter(paused=True).values_list("name", flat=True)) == {
        *backfilled,
        done_once,
    }
    fake_clock.set(T0 + timedelta(hours=1, seconds=1))
    tick(["k.hourly"])  # the live 10:00 run: the job's own watermark
    # The backfill was requested at the same instant as its rows were queued.
    Backfill.objects.update(created_at=T0)

    fake_clock.set(T0 + timedelta(days=1))
    assert purge_oneshots(clock.now()) == 0  # within the retention
    assert oneshot_rows() == {*backfilled, done_once, later_once}

    fake_clock.set(T0 + timedelta(days=2, minutes=12))
    assert purge_oneshots(clock.now(), batch_size=1) == 3  # in batches of one
    assert oneshot_rows() == {later_once}  # the pending one-off stays
    assert not Watermark.objects.filter(job__in=[*backfilled, done_once]).exists()
    assert Watermark.objects.filter(job="k.hourly").exists()  # the job's own stays
    assert not Backfill.objects.filter(pk=request.pk).exists()  # no row left: gone too
    assert JobLease.objects.filter(name="k.hourly").exists()


def test_a_pending_backfill_slot_keeps_its_row_and_its_backfill_however_old():
    declare()
    request, _ = backfills.backfill("k.hourly", T0 - timedelta(days=9), T0 - timedelta(days=8))
    Backfill.objects.update(created_at=T0)
    fake_clock.set(T0 + timedelta(days=30))  # never run (no runner took it)
    assert purge_oneshots(clock.now()) == 0
    assert JobLease.objects.filter(backfill=request, paused=False).count() == 24
    assert Backfill.objects.filter(pk=request.pk).exists()


def test_the_runner_purges_done_one_offs_after_a_tick():
    declare()
    name = backfills.run_once("k.hourly", T0 + timedelta(minutes=10))
    fake_clock.set(T0 + timedelta(minutes=11))
    tick(["k.hourly"], chores=app_chores(loop=False))
    assert JobLease.objects.get(name=name).paused
    fake_clock.set(T0 + timedelta(days=3))
    tick(["k.hourly"], chores=app_chores(loop=False))
    assert not JobLease.objects.filter(name=name).exists()
