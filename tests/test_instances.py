"""Instances (schedules as data): declared with ``@job(instances=True)``, created and
changed as rows, each a job of its own for its lease, fence, runs and watermarks, checked
exactly as the system checks check code."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ValidationError

from django_fencedjobs import job, lease, loop
from django_fencedjobs.checkids import CheckId
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.fencing import fenced_atomic
from django_fencedjobs.lease import FENCE_EPOCH
from django_fencedjobs.models import JobInstance, JobLease, JobRun, Outcome, Watermark
from django_fencedjobs.registry import registry

pytestmark = pytest.mark.django_db(transaction=True)

CALLS: list[tuple[str, dict]] = []


def _declare_digest():
    CALLS.clear()

    @job(instances=True, timeout=timedelta(seconds=30), name="t.digest")
    def digest(run, *, tenant_id: int, greeting: str = "hi"):
        with fenced_atomic():
            CALLS.append((run.job.name, {"tenant_id": tenant_id, "greeting": greeting}))

    return digest


def test_an_instance_runs_at_its_own_time_in_its_own_zone_with_its_arguments(jobs):
    digest = _declare_digest()
    fake_clock.set(datetime(2026, 11, 29, 8, 30, tzinfo=UTC))
    digest.instances.upsert(
        "paris", cron="0 10 * * *", timezone="Europe/Paris", kwargs={"tenant_id": 1}
    )
    digest.instances.upsert("utc", cron="0 10 * * *", kwargs={"tenant_id": 2, "greeting": "yo"})

    # 2026-11-29 09:00 UTC is 10:00 in Paris: due at once; UTC's 10:00 an hour later.
    assert JobLease.objects.get(name="t.digest[paris]").next_run_at == datetime(
        2026, 11, 29, 9, 0, tzinfo=UTC
    )
    fake_clock.set(datetime(2026, 11, 29, 9, 0, 1, tzinfo=UTC))
    result = loop.tick()
    assert [r.job for r in result.runs] == ["t.digest[paris]"]
    assert CALLS == [("t.digest[paris]", {"tenant_id": 1, "greeting": "hi"})]
    assert result.next_wakeup == datetime(2026, 11, 29, 10, 0, tzinfo=UTC)

    fake_clock.set(datetime(2026, 11, 29, 10, 0, 1, tzinfo=UTC))
    result = loop.tick()
    assert [r.job for r in result.runs] == ["t.digest[utc]"]
    assert CALLS[-1] == ("t.digest[utc]", {"tenant_id": 2, "greeting": "yo"})
    run = JobRun.objects.get(job="t.digest[utc]")
    assert run.outcome == Outcome.SUCCEEDED
    assert run.fence == JobLease.objects.get(name="t.digest[utc]").id * FENCE_EPOCH + 1


def test_an_edit_takes_effect_at_the_next_tick(jobs):
    digest = _declare_digest()
    digest.instances.upsert("a", cron="0 12 * * *", kwargs={"tenant_id": 1})
    assert loop.tick().runs == []
    digest.instances.upsert("a", cron="*/5 * * * *", kwargs={"tenant_id": 7})
    fake_clock.advance(timedelta(minutes=5))
    assert [r.job for r in loop.tick().runs] == ["t.digest[a]"]
    assert CALLS == [("t.digest[a]", {"tenant_id": 7, "greeting": "hi"})]


def test_a_disabled_instance_does_not_run_and_enabling_it_resumes(jobs):
    digest = _declare_digest()
    digest.instances.upsert("a", every=timedelta(minutes=1), kwargs={"tenant_id": 1})
    digest.instances.set_enabled(["a"], False)
    fake_clock.advance(timedelta(minutes=2))
    assert loop.tick().runs == []
    digest.instances.set_enabled(["a"], True)
    assert [r.job for r in loop.tick().runs] == ["t.digest[a]"]


@pytest.mark.parametrize(
    ("fields", "check_id", "field"),
    [
        ({"cron": "61 * * * *"}, CheckId.CRON, "cron"),
        ({"cron": "0 8 * * *", "timezone": "Mars/Olympus"}, CheckId.ZONE, "timezone"),
        ({"cron": "0 8 * * *", "timezone": "UTC+2"}, CheckId.FIXED_OFFSET, "timezone"),
        ({"every": timedelta(seconds=20)}, CheckId.TIMEOUT, "timeout"),
        ({"every": timedelta(0)}, CheckId.CRON, "every"),
        (
            {"cron": "0 8 * * *", "jitter": timedelta(days=2)},
            CheckId.JITTER,
            "jitter",
        ),
    ],
)
def test_a_bad_instance_is_refused_with_the_system_checks_id_and_message(
    jobs, fields, check_id, field
):
    digest = _declare_digest()
    with pytest.raises(ValidationError) as raised:
        digest.instances.upsert("bad", kwargs={"tenant_id": 1}, **fields)
    errors = raised.value.error_dict[field]
    assert errors[0].code == check_id
    # The message the system check gives a code job with the same options, but the name.
    options = dict(fields)
    job(options.pop("cron", None), **options, name="t.same", timeout=timedelta(seconds=30))(
        lambda run: None
    )
    expected = str(registry.get("t.same").schedule_error).replace("t.same", "t.digest[bad]")
    if check_id == CheckId.TIMEOUT:  # and where the fix is: the job's timeout, in code
        expected += (
            " Fix: the timeout is the job's, declared in code (@job(timeout=...) of t.digest): "
            "give this instance a shorter timeout of its own, or a longer interval."
        )
    assert errors[0].message == f"{expected} ({check_id})"
    assert not JobInstance.objects.exists()
    assert not JobLease.objects.exists()


def test_arguments_are_checked_against_the_handlers_signature(jobs):
    digest = _declare_digest()
    with pytest.raises(ValidationError) as raised:
        digest.instances.upsert("a", cron="0 8 * * *", kwargs={"tenant": 1})
    (error,) = raised.value.error_dict["kwargs"]
    assert error.code == CheckId.HANDLER_SIGNATURE
    assert "'tenant'" in error.message


def test_an_instance_forced_in_by_the_orm_reads_invalid_and_the_others_run(jobs):
    digest = _declare_digest()
    digest.instances.upsert("good", every=timedelta(minutes=10), kwargs={"tenant_id": 1})
    JobInstance.objects.create(job="t.digest", key="bad", cron="not cron", kwargs={})
    bad = JobLease.objects.get(name="t.digest[bad]")
    assert bad.paused  # invalid: never claimed
    # Broken behind save()'s back, after it was valid:
    digest.instances.upsert("later", every=timedelta(minutes=10), kwargs={"tenant_id": 3})
    JobInstance.objects.filter(key="later").update(kwargs={"nope": 1})
    fake_clock.advance(timedelta(minutes=10))
    runs = loop.tick().runs
    assert [r.job for r in runs] == ["t.digest[good]"]
    assert JobLease.objects.get(name="t.digest[later]").paused


def test_each_instance_has_its_own_fence_and_watermark(jobs):
    @job(instances=True, timeout=timedelta(minutes=5), name="t.wm")
    def wm(run, *, start: str):
        for window in run.windows(timedelta(hours=1), start=datetime.fromisoformat(start)):
            with fenced_atomic():
                run.advance_watermark(window.end)

    wm.instances.upsert("a", every=timedelta(hours=1), kwargs={"start": "2026-11-29T00:00+00:00"})
    wm.instances.upsert("b", every=timedelta(hours=1), kwargs={"start": "2026-11-29T05:00+00:00"})
    fake_clock.advance(timedelta(hours=1))
    runs = loop.tick().runs
    assert sorted(r.job for r in runs) == ["t.wm[a]", "t.wm[b]"]
    marks = dict(Watermark.objects.values_list("job", "position"))
    assert marks == {
        "t.wm[a]": datetime(2026, 11, 29, 10, 0, tzinfo=UTC),
        "t.wm[b]": datetime(2026, 11, 29, 10, 0, tzinfo=UTC),
    }
    leases = dict(JobLease.objects.values_list("name", "id"))
    assert {r.job: r.fence for r in runs} == {
        name: pk * FENCE_EPOCH + 1 for name, pk in leases.items()
    }


def test_health_lists_the_instances_that_need_attention_and_counts_the_rest(jobs):
    from django_fencedjobs import health

    @job(instances=True, timeout=timedelta(seconds=30), name="t.h")
    def handler(run, *, fail: bool):
        if fail:
            raise RuntimeError("upstream said no")

    for n in range(5):
        handler.instances.upsert(f"ok{n}", every=timedelta(minutes=1), kwargs={"fail": False})
    handler.instances.upsert("bad", every=timedelta(minutes=1), kwargs={"fail": True})
    handler.instances.upsert("off", every=timedelta(minutes=1), kwargs={"fail": False})
    handler.instances.set_enabled(["off"], False)
    JobInstance.objects.create(job="t.h", key="invalid", cron="nope", kwargs={})
    fake_clock.advance(timedelta(minutes=1))
    loop.tick()

    healths = health.all_health()
    listed = {h.name: h.state for h in healths}
    assert listed == {"t.h[bad]": "failing", "t.h[invalid]": "invalid"}
    (summary,) = health.instance_summaries(healths)
    assert (summary.total, summary.disabled, summary.ok) == (8, 1, 5)

    # Nothing runs for a while: every enabled instance is late, by its stored deadline.
    fake_clock.advance(timedelta(minutes=10))
    late = {h.name for h in health.all_health() if h.state == "late"}
    assert late == {"t.h[bad]", *(f"t.h[ok{n}]" for n in range(5))}
    assert health.job_health("t.h[off]").state == "paused"
    assert health.job_health("t.h[off]").reason.startswith("disabled")


def test_more_instances_in_trouble_than_are_judged_are_counted_by_their_rows_and_told_once(
    jobs, monkeypatch
):
    """A bad deploy or a stalled runner puts every instance in trouble at once: health
    judges the first INSTANCES_JUDGED by name (here 3, as 500 would be at 100,000) and
    counts all of them by their lease rows; one message for the job's instances."""
    from io import StringIO

    from django.core import mail
    from django.core.management import CommandError, call_command
    from django.test import override_settings

    from django_fencedjobs import health, notify

    monkeypatch.setattr(health, "INSTANCES_JUDGED", 3)

    @job(instances=True, timeout=timedelta(seconds=30), name="t.many", failure_threshold=2)
    def handler(run, *, fail: bool):
        if fail:
            raise RuntimeError("upstream said no")

    for n in range(6):
        handler.instances.upsert(f"k{n}", every=timedelta(minutes=1), kwargs={"fail": n < 2})
    handler.instances.upsert("off", every=timedelta(minutes=1), kwargs={"fail": False})
    handler.instances.set_enabled(["off"], False)
    for _ in range(2):  # k0 and k1 fail twice: failing, critical at the threshold
        fake_clock.advance(timedelta(minutes=1))
        loop.tick()
    (summary,) = health.instance_summaries(health.all_health())
    assert summary.counted is None  # two may not be ok: both judged
    assert summary.states == {"failing": 2} and summary.ok == 4

    # Nothing runs for a while: all six enabled ones are in trouble, three are judged.
    fake_clock.advance(timedelta(minutes=10))
    healths = health.all_health()
    assert [h.name for h in healths] == ["t.many[k0]", "t.many[k1]", "t.many[k2]"]
    (summary,) = health.instance_summaries(healths)
    assert summary.states == {"failing": 2, "late": 4}
    assert (summary.ok, summary.disabled, summary.counted_critical) == (0, 1, 6)
    assert (summary.severity, summary.worst) == (health.Severity.CRITICAL, "failing")

    out = StringIO()
    with pytest.raises(CommandError) as raised:
        call_command("checkjobs", stdout=out)
    assert raised.value.returncode == 2
    assert "t.many[*] (failing)" in str(raised.value)
    line = "t.many: 7 instance(s): 0 ok, 1 disabled, 2 failing, 4 late (counted"
    assert line in out.getvalue()

    with override_settings(
        FENCEDJOBS={"CLOCK": "django_fencedjobs.clock.fake_clock", "NOTIFY": True},
        ADMINS=[("Ops", "ops@example.com")],
    ):
        mail.outbox.clear()
        told = notify.evaluate(healths, now=fake_clock())
        assert [t.name for t in told] == ["t.many[*]"]
        (message,) = mail.outbox
        assert "the instances of t.many: ok -> failing (critical)" in message.subject
        assert "2 failing, 4 late, 0 ok" in message.body
        # Back under the cap (the late ones ran): told back to ok, by job[*] again.
        fake_clock.advance(timedelta(minutes=1))
        loop.tick()
        loop.tick()
        (summary,) = health.instance_summaries(health.all_health())
        assert summary.counted is None and summary.states == {"failing": 2}
        told = notify.evaluate(health.all_health(), now=fake_clock())
        assert sorted(t.name for t in told) == ["t.many[*]", "t.many[k0]", "t.many[k1]"]


