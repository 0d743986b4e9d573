"""Sentry Crons: every run sends in_progress, then ok or error, with the same check-in id and
a monitor config derived from the job. Envelopes are captured by a transport: no network."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import sentry_sdk
from django.test import override_settings
from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport

from django_fencedjobs import job
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.integrations.sentry import monitor_config, monitor_slug
from django_fencedjobs.loop import Dispatcher, tick
from django_fencedjobs.registry import registry

pytestmark = pytest.mark.django_db(transaction=True)


class CapturingTransport(Transport):
    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self.envelopes: list[Envelope] = []

    def capture_envelope(self, envelope: Envelope) -> None:
        self.envelopes.append(envelope)

    def check_ins(self) -> list[dict[str, Any]]:
        return [
            item.payload.json
            for envelope in self.envelopes
            for item in envelope.items
            if item.headers.get("type") == "check_in"
        ]


def run_once(name: str) -> None:
    tick([name])
    fake_clock.advance(timedelta(minutes=15))
    tick([name])


def test_a_successful_run_sends_in_progress_then_ok_with_the_same_check_in_id(jobs, sentry):
    @job(
        "*/15 * * * *",
        name="billing.sync_invoices",
        timezone="Europe/Berlin",
        grace=timedelta(minutes=4),
        jitter=timedelta(seconds=90),
        timeout=timedelta(minutes=10),
        failure_threshold=2,
    )
    def sync(run):
        fake_clock.advance(timedelta(seconds=3))

    run_once("billing.sync_invoices")
    started, finished = sentry.check_ins()
    assert (started["status"], finished["status"]) == ("in_progress", "ok")
    assert started["check_in_id"] == finished["check_in_id"]
    assert started["monitor_slug"] == finished["monitor_slug"] == "billing-sync_invoices"
    assert finished["duration"] == 3.0
    assert started["environment"] == "test"
    assert started["monitor_config"] == {
        "schedule": {"type": "crontab", "value": "*/15 * * * *"},
        "timezone": "Europe/Berlin",
        "checkin_margin": 6,  # grace 4m + jitter 90s, rounded up to minutes
        "max_runtime": 10,
        "failure_issue_threshold": 2,
    }


def test_a_failing_run_sends_error(jobs, sentry):
    @job(every=timedelta(hours=2), name="t.broken")
    def broken(run):
        raise RuntimeError("boom")

    tick(["t.broken"])
    fake_clock.advance(timedelta(hours=2))
    tick(["t.broken"])
    started, finished = sentry.check_ins()
    assert (started["status"], finished["status"]) == ("in_progress", "error")
    assert started["check_in_id"] == finished["check_in_id"]
    assert started["monitor_config"]["schedule"] == {"type": "interval", "value": 2, "unit": "hour"}
    assert started["monitor_config"]["max_runtime"] == 60  # half the interval, at most 1 hour


def test_each_run_gets_its_own_check_in_id(jobs, sentry):
    @job("*/15 * * * *", name="t.twice")
    def twice(run):
        pass

    run_once("t.twice")
    fake_clock.advance(timedelta(minutes=15))
    tick(["t.twice"])
    ids = [check_in["check_in_id"] for check_in in sentry.check_ins()]
    assert len(ids) == 4 and ids[0] == ids[1] != ids[2] == ids[3]


def test_a_slot_recorded_missed_sends_no_check_in(jobs, sentry):
    @job("*/15 * * * *", name="t.deadline", starting_deadline=timedelta(minutes=1))
    def deadline(run):
        pass

    tick(["t.deadline"])
    fake_clock.advance(timedelta(minutes=20))
    (record,) = tick(["t.deadline"]).runs
    assert record.outcome == "missed"
    assert sentry.check_ins() == []


def test_nothing_is_sent_when_the_setting_is_off(jobs, sentry):
    @job("*/15 * * * *", name="t.quiet")
    def quiet(run):
        pass

    with override_settings(
        FENCEDJOBS={"CLOCK": "django_fencedjobs.clock.fake_clock", "SENTRY": False}
    ):
        run_once("t.quiet")
    assert sentry.check_ins() == []


def test_nothing_is_sent_and_nothing_breaks_without_an_initialised_client(jobs):
    @job("*/15 * * * *", name="t.plain")
    def plain(run):
        pass

    assert not sentry_sdk.get_client().is_active()
    tick()
    fake_clock.advance(timedelta(minutes=15))
    (record,) = tick().runs
    assert record.outcome == "succeeded"


def test_monitor_slugs_are_sentry_safe_and_bounded():
    assert monitor_slug("Billing.Sync Invoices!") == "billing-sync-invoices"
    long_name = "app." + "x" * 80
    slug = monitor_slug(long_name)
    assert len(slug) == 50 and slug != monitor_slug(long_name + "y")


def test_cron_aliases_and_odd_intervals_become_sentry_schedules(jobs):
    @job("@daily", name="t.daily")
    def daily(run):
        pass

    @job(every=timedelta(seconds=90), name="t.ninety", timeout=timedelta(seconds=30))
    def ninety(run):
        pass

    assert monitor_config(registry.get("t.daily"))["schedule"] == {
        "type": "crontab",
        "value": "0 0 * * *",
    }
    config = monitor_config(registry.get("t.ninety"))
    assert config["schedule"] == {"type": "interval", "value": 2, "unit": "minute"}
    assert config["max_runtime"] == 1


def test_an_outcome_recorded_after_reconnecting_still_closes_its_check_in(
    jobs, sentry, monkeypatch
):
    from django.db import OperationalError

    from django_fencedjobs import runner

    real_finish = runner.record_end
    failures = iter([True, True])

    def unreachable_then_real(*args, **kwargs):
        if next(failures, False):
            raise OperationalError("the database went away")
        return real_finish(*args, **kwargs)

    monkeypatch.setattr(runner, "record_end", unreachable_then_real)

    @job("*/15 * * * *", name="t.reconnect")
    def reconnect(run):
        pass

    dispatcher = Dispatcher([registry.get("t.reconnect")])
    dispatcher.tick()
    fake_clock.advance(timedelta(minutes=15))
    dispatcher.tick()
    assert [c["status"] for c in sentry.check_ins()] == ["in_progress"]
    dispatcher.unrecorded.record()  # what the loop does before its next scan
    started, finished = sentry.check_ins()
    assert (finished["status"], finished["check_in_id"]) == ("ok", started["check_in_id"])
