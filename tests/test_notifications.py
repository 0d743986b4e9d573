"""Someone is told: each change of a job's state (ok to late, failing, no_runner, and back)
is mailed once and signalled once, by the one process that recorded it, however many
evaluate at once; ``checkjobs`` tells it when no runner is alive.

Mail goes through Django's SMTP backend to a real SMTP server (aiosmtpd) in a process of its
own on 127.0.0.1; the concurrency test starts several ``checkjobs`` processes at once.
"""

from __future__ import annotations

import email
import email.message
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email import policy
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_fencedjobs import job, operations, runners, signals
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.loop import tick
from django_fencedjobs.models import JobNotice
from django_fencedjobs.registry import registry
from tests.conftest import REPO_ROOT
from tests.faults.harness import wait_until
from tests.runner_jobs import BROKEN, MINUTELY, declare

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
FAKE = "django_fencedjobs.clock.fake_clock"
EVERY = timedelta(minutes=15)
#: Every 15 minutes from 09:15 (with an hour's grace, never late): ok, then failing as a
#: warning from the first failure (the last run failed, then 2 of 4), critical at the third
#: failure (3 of 5, 60%).
SOMETIMES = "SFFSF"


class SmtpSink:
    """The SMTP server process (``tests/smtp_sink.py``) and the messages it accepted."""

    def __init__(self, port: int, directory: Path, proc: subprocess.Popen[bytes]) -> None:
        self.port = port
        self.directory = directory
        self.proc = proc

    def messages(self) -> list[email.message.EmailMessage]:
        return [
            email.message_from_bytes(path.read_bytes(), policy=policy.default)  # type: ignore[misc]
            for path in sorted(self.directory.glob("*.eml"))
        ]

    def subjects(self) -> list[str]:
        return [str(message["Subject"]) for message in self.messages()]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def smtp(tmp_path: Path) -> Iterator[SmtpSink]:
    port = free_port()
    directory = tmp_path / "mail"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.smtp_sink", str(port), str(directory)],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "smtp.log").open("wb"),
    )

    def accepting() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"the SMTP server exited: {(tmp_path / 'smtp.log').read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            return False
        return True

    try:
        wait_until(accepting, what="the SMTP server to accept connections")
        yield SmtpSink(port, directory, proc)
    finally:
        proc.terminate()
        proc.wait(10)


def mail_to(smtp: SmtpSink) -> dict[str, Any]:
    """Django's SMTP backend, pointed at the sink."""
    return {
        "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
        "EMAIL_HOST": "127.0.0.1",
        "EMAIL_PORT": smtp.port,
        "EMAIL_TIMEOUT": 10,
        "ADMINS": [("Ops", "admin@example.com")],
        "SERVER_EMAIL": "jobs@example.com",
    }


@pytest.fixture
def notifying(smtp: SmtpSink) -> Iterator[SmtpSink]:
    """The fake clock at T0, an empty registry, NOTIFY on, mail to the sink."""
    with (
        registry.isolated(),
        override_settings(FENCEDJOBS={"CLOCK": FAKE, "NOTIFY": True}, **mail_to(smtp)),
    ):
        fake_clock.set(T0)
        yield smtp


def checkjobs(*args: str) -> int:
    try:
        call_command("checkjobs", *args, stdout=StringIO(), stderr=StringIO())
    except CommandError as exc:
        return exc.returncode
    return 0