def test_a_slot_recorded_already_is_passed_over_without_handing_out_a_fence(jobs, caplog):
    """Two instances due in one batch, the slot of one recorded already (a run landed on
    it): that one moves past its slot with its fence unchanged, so that every fence a lease
    row hands out is a recorded run's; the other runs."""
    digest = _declare_digest()
    digest.instances.upsert("a", every=timedelta(minutes=1), kwargs={"tenant_id": 1})
    digest.instances.upsert("b", every=timedelta(minutes=1), kwargs={"tenant_id": 2})
    before = {row.name: row for row in JobLease.objects.filter(parent="t.digest")}
    slot = before["t.digest[a]"].next_run_at
    JobRun.objects.create(
        job="t.digest[a]",
        scheduled_for=slot,
        outcome=Outcome.SUCCEEDED,
        fence=before["t.digest[a]"].fence,
        owner="elsewhere",
        started_at=slot,
        finished_at=slot,
    )
    fake_clock.set(max(row.next_run_at for row in before.values()))
    loop.tick()

    after = {row.name: row for row in JobLease.objects.filter(parent="t.digest")}
    passed = after["t.digest[a]"]
    assert passed.fence == before["t.digest[a]"].fence
    assert passed.next_run_at > slot and passed.owner == ""
    assert list(JobRun.objects.filter(job="t.digest[a]").values_list("owner", flat=True)) == [
        "elsewhere"
    ]
    assert after["t.digest[b]"].fence > before["t.digest[b]"].fence  # taken, then ended
    assert CALLS == [("t.digest[b]", {"tenant_id": 2, "greeting": "hi"})]
    assert f"slot {slot.isoformat()} of t.digest[a] is already recorded; skipped" in caplog.text


