"""Sentry Crons: every run sends in_progress, then ok or error, with the same check-in id and
a monitor config derived from the job. Envelopes are captured by a transport: no network."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sentry_sdk
from django.test import override_settings
from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport

from django_fencedjobs import health, job, notify
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.integrations.sentry import has_monitor, monitor_config, monitor_slug
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
        return self.items("check_in")

    def events(self) -> list[dict[str, Any]]:
        return self.items("event")

    def items(self, kind: str) -> list[dict[str, Any]]:
        return [
            item.payload.json
            for envelope in self.envelopes
            for item in envelope.items
            if item.headers.get("type") == kind
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


# -- instances ---------------------------------------------------------------------------------


def declare_digest(**options: Any) -> Any:
    @job(instances=True, timeout=timedelta(minutes=2), name="t.digest", **options)
    def digest(run, *, fail: bool):
        if fail:
            raise RuntimeError("the tenant's mail server said no")

    fake_clock.set(datetime(2026, 11, 30, 6, 55, tzinfo=UTC))
    digest.instances.upsert(
        "paris", cron="0 8 * * 1-5", timezone="Europe/Paris", kwargs={"fail": False}
    )
    digest.instances.upsert("broken", every=timedelta(minutes=10), kwargs={"fail": True})
    return digest


def run_instances_at(*minutes: int) -> list[str]:
    """Tick at each of ``minutes`` past 2026-11-30 07:00 UTC (a Monday, 08:00 in Paris);
    the names of the runs, in order."""
    names = []
    for minute in minutes:
        fake_clock.set(datetime(2026, 11, 30, 7, minute, 1, tzinfo=UTC))
        names += sorted(record.job for record in tick().runs)
    return names


def notify_changes() -> None:
    """What a runner's loop or checkjobs does with NOTIFY on: tell each change of state."""
    with override_settings(
        FENCEDJOBS={
            "CLOCK": "django_fencedjobs.clock.fake_clock",
            "NOTIFY": True,
            "NOTIFY_EMAIL": [],
        }
    ):
        notify.evaluate(health.all_health())


def test_instances_of_a_job_that_keeps_the_default_send_no_check_in(jobs, sentry):
    declare_digest()
    ran = run_instances_at(0, 10)
    assert ran == ["t.digest[broken]", "t.digest[paris]", "t.digest[broken]"]
    assert sentry.check_ins() == []  # no monitor per instance, ok or failed


def test_a_failing_instance_is_an_event_tagged_with_its_job_and_key_grouped_per_job(jobs, sentry):
    declare_digest()
    run_instances_at(0)
    notify_changes()
    (event,) = sentry.events()
    assert event["level"] == "warning"  # the first failure: failing, a warning
    assert event["fingerprint"] == ["django-fencedjobs", "t.digest", "failing"]
    assert (event["tags"]["fencedjobs.job"], event["tags"]["fencedjobs.instance"]) == (
        "t.digest",
        "broken",
    )
    assert event["message"].startswith("t.digest[broken]: ok")
    assert sentry.check_ins() == []


def test_instances_that_fail_together_are_one_event_naming_them(jobs, sentry):
    digest = declare_digest()
    digest.instances.upsert("lyon", every=timedelta(minutes=10), kwargs={"fail": True})
    run_instances_at(0)
    notify_changes()
    (event,) = sentry.events()
    assert event["level"] == "warning"
    assert event["fingerprint"] == ["django-fencedjobs", "t.digest", "failing"]
    assert event["tags"]["fencedjobs.job"] == "t.digest"
    assert event["tags"]["fencedjobs.instances"] == 2
    assert event["extra"]["instances"] == ["t.digest[broken]", "t.digest[lyon]"]
    assert event["message"].startswith("2 instances of t.digest: ok -> failing (warning)")


def test_instances_of_a_job_that_asks_for_a_monitor_each_have_one_from_their_schedule(jobs, sentry):
    declare_digest(instance_series="each")
    run_instances_at(0)
    by_slug: dict[str, list[dict[str, Any]]] = {}
    for check_in in sentry.check_ins():
        by_slug.setdefault(check_in["monitor_slug"], []).append(check_in)
    assert set(by_slug) == {"t-digest-paris", "t-digest-broken"}
    paris = by_slug["t-digest-paris"]
    assert [c["status"] for c in paris] == ["in_progress", "ok"]
    assert paris[0]["monitor_config"] == {
        "schedule": {"type": "crontab", "value": "0 8 * * 1-5"},
        "timezone": "Europe/Paris",
        "checkin_margin": 5,
        "max_runtime": 2,
        "failure_issue_threshold": 3,
    }
    broken = by_slug["t-digest-broken"]
    assert [c["status"] for c in broken] == ["in_progress", "error"]
    assert broken[0]["monitor_config"]["schedule"] == {
        "type": "interval",
        "value": 10,
        "unit": "minute",
    }
    notify_changes()
    (event,) = sentry.events()
    assert event["fingerprint"] == ["django-fencedjobs", "t.digest[broken]", "failing"]
    assert (event["tags"]["fencedjobs.job"], event["tags"]["fencedjobs.instance"]) == (
        "t.digest",
        "broken",
    )


def test_a_long_instance_name_gets_a_bounded_slug_of_its_own(jobs, sentry):
    digest = declare_digest(instance_series="each")
    key = "tenant-" + "x" * 60
    digest.instances.upsert(key, every=timedelta(minutes=10), kwargs={"fail": False})
    run_instances_at(0)
    slugs = {c["monitor_slug"] for c in sentry.check_ins()}
    long_slug = monitor_slug(f"t.digest[{key}]")
    assert len(long_slug) == 50 and long_slug in slugs
    assert long_slug != monitor_slug(f"t.digest[{key}y]")


def test_a_worker_that_does_not_hold_the_instance_decides_by_its_declared_job(jobs):
    declare_digest()

    @job(instances=True, instance_series="each", name="t.reports")
    def reports(run):
        pass

    @job("*/15 * * * *", name="t.plain[odd]")
    def plain(run):
        pass

    assert not has_monitor("t.digest[paris]", None)
    assert has_monitor("t.reports[acme]", None)
    assert has_monitor("t.plain[odd]", None)  # a job declared in code, brackets and all
    # Declared nowhere in this process: sent without a config, which creates no monitor.
    assert has_monitor("t.elsewhere[acme]", None)