def test_each_change_of_state_is_mailed_once_to_the_admins_and_again_when_back_to_ok(notifying):
    @job("*/15 * * * *", name="n.sync")
    def sync(run):
        pass

    tick()
    fake_clock.set(T0 + EVERY)
    tick()  # succeeds at 09:15
    assert checkjobs() == 0
    assert notifying.messages() == []

    fake_clock.set(T0 + timedelta(minutes=42, seconds=31))  # past 09:42:30: late
    assert checkjobs() == 2
    (late,) = notifying.messages()
    assert late["Subject"] == "[Django] n.sync: ok -> late"
    assert (late["To"], late["From"], late["X-Envelope-To"]) == (
        "admin@example.com",
        "jobs@example.com",
        "admin@example.com",
    )
    body = late.get_content().replace("\r\n", "\n")
    assert body.startswith("n.sync is late; it was ok.\n\nWhy: no successful run since ")
    assert "Last success: 2026-11-29 09:15:00 UTC" in body

    for _ in range(3):  # the state holds: nothing more
        assert checkjobs() == 2
    assert len(notifying.messages()) == 1

    fake_clock.set(T0 + 3 * EVERY)
    tick()  # the runner is back: the run succeeds
    assert checkjobs() == 0
    assert notifying.subjects() == [
        "[Django] n.sync: ok -> late",
        "[Django] n.sync: late -> ok",
    ]
    assert (
        notifying.messages()[1]
        .get_content()
        .replace("\r\n", "\n")
        .startswith("n.sync is ok again (ok); it was late.\n")
    )
    notice = JobNotice.objects.get(job="n.sync")
    assert (notice.state, notice.severity) == ("ok", "healthy")


def test_a_list_of_addresses_gets_the_mail_and_a_receiver_gets_each_change(notifying):
    told: list[Any] = []

    def receiver(*, transition: Any, **kwargs: Any) -> None:
        told.append(transition)

    plan = iter(SOMETIMES)

    @job("*/15 * * * *", name="n.flaky", grace=timedelta(hours=1))
    def flaky(run):
        if next(plan) == "F":
            raise RuntimeError("upstream said no")

    addresses = ["ops@example.com", "oncall@example.com"]
    signals.job_state_changed.connect(receiver)
    try:
        with override_settings(
            FENCEDJOBS={"CLOCK": FAKE, "NOTIFY": True, "NOTIFY_EMAIL": addresses}
        ):
            tick()
            for n in range(1, len(SOMETIMES) + 1):
                fake_clock.set(T0 + n * EVERY)
                tick()
                checkjobs()
    finally:
        signals.job_state_changed.disconnect(receiver)
    assert notifying.subjects() == [
        "[Django] n.flaky: ok -> failing (warning)",
        "[Django] n.flaky: failing (warning) -> failing (critical)",
    ]
    assert notifying.messages()[0]["X-Envelope-To"] == "ops@example.com, oncall@example.com"
    assert [(t.previous, t.current) for t in told] == [
        (("ok", "healthy"), ("failing", "warning")),
        (("failing", "warning"), ("failing", "critical")),
    ]
    assert told[1].health.reason == (
        "3 of its last 5 runs failed (60%, critical from 50%); last failed at 2026-11-29 "
        "10:15:00 UTC: RuntimeError: upstream said no"
    )


def test_checkjobs_tells_that_no_runner_is_alive(notifying):
    declare()
    tick()
    with override_settings(
        FENCEDJOBS={"CLOCK": FAKE, "NOTIFY": True, "RUNNER_BEAT": timedelta(microseconds=1)}
    ):
        presence = runners.Presence(registry.all(), workers=1, owner="host-a:1")
        presence.beat()
        assert checkjobs() == 0
        presence.stop()
        fake_clock.set(T0 + timedelta(seconds=31))  # the bound: 30 s after its last beat
        assert checkjobs() == 2
    assert sorted(notifying.subjects()) == [
        "[Django] r.daily: ok -> no_runner",
        "[Django] r.minutely: ok -> no_runner",
    ]
    body = notifying.messages()[0].get_content().replace("\r\n", "\n")
    assert (
        "Why: no live runner: host-a:1, the last to run it, stopped at 2026-11-29 09:00:00" in body
    )


FLEET = "n.fleet"


def declare_fleet(count: int) -> None:
    """A job of ``count`` instances, each every 15 minutes, with a job of its own beside."""

    @job(instances=True, name=FLEET)
    def fleet(run):
        pass

    for index in range(count):
        fleet.instances.upsert(f"t{index:02d}", cron="*/15 * * * *")