def test_an_instance_runs_now_by_its_name(jobs, capsys):
    from django.core.management import call_command

    digest = _declare_digest()
    digest.instances.upsert("a", cron="0 12 * * *", kwargs={"tenant_id": 5})
    call_command("runjobs", "--now", "t.digest[a]", "--skip-checks")
    assert CALLS == [("t.digest[a]", {"tenant_id": 5, "greeting": "hi"})]
    assert JobRun.objects.get(job="t.digest[a]").outcome == Outcome.SUCCEEDED
    # Still at its own schedule's next fire time afterwards.
    assert JobLease.objects.get(name="t.digest[a]").next_run_at == datetime(
        2026, 11, 29, 12, 0, tzinfo=UTC
    )


def test_an_instance_deleted_while_it_runs_writes_nothing_more_and_its_run_is_kept(jobs):
    """Deleting an instance takes its lease row: the run in progress finds its fence gone at
    its next fenced block, writes nothing there, and is recorded (its history is kept)."""
    written: list[str] = []

    @job(instances=True, timeout=timedelta(seconds=30), name="t.del")
    def handler(run, *, n: int):
        with fenced_atomic():
            written.append("before")
        handler.instances.delete("a")  # as an operator would, from elsewhere
        with fenced_atomic():
            written.append("after")

    handler.instances.upsert("a", every=timedelta(minutes=1), kwargs={"n": 1})
    fake_clock.advance(timedelta(minutes=1))
    (run,) = loop.tick().runs
    assert written == ["before"]
    assert run.outcome == Outcome.FENCE_LOST
    assert "no longer current" in run.error
    assert JobRun.objects.filter(job="t.del[a]").count() == 1
    assert not JobLease.objects.filter(name="t.del[a]").exists()
    assert not JobInstance.objects.exists()


