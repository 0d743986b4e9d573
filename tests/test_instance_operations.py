"""Instances operated from the command line as jobs are: `jobctl pause|resume|skip` of one
instance (`job[key]`) and of every instance of a job (`job[*]`); an instance's own timeout
and grace, checked against its own schedule; and what `checkjobs`, `runonce` and every
command say about instances, invalid jobs, instants in the past and a database away."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from datetime import timedelta
from io import StringIO

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import OperationalError

from django_fencedjobs import clock, console, job, lease, loop
from django_fencedjobs.checkids import CheckId
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.instances import instance_job
from django_fencedjobs.models import JobInstance, JobLease, JobRun, Outcome
from django_fencedjobs.registry import registry
from tests.conftest import JOBS_T0
from tests.test_admin_instances import add_url, form_data, preview_url, superuser_client
from tests.test_operations_command import BUSY, RowLock
from tests.test_runjobs_command import REPO, check_env, closed_port

pytestmark = pytest.mark.django_db(transaction=True)

__all__ = ["superuser_client"]  # a fixture, from the admin's tests

DIGEST = "t.digest"


@pytest.fixture
def digest(jobs):
    """A job run as its instances, whose timeout (5 minutes) is the job's; instances a and
    b every 10 minutes."""

    @job(instances=True, name=DIGEST, timeout=timedelta(minutes=5))
    def digest(run, *, tenant_id: int):
        run.add_items(tenant_id)

    for key, tenant in (("a", 1), ("b", 2)):
        digest.instances.upsert(key, every=timedelta(minutes=10), kwargs={"tenant_id": tenant})
    return digest


def jobctl(*args: str) -> str:
    out = StringIO()
    call_command("jobctl", *args, stdout=out)
    return out.getvalue().strip()


def paused(key: str) -> tuple[bool, bool]:
    """The instance's own pause, and its lease row's."""
    instance = JobInstance.objects.get(job=DIGEST, key=key)
    return instance.paused, JobLease.objects.get(instance=instance).paused


def ran() -> list[str]:
    return sorted(run.job for run in loop.tick().runs)


# -- jobctl: one instance ---------------------------------------------------------------------


def test_jobctl_pauses_and_resumes_one_instance_and_the_others_run_on(digest):
    assert jobctl("pause", f"{DIGEST}[a]") == (
        f"paused {DIGEST}[a]: no run starts until it is resumed"
    )
    assert paused("a") == (True, True) and paused("b") == (False, False)
    assert jobctl("pause", f"{DIGEST}[a]") == f"{DIGEST}[a] is already paused: nothing changed"

    fake_clock.advance(timedelta(minutes=10))
    assert ran() == [f"{DIGEST}[b]"]

    assert jobctl("resume", f"{DIGEST}[a]").startswith(
        f"resumed {DIGEST}[a]: due since 2026-11-29 09:10:00 UTC: a runner's next pass runs it"
    )
    assert paused("a") == (False, False)
    assert ran() == [f"{DIGEST}[a]"]
    assert jobctl("resume", f"{DIGEST}[a]") == f"{DIGEST}[a] is not paused: nothing changed"


def test_a_paused_instance_stays_paused_when_saved_or_enabled_and_a_disabled_one_stays_disabled(
    digest,
):
    jobctl("pause", f"{DIGEST}[a]")
    digest.instances.upsert("a", every=timedelta(minutes=20), kwargs={"tenant_id": 7})
    assert paused("a") == (True, True), "a change of schedule or arguments resumes nothing"
    digest.instances.set_enabled(["a"], False)
    digest.instances.set_enabled(["a"], True)
    assert paused("a") == (True, True), "enabling resumes nothing an operator paused"

    digest.instances.set_enabled(["b"], False)
    jobctl("pause", f"{DIGEST}[b]")
    assert jobctl("resume", f"{DIGEST}[b]") == (
        f"resumed {DIGEST}[b]: it is disabled, so no run starts until it is enabled"
    )
    assert paused("b") == (False, True), "resuming runs nothing that is disabled"
    fake_clock.advance(timedelta(minutes=10))
    assert ran() == []
    digest.instances.set_enabled(["b"], True)
    assert ran() == [f"{DIGEST}[b]"]


def test_runjobs_now_on_a_paused_instance_names_the_command_that_resumes_it(digest):
    jobctl("pause", f"{DIGEST}[a]")
    with pytest.raises(CommandError, match=r"is paused: resume it \(`manage.py jobctl resume"):
        call_command("runjobs", "--now", f"{DIGEST}[a]", "--skip-checks", stderr=StringIO())


def test_skip_of_an_instance_moves_its_next_slot_and_records_the_slot_skipped_by_whom(digest):
    line = jobctl("skip", f"{DIGEST}[a]")
    assert line.startswith(f"skipped the slot 2026-11-29 09:10:00 UTC of {DIGEST}[a]: next run ")
    assert JobLease.objects.get(name=f"{DIGEST}[a]").next_run_at == JOBS_T0 + timedelta(minutes=20)
    (skipped,) = JobRun.objects.filter(job=f"{DIGEST}[a]")
    assert (skipped.outcome, skipped.scheduled_for) == (
        Outcome.SKIPPED,
        JOBS_T0 + timedelta(minutes=10),
    )
    assert skipped.owner.startswith("jobctl")


def test_resume_from_now_skips_and_records_the_instances_slots_due_while_it_was_paused(digest):
    jobctl("pause", f"{DIGEST}[a]")
    fake_clock.advance(timedelta(minutes=35))  # 09:10, 09:20, 09:30 fell due
    line = jobctl("resume", f"{DIGEST}[a]", "--from-now")
    assert line.startswith(
        f"resumed {DIGEST}[a] from now: 3 slot(s) due while it was paused skipped (recorded "
        "skipped); next run 2026-11-29 09:40:00 UTC"
    ), line
    (skipped,) = JobRun.objects.filter(job=f"{DIGEST}[a]")
    assert (skipped.outcome, skipped.missed_slots) == (Outcome.SKIPPED, 2)
    assert not JobLease.objects.get(name=f"{DIGEST}[a]").paused
    assert ran() == [f"{DIGEST}[b]"], "a's slots are skipped; b catches up"


def test_the_job_of_the_instances_is_named_with_a_key_or_star(digest):
    with pytest.raises(CommandError) as raised:
        jobctl("pause", DIGEST)
    assert str(raised.value) == (
        f"job {DIGEST!r} runs as its instances: name one, '{DIGEST}[KEY]', or every one, "
        f"'{DIGEST}[*]'"
    )
    with pytest.raises(CommandError, match=r"no job named 't\.digest\[c\]'"):
        jobctl("pause", f"{DIGEST}[c]")


def test_a_busy_instance_is_exit_75_and_changes_nothing(digest):
    with RowLock(f"{DIGEST}[a]"), pytest.raises(CommandError) as raised:
        jobctl("pause", f"{DIGEST}[a]")
    assert raised.value.returncode == BUSY
    assert paused("a") == (False, False)


# -- jobctl: every instance of a job ----------------------------------------------------------


def test_every_instance_is_paused_resumed_and_skipped_with_job_star(digest):
    digest.instances.set_enabled(["b"], False)
    JobInstance.objects.create(job=DIGEST, key="bad", cron="61 * * * *", kwargs={})
    assert jobctl("pause", f"{DIGEST}[*]") == (
        f"paused 2 of 3 instance(s) of {DIGEST} (1 invalid, not changed)"
    )
    assert paused("a") == (True, True) and paused("b") == (True, True)
    assert jobctl("pause", f"{DIGEST}[*]") == (
        f"paused 0 of 3 instance(s) of {DIGEST} (2 already paused; 1 invalid, not changed)"
    )
    assert jobctl("resume", f"{DIGEST}[*]") == (
        f"resumed 2 of 3 instance(s) of {DIGEST} (1 invalid, not changed)"
    )
    assert paused("a") == (False, False)
    assert paused("b") == (False, True), "b was disabled before the pause, and still is"

    assert jobctl("skip", f"{DIGEST}[*]") == (
        f"skipped the next slot of 2 of 3 instance(s) of {DIGEST} (1 invalid, not changed)"
    )
    skipped = JobRun.objects.filter(outcome=Outcome.SKIPPED)
    assert sorted(run.job for run in skipped) == [f"{DIGEST}[a]", f"{DIGEST}[b]"]


@pytest.mark.postgres_only  # SQLite's one write lock makes every instance busy at once
def test_with_job_star_a_busy_instance_is_named_and_the_others_are_operated_on(digest):
    out = StringIO()
    with RowLock(f"{DIGEST}[b]"), pytest.raises(CommandError) as raised:
        call_command("jobctl", "pause", f"{DIGEST}[*]", stdout=out)
    assert out.getvalue() == f"paused 1 of 2 instance(s) of {DIGEST} (1 busy, not changed)\n"
    assert raised.value.returncode == BUSY
    assert str(raised.value).startswith(
        f"1 instance(s) busy: a run is inside a fenced transaction on the lease row of "
        f"{DIGEST}[b]; nothing changed for them, try again"
    )
    assert paused("a") == (True, True) and paused("b") == (False, False)


# -- an instance's own timeout and grace --------------------------------------------------------


def test_an_instance_more_frequent_than_the_jobs_timeout_is_refused_on_timeout_saying_where(
    digest,
):
    with pytest.raises(ValidationError) as raised:
        digest.instances.upsert("often", every=timedelta(minutes=1), kwargs={"tenant_id": 3})
    (error,) = raised.value.error_dict["timeout"]
    assert error.code == CheckId.TIMEOUT
    assert error.message.endswith(
        "Fix: the timeout is the job's, declared in code (@job(timeout=...) of t.digest): give "
        "this instance a shorter timeout of its own, or a longer interval. (fencedjobs.E004)"
    )
    with pytest.raises(ValidationError) as raised:
        digest.instances.upsert(
            "often",
            every=timedelta(minutes=1),
            timeout=timedelta(minutes=2),
            kwargs={"tenant_id": 3},
        )
    (error,) = raised.value.error_dict["timeout"]
    assert "Fix: the timeout is this instance's own: shorten it" in error.message
    with pytest.raises(ValidationError) as raised:
        digest.instances.upsert("often", every=timedelta(minutes=1), timeout=timedelta(0))
    assert list(raised.value.error_dict) == ["timeout"]
    assert not JobInstance.objects.filter(key="often").exists()


def test_an_instance_runs_with_its_own_timeout_and_grace_every_minute(digest):
    often = digest.instances.upsert(
        "often",
        every=timedelta(minutes=1),
        timeout=timedelta(seconds=50),
        grace=timedelta(seconds=20),
        kwargs={"tenant_id": 3},
    )
    runs_as = instance_job(registry.get(DIGEST), often)
    assert (runs_as.run_timeout, runs_as.grace) == (timedelta(seconds=50), timedelta(seconds=20))
    row = JobLease.objects.get(name=f"{DIGEST}[often]")
    assert row.late_after == row.next_run_at + timedelta(seconds=70)
    # What a runner claims (one SQL statement on PostgreSQL) carries them.
    fake_clock.advance(timedelta(minutes=1))
    (due,) = lease.claim_instances([DIGEST], clock.now(), 10)
    assert (due.instance.key, due.instance.timeout, due.instance.grace) == (
        "often",
        timedelta(seconds=50),
        timedelta(seconds=20),
    )
    # The others keep the job's.
    assert instance_job(registry.get(DIGEST), digest.instances.get("a")).run_timeout == (
        timedelta(minutes=5)
    )


def test_the_admin_takes_an_instances_own_timeout_and_says_where_the_fix_is(
    digest, superuser_client
):
    every_minute = form_data(cron="", every="0:01:00", timezone="UTC", timeout="", grace="")
    refused = superuser_client.post(add_url(), every_minute)
    errors = refused.context["adminform"].form.errors
    assert (
        list(errors) == ["timeout"]
        and "give this instance a shorter timeout" in (errors["timeout"][0])
    )
    preview = superuser_client.get(
        preview_url(job=DIGEST, key="x", every="0:01:00", timeout="0:00:50")
    ).json()
    assert preview["error"] == "" and len(preview["times"]) == 10
    saved = superuser_client.post(add_url(), {**every_minute, "timeout": "0:00:50"})
    assert saved.status_code == 302
    instance = JobInstance.objects.get(key="tenant-42")
    assert (instance.timeout, instance.grace) == (timedelta(seconds=50), None)


# -- checkjobs ----------------------------------------------------------------------------------


def checkjobs(*args: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("checkjobs", *args, stdout=out, stderr=StringIO())
    except CommandError as exc:
        return exc.returncode, out.getvalue()
    return 0, out.getvalue()


def test_checkjobs_of_the_job_of_the_instances_reports_its_instances(digest):
    status, out = checkjobs("--job", DIGEST)
    assert (status, out) == (0, f"{DIGEST}: 2 instance(s): 2 ok\n")
    fake_clock.advance(timedelta(hours=1))  # past every deadline: both late
    status, out = checkjobs("--job", DIGEST, "--json")
    assert status == 2
    report = json.loads(out)
    assert {entry["name"]: entry["state"] for entry in report["jobs"]} == {
        f"{DIGEST}[a]": "late",
        f"{DIGEST}[b]": "late",
    }
    assert report["instances"][0]["job"] == DIGEST


def test_checkjobs_with_only_instances_prints_their_counts_and_when_it_checked(digest):
    status, out = checkjobs()
    assert (status, out) == (0, f"{DIGEST}: 2 instance(s): 2 ok\n")
    assert json.loads(checkjobs("--json")[1])["checked_at"] == JOBS_T0.isoformat()


def test_an_invalid_jobs_reason_names_its_check(jobs):
    job("61 * * * *", name="t.bad")(lambda run: None)
    status, out = checkjobs("--json")
    (bad,) = json.loads(out)["jobs"]
    assert status == 2
    assert bad["state"] == "invalid" and bad["reason"].endswith(f"({CheckId.CRON})")


# -- runonce ----------------------------------------------------------------------------------


def test_runonce_refuses_arguments_the_handler_does_not_take_with_e012(digest):
    with pytest.raises(CommandError) as raised:
        call_command("runonce", f"{DIGEST}[a]", "--at", "now", "--kwargs", '{"x": 1}')
    assert str(raised.value).endswith(f"({CheckId.HANDLER_SIGNATURE})")


def test_runonce_refuses_an_instant_in_the_past_unless_asked_to(digest):
    with pytest.raises(CommandError) as raised:
        call_command("runonce", f"{DIGEST}[a]", "--at", "2020-01-01T00:00Z")
    assert raised.value.returncode == 2
    assert str(raised.value).startswith(
        "--at 2020-01-01 00:00:00 UTC is in the past (2524 days, 9:00:00 ago): the one-off "
        "would run at once, as the run of that instant; give --at now to run it now, or add "
        "--past to run it for that instant"
    )
    assert not JobLease.objects.filter(kind="once").exists()
    call_command(
        "runonce", f"{DIGEST}[a]", "--at", "2020-01-01T00:00Z", "--past", stdout=StringIO()
    )
    assert JobLease.objects.filter(kind="once").count() == 1


# -- the database away: one line, one exit status, from every command ---------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["jobctl", "pause", "inst.digest[a]"],
        ["runonce", "inst.digest[a]", "--at", "now"],
        ["backfill", "inst.digest[a]", "--from", "2026-01-01T00:00Z", "--to", "2026-01-02T00:00Z"],
        ["runjobs", "--once"],
        ["runjobs", "--now", "inst.digest[a]"],
        ["checkjobs"],
        ["importbeat"],
    ],
    ids=lambda args: " ".join(args[:2]),
)
def test_an_unreachable_database_is_one_line_and_exit_3_from_every_command(child_env, args):
    env = {
        **check_env(child_env, "instanced"),
        "FENCEDJOBS_TEST_DB": "postgres",
        "DATABASE_URL": f"postgres://nobody@127.0.0.1:{closed_port()}/nowhere",
    }
    result = subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 3, result.stderr
    (line,) = result.stderr.splitlines()
    assert "database unavailable: " in line and "Is the server running" in line, line


def test_a_database_error_of_the_loop_is_one_line_on_the_terminal():
    out = StringIO()
    handler = console.TerminalHandler(out, 1)
    refused = OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 1 failed: Connection '
        "refused\n\tIs the server running on that host and accepting TCP/IP connections?"
    )
    handler.emit(
        logging.LogRecord(
            "django_fencedjobs",
            logging.ERROR,
            __file__,
            1,
            "database unavailable, retrying in %.1fs: %s",
            (1.0, refused),
            None,
        )
    )
    assert out.getvalue().endswith(
        "Connection refused Is the server running on that host and accepting TCP/IP connections?\n"
    )
    assert out.getvalue().count("\n") == 1