def test_a_dead_runner_of_50_instances_and_2_jobs_is_one_message_per_job_and_change(notifying):
    declare()
    declare_fleet(50)
    tick()
    with override_settings(
        FENCEDJOBS={"CLOCK": FAKE, "NOTIFY": True, "RUNNER_BEAT": timedelta(microseconds=1)}
    ):
        presence = runners.Presence(registry.all(), workers=1, owner="host-a:1")
        presence.beat()
        assert checkjobs() == 0
        presence.stop()  # the only runner is gone
        fake_clock.set(T0 + timedelta(seconds=31))  # the bound: 30 s after its last beat
        assert checkjobs() == 2
        assert checkjobs() == 2  # the state holds: nothing more
        assert sorted(notifying.subjects()) == [
            "[Django] r.daily: ok -> no_runner",
            "[Django] r.minutely: ok -> no_runner",
            "[Django] the instances of n.fleet: ok -> no_runner",
        ]
        body = (
            next(m for m in notifying.messages() if FLEET in m["Subject"])
            .get_content()
            .replace("\r\n", "\n")
        )
        assert body.startswith("the instances of n.fleet are no_runner; they were ok.\n")
        assert "Why: 50 enabled instance(s): no live runner: host-a:1" in body
        # A runner again: each is told back to ok, once.
        again = runners.Presence(registry.all(), workers=1, owner="host-b:1")
        again.beat()
        assert checkjobs() == 0
    assert sorted(notifying.subjects()[3:]) == [
        "[Django] r.daily: no_runner -> ok",
        "[Django] r.minutely: no_runner -> ok",
        "[Django] the instances of n.fleet: no_runner -> ok",
    ]
    assert len(notifying.messages()) == 6


def test_instances_late_together_are_one_message_naming_the_first_keys(notifying):
    declare_fleet(25)
    tick()
    fake_clock.set(T0 + timedelta(hours=2))  # no runner ran them: every instance is late
    assert checkjobs() == 2
    (late,) = notifying.messages()
    assert late["Subject"] == "[Django] 25 instances of n.fleet: ok -> late"
    body = late.get_content().replace("\r\n", "\n")
    assert body.startswith("25 instances of n.fleet are late; they were ok.\n")
    keys = ", ".join(f"t{index:02d}" for index in range(10))
    assert f"Instances: {keys}, and 15 more\n" in body
    assert "The first, n.fleet[t00]:" in body
    # Each instance's own change is recorded: one back to ok is told on its own.
    assert JobNotice.objects.filter(job__startswith="n.fleet[t", state="late").count() == 25


def test_nothing_is_recorded_or_sent_unless_notify_is_on(notifying):
    with override_settings(FENCEDJOBS={"CLOCK": FAKE}):
        declare()
        tick()
        fake_clock.set(T0 + timedelta(hours=1))  # the minutely job is late
        assert checkjobs() == 2
    assert notifying.messages() == [] and not JobNotice.objects.exists()


# -- several processes at once -----------------------------------------------------------------


def test_several_checkjobs_processes_evaluating_at_once_send_one_message(smtp, child_env, tmp_path):
    with registry.isolated(), override_settings(FENCEDJOBS={"CLOCK": FAKE}):
        fake_clock.set(T0)
        declare()
        tick()  # first seen at T0; the minutely job is late from 09:06:30
    late = T0 + timedelta(minutes=10)
    go = tmp_path / "go"
    env = {
        **child_env,
        "FENCEDJOBS_TEST_CLOCK": "tests.monitoring_jobs.env_clock",
        "FENCEDJOBS_TEST_NOW": late.isoformat(),
        "FENCEDJOBS_TEST_SMTP_PORT": str(smtp.port),
        "FENCEDJOBS_TEST_GO": str(go),
    }
    observers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.runner_jobs", "checkjobs", "--job", MINUTELY],
            env={
                **env,
                "FENCEDJOBS_TEST_EXTRA": json.dumps({"NOTIFY": True, "OWNER": f"observer-{n}"}),
            },
            cwd=REPO_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for n in range(8)
    ]
    try:
        go.touch()
        results = [(proc.wait(60), proc.stderr.read().decode()) for proc in observers]
    finally:
        for proc in observers:
            if proc.poll() is None:
                proc.kill()
    assert [code for code, _ in results] == [2] * 8, results
    (message,) = smtp.messages()
    assert message["Subject"] == f"[Django] {MINUTELY}: ok -> late"
    notice = JobNotice.objects.get(job=MINUTELY)
    assert (notice.state, notice.severity) == ("late", "critical")
    assert notice.changed_by.startswith("observer-")