def test_an_instance_paused_by_an_operator_is_listed_and_not_counted_ok(jobs):
    from django_fencedjobs import health, operations

    digest = _declare_digest()
    digest.instances.upsert("a", every=timedelta(minutes=1), kwargs={"tenant_id": 1})
    digest.instances.upsert("b", every=timedelta(minutes=1), kwargs={"tenant_id": 2})
    operations.set_paused("t.digest[a]", True)
    healths = health.all_health()
    assert {h.name: h.state for h in healths} == {"t.digest[a]": "paused"}
    (summary,) = health.instance_summaries(healths)
    assert (summary.total, summary.disabled, summary.ok) == (2, 0, 1)


def test_an_instance_runs_now_from_a_test_by_its_name(jobs):
    from django_fencedjobs.testing import run_job_now

    digest = _declare_digest()
    digest.instances.upsert("a", cron="0 12 * * *", kwargs={"tenant_id": 9})
    record = run_job_now("t.digest[a]")
    assert record.outcome == Outcome.SUCCEEDED
    assert CALLS == [("t.digest[a]", {"tenant_id": 9, "greeting": "hi"})]


def test_a_runner_of_one_job_claims_its_own_instances_past_anothers_earlier_ones(jobs):
    from django_fencedjobs import lease
    from django_fencedjobs.loop import Dispatcher

    digest = _declare_digest()

    @job(instances=True, timeout=timedelta(seconds=30), name="t.other")
    def other(run, *, n: int):
        pass

    for n in range(30):  # due first, every minute
        other.instances.upsert(f"o{n}", every=timedelta(minutes=1), kwargs={"n": n})
    digest.instances.upsert("a", every=timedelta(minutes=2), kwargs={"tenant_id": 1})
    fake_clock.advance(timedelta(minutes=2))
    assert set(lease.instances_wakeups(["t.digest", "t.other"])) == {"t.digest", "t.other"}
    runs = Dispatcher([digest.job], workers=2).tick().runs
    assert [r.job for r in runs] == ["t.digest[a]"]
    assert not JobRun.objects.filter(job__startswith="t.other").exists()


def test_an_instance_without_a_required_argument_is_refused_naming_it(jobs):
    digest = _declare_digest()
    with pytest.raises(ValidationError) as raised:
        digest.instances.upsert("a", cron="0 8 * * *", kwargs={})
    (error,) = raised.value.error_dict["kwargs"]
    assert error.code == CheckId.HANDLER_SIGNATURE
    # Named as the missing argument, not only as part of the handler's signature
    # (Python 3.12 says "required argument", 3.13 "required keyword-only argument").
    assert re.search(r"missing a required (keyword-only )?argument: 'tenant_id'", error.message)


def test_with_no_live_runner_every_enabled_instance_is_no_runner_and_checkjobs_exits_2(jobs):
    from django.core.management import CommandError, call_command

    from django_fencedjobs import health, runners
    from django_fencedjobs.models import Runner

    digest = _declare_digest()
    digest.instances.upsert("a", every=timedelta(minutes=1), kwargs={"tenant_id": 1})
    digest.instances.upsert("b", every=timedelta(minutes=1), kwargs={"tenant_id": 2})
    digest.instances.set_enabled(["b"], False)
    fake_clock.advance(timedelta(minutes=1))
    loop.tick()
    # A runjobs loop that runs t.digest, and beat just now.
    Runner.objects.create(
        key="loop-1",
        mode="loop",
        owner="host:1",
        host="host",
        pid=1,
        workers=1,
        jobs="t.digest",
        started_at=fake_clock(),
        last_beat_at=fake_clock(),
    )
    (summary,) = health.instance_summaries(health.all_health())
    assert summary.no_runner is None and summary.ok == 1
    # Its beats stopped long ago: no runner serves the job any more.
    fake_clock.advance(timedelta(hours=2))
    seen = runners.read(fake_clock())
    (summary,) = health.instance_summaries(health.all_health(), coverage=seen)
    assert summary.no_runner is not None
    assert (summary.ok, summary.severity) == (0, health.Severity.CRITICAL)
    with pytest.raises(CommandError) as raised:
        call_command("checkjobs")
    assert raised.value.returncode == 2
    assert "t.digest[*] (no_runner)" in str(raised.value)