def test_a_live_runner_tells_a_failing_job_without_any_checkjobs(smtp, child_env, tmp_path):
    env = {
        **child_env,
        "FENCEDJOBS_TEST_EXTRA": json.dumps(
            {
                "NOTIFY": True,
                "NOTIFY_EMAIL": ["ops@example.com"],
                "RUNNER_BEAT": 0.2,
                "RUNNER_TIMEOUT": 2.0,
            }
        ),
        "FENCEDJOBS_TEST_SMTP_PORT": str(smtp.port),
        "FENCEDJOBS_TEST_BROKEN": "1",
    }
    env.pop("FENCEDJOBS_TEST_CLOCK", None)
    runner = subprocess.Popen(
        [sys.executable, "-m", "tests.runner_jobs", "runjobs"],
        env=env,
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "runner.log").open("wb"),
    )
    try:
        with (
            registry.isolated(),
            override_settings(FENCEDJOBS={"CLOCK": "django_fencedjobs.clock.database_now"}),
        ):
            declare(broken=True)
            from django_fencedjobs.models import JobLease, Runner

            wait_until(
                lambda: Runner.objects.exists() and JobLease.objects.filter(name=BROKEN).exists(),
                what="the runner and its jobs' rows",
            )
            from django_fencedjobs import clock

            operations.make_due(BROKEN, clock.now())  # its run fails at once
            messages = wait_until(
                smtp.messages,
                what="the runner's mail",
                diagnostics=lambda: (tmp_path / "runner.log").read_text(),
            )
    finally:
        runner.terminate()
        runner.wait(30)
    (message,) = messages
    assert message["Subject"] == f"[Django] {BROKEN}: ok -> failing (warning)"
    assert message["X-Envelope-To"] == "ops@example.com"
    assert "RuntimeError: upstream said no" in message.get_content().replace("\r\n", "\n")


# -- Sentry ------------------------------------------------------------------------------------


def test_a_change_of_state_is_a_sentry_event_with_the_verdict(notifying, sentry):
    plan = iter(SOMETIMES)

    @job("*/15 * * * *", name="n.flaky", grace=timedelta(hours=1))
    def flaky(run):
        if next(plan) == "F":
            raise RuntimeError("upstream said no")

    with override_settings(FENCEDJOBS={"CLOCK": FAKE, "NOTIFY": True, "NOTIFY_EMAIL": []}):
        tick()
        for n in range(1, len(SOMETIMES) + 1):
            fake_clock.set(T0 + n * EVERY)
            tick()
            checkjobs()
    events = [
        item.payload.json
        for envelope in sentry.envelopes
        for item in envelope.items
        if item.headers.get("type") == "event"
    ]
    assert [(e["level"], e["fingerprint"]) for e in events] == [
        ("warning", ["django-fencedjobs", "n.flaky", "failing"]),
        ("error", ["django-fencedjobs", "n.flaky", "failing"]),
    ]
    assert events[1]["message"].startswith(
        "n.flaky: failing (warning) -> failing (critical): 3 of its last 5 runs failed"
    )
    assert events[1]["tags"]["fencedjobs.severity"] == "critical"
    assert notifying.messages() == []  # NOTIFY_EMAIL = []: no mail