@pytest.mark.postgres_only
def test_a_batch_claim_costs_four_round_trips_whatever_its_size_and_an_end_one(jobs):
    from django_fencedjobs import runner
    from django_fencedjobs.runstate import RunState
    from tests.conftest import round_trips_of

    digest = _declare_digest()
    for n in range(12):
        digest.instances.upsert(f"k{n}", every=timedelta(minutes=1), kwargs={"tenant_id": n})
    fake_clock.advance(timedelta(minutes=1))
    bases = {"t.digest": digest.job}
    batch: list = []
    assert round_trips_of(lambda: batch.extend(runner.claim(10, bases=bases))) == 4
    assert len(batch) == 10
    assert round_trips_of(lambda: batch.extend(runner.claim(1, bases=bases))) == 4
    acquired = batch[0]
    state = RunState(acquired.job, acquired.record, watermarks=acquired.watermarks)
    # The end: its bound on lock waits and its one statement, in one query and transaction.
    assert round_trips_of(lambda: runner.record_end(state, Outcome.SUCCEEDED, "")) == 1
    assert JobRun.objects.get(pk=acquired.record.pk).outcome == Outcome.SUCCEEDED


@pytest.mark.postgres_only
def test_due_jobs_and_instances_are_claimed_together_in_one_transaction(jobs):
    """Jobs declared with a schedule are claimed as instances are: the due rows of a batch,
    whatever their number, by name and by the instances' index, taken in one statement
    (before, each job was acquired in a transaction of its own on a worker's thread)."""
    from django_fencedjobs import runner
    from django_fencedjobs.declared import runnable_jobs, sync
    from tests.conftest import round_trips_of

    named = {}
    for n in range(12):
        handler = job(every=timedelta(minutes=1), name=f"t.job{n:02d}")(lambda run: None)
        named[handler.job.name] = handler.job
    digest = _declare_digest()
    for n in range(3):
        digest.instances.upsert(f"k{n}", every=timedelta(minutes=1), kwargs={"tenant_id": n})
    sync(runnable_jobs(), fake_clock())
    fake_clock.advance(timedelta(minutes=1))
    batch: list = []

    def claim() -> None:
        batch.extend(runner.claim(10, named=named, bases={"t.digest": digest.job}))

    # BEGIN with the clock, the jobs' rows, the take, COMMIT: the jobs fill the batch.
    assert round_trips_of(claim) == 4
    assert len(batch) == 10 and {a.job.name for a in batch} <= set(named)
    # And the instances' rows, by their index.
    assert round_trips_of(claim) == 5
    assert len(batch) == 15  # the last two jobs, then the instances
    assert runner.claim(10, named=named, bases={"t.digest": digest.job}) == []
    recorded = JobRun.objects.values_list("job", "fence", "outcome")
    assert sorted(recorded) == sorted((a.job.name, a.record.fence, Outcome.RUNNING) for a in batch)


@pytest.mark.postgres_only
def test_the_loop_records_the_ends_of_the_runs_that_freed_its_workers_in_one_statement(
    jobs, monkeypatch
):
    """A stampede of instances: each worker used to record its run's end in a statement of
    its own. The loop records the ends waiting when it next claims, together, and the rest
    when it stops: every run reads succeeded."""
    from django_fencedjobs import lease
    from django_fencedjobs.loop import Dispatcher

    digest = _declare_digest()
    for n in range(8):
        digest.instances.upsert(f"k{n}", every=timedelta(minutes=1), kwargs={"tenant_id": n})
    fake_clock.advance(timedelta(minutes=1))
    # A claim waits for the four workers to be free (as long as it takes here).
    monkeypatch.setattr(loop, "CLAIM_GATHER", timedelta(seconds=30))
    batches: list[int] = []
    real = lease.end_runs

    def counted(ends, **kwargs):
        batches.append(len(ends))
        return real(ends, **kwargs)

    monkeypatch.setattr(lease, "end_runs", counted)
    Dispatcher([digest.job], workers=4).loop(max_ticks=2)
    outcomes = list(JobRun.objects.values_list("outcome", flat=True))
    assert outcomes == [Outcome.SUCCEEDED] * 8
    assert sum(batches) == 8
    assert max(batches) >= 3, batches  # the ends of the runs that freed the workers


@pytest.mark.postgres_only
def test_a_batch_claim_takes_its_leases_by_their_index_however_many_rows_the_table_has(jobs):
    """The batch of a claim comes as one JSON parameter, and PostgreSQL guesses 100 rows for
    any set-returning function: unless told the batch's size, its plan joined the batch to
    every lease row in a sequential scan, at every claim."""
    from django.db import connection, transaction

    from django_fencedjobs import runner

    digest = _declare_digest()
    for n in range(3):
        digest.instances.upsert(f"k{n}", every=timedelta(minutes=1), kwargs={"tenant_id": n})
    far = fake_clock() + timedelta(days=365)
    JobLease.objects.bulk_create(
        JobLease(name=f"t.other{n}", next_run_at=far, created_at=far) for n in range(3000)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE fencedjobs_joblease")
    fake_clock.advance(timedelta(minutes=1))
    statements: list[tuple[str, object]] = []

    def capture(execute, sql, params, many, context):
        statements.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        assert len(runner.claim(2, bases={"t.digest": digest.job})) == 2
    (take,) = [(sql, params) for sql, params in statements if "granted AS" in sql]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + take[0], take[1])
        plan = "\n".join(row[0] for row in cursor.fetchall())
        transaction.set_rollback(True)
    assert "on fencedjobs_joblease" in plan
    assert "Seq Scan on fencedjobs_joblease" not in plan, plan


def test_an_upsert_racing_another_for_a_new_key_changes_what_the_other_made(jobs, monkeypatch):
    from django_fencedjobs.instances import Instances

    digest = _declare_digest()
    digest.instances.upsert("a", cron="0 8 * * *", kwargs={"tenant_id": 1})
    real = Instances._write
    raced: list[bool] = []

    def looked_before_the_other_created_it(self, key, values):
        if not raced:  # this process's look missed the row the other has just made
            raced.append(True)
            JobInstance(job=self.job_name, key=key, **values).save()  # the unique key
        return real(self, key, values)

    monkeypatch.setattr(Instances, "_write", looked_before_the_other_created_it)
    digest.instances.upsert("a", cron="30 9 * * *", kwargs={"tenant_id": 2})
    assert raced
    (instance,) = JobInstance.objects.all()
    assert (instance.cron, instance.kwargs) == ("30 9 * * *", {"tenant_id": 2})


def test_a_claim_waits_a_moment_for_more_free_workers_while_most_are_busy(jobs, monkeypatch):
    """Three of four workers busy and instances due: the one free worker's claim is put off
    for CLAIM_GATHER (so that one claim may serve several workers), then made anyway."""
    import threading

    from django_fencedjobs.loop import Dispatcher

    release = threading.Event()
    started: list[int] = []
    lock = threading.Lock()

    @job(instances=True, timeout=timedelta(seconds=30), name="t.busy")
    def busy(run, *, n: int):
        with lock:
            started.append(n)
            first = len(started) == 1
        if not first:  # the first run to start returns; every other holds its worker
            release.wait(30)

    for n in range(5):
        busy.instances.upsert(f"b{n}", every=timedelta(minutes=1), kwargs={"n": n})
    fake_clock.advance(timedelta(minutes=1))
    monkeypatch.setattr(loop, "CLAIM_GATHER", timedelta(seconds=0.3))
    dispatcher = Dispatcher([busy.job], workers=4)
    dispatcher.scan()
    pool = dispatcher._pool()
    try:
        # Four free: four claimed at once (three of them will hold their worker).
        dispatcher.hand_out(pool)
        assert JobRun.objects.count() == 4
        for _ in range(200):  # the first run to start returns and frees its worker
            if pool.free() == 1:
                break
            threading.Event().wait(0.05)
        assert pool.free() == 1
        dispatcher.hand_out(pool)
        assert JobRun.objects.count() == 4  # put off: one worker of four free
        threading.Event().wait(0.4)
        dispatcher.hand_out(pool)
        assert JobRun.objects.count() == 5  # made anyway once the moment passed
    finally:
        release.set()
        pool.shutdown()


@pytest.mark.parametrize("kind", ["instance", "one-off"])
def test_a_runner_does_not_take_over_a_row_its_own_worker_still_runs(jobs, kind, monkeypatch):
    """The runner's process was paused past the lease of a run its worker holds (found by
    the soak): on waking, its claim passes that row by instead of taking it over from
    itself, which left a run recorded running that no worker could start ("no free worker")
    and the runs claimed with it unstarted. The worker's run goes on and ends as usual."""
    import threading

    from django_fencedjobs.backfills import run_once
    from django_fencedjobs.loop import Dispatcher

    release = threading.Event()

    @job(instances=True, timeout=timedelta(minutes=3), name="t.held")
    def held(run):
        release.wait(30)

    if kind == "instance":  # due at 09:04, and again at 09:08
        held.instances.upsert("a", every=timedelta(minutes=4))
        fake_clock.advance(timedelta(minutes=4))
    else:  # its schedule not due in the test: the one-off alone
        held.instances.upsert("a", every=timedelta(days=1))
        run_once("t.held[a]", fake_clock() + timedelta(seconds=30))
        fake_clock.advance(timedelta(minutes=1))
    monkeypatch.setattr(loop, "CLAIM_GATHER", timedelta(0))  # claim for one free worker
    dispatcher = Dispatcher([held.job], workers=2)
    dispatcher.scan()
    pool = dispatcher._pool()
    try:
        dispatcher.hand_out(pool)
        assert JobRun.objects.filter(outcome=Outcome.RUNNING).count() == 1
        fake_clock.advance(timedelta(minutes=4, seconds=30))  # past the 2-minute lease
        dispatcher.scan()
        dispatcher.hand_out(pool)  # raised RuntimeError: no free worker for the row
        assert JobRun.objects.count() == 1
    finally:
        release.set()
        pool.shutdown()
    (run,) = JobRun.objects.all()
    assert run.outcome == Outcome.SUCCEEDED


def test_a_run_left_running_is_recorded_abandoned_once_no_acquisition_can_end_it(jobs):
    # A runner died holding a run of each instance; then one instance was deleted and the
    # other disabled, so no later run of theirs will take the lease and end the dead run.
    @job(instances=True, timeout=timedelta(minutes=5), name="t.orphan")
    def orphan(run):
        pass

    now = fake_clock()
    fences = {}
    for key in ("gone", "off"):
        orphan.instances.upsert(key, every=timedelta(hours=1))
        name = f"t.orphan[{key}]"
        fences[name] = JobLease.objects.get(name=name).fence + 1
        JobLease.objects.filter(name=name).update(
            fence=fences[name], owner="dead", lease_until=now + timedelta(minutes=1)
        )
        JobRun.objects.create(
            job=name, scheduled_for=now, started_at=now, fence=fences[name], owner="dead"
        )
    orphan.instances.delete("gone")
    orphan.instances.set_enabled(["off"], False)

    assert lease.end_orphans(now) == 1  # the deleted one's; the other's lease still holds
    outcomes = dict(JobRun.objects.values_list("job", "outcome"))
    assert outcomes == {"t.orphan[gone]": Outcome.ABANDONED, "t.orphan[off]": Outcome.RUNNING}
    fake_clock.advance(timedelta(minutes=2))
    assert lease.end_orphans(fake_clock()) == 1
    assert JobRun.objects.get(job="t.orphan[off]").outcome == Outcome.ABANDONED
    # Its fence moved on: the holder, were it only paused, writes nothing when it resumes.
    assert JobLease.objects.get(name="t.orphan[off]").fence == fences["t.orphan[off]"] + 1
    assert lease.end_orphans(fake_clock()) == 0
