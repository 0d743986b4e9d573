"""P14: history at tens of millions of runs, and retention that keeps up with it.

100,000 instances of the bench app's ``bench.digest`` (declared with ``instances=True``,
hourly), made as P10 makes them (``common.make_instances``). Their runs are loaded by
``INSERT ... SELECT`` over ``generate_series``, one hourly slot of every instance per
statement, going back from the latest hour (most succeeded, one in 23 failed with a
traceback, one in 97 missed), then ``VACUUM ANALYZE``, and each instance's lease row set as
its runs' ends would have left it (``settle_leases``): first 10 slots each (1,000,000 runs),
measured; then 100 more each (11,000,000), measured; then 90 more (20,000,000 runs, a
week and a day of 100,000 hourly instances), measured again.

**Pages and reads** (alternating samples, the same at every size, through Django's test
client as a staff user with view permissions): the runs list, an instance's runs
(``?job=``), the Jobs page, the job's instances (``?job=``) and one instance's page;
``checkjobs --json`` (every job and instance judged, as a monitor would call it); the
health of one instance (``health.job_health``), every size read at the same moment (the
clock fixed ten minutes after the latest slot); then the Jobs page and ``checkjobs`` two
hours on, every instance past its deadline (a dead runner: all 100,000 may not be ok, the
first ``INSTANCES_JUDGED`` judged, all counted by their lease rows). Goal: each at
20,000,000 runs at most 1.2 times the same at 1,000,000. With 10 runs, an instance has
fewer than a page of its runs, the failure rate's window or a day's timeline: at
11,000,000 it has as many of those as at 20,000,000, so that ratio is the history's alone
(also at most 1.2).

**Retention.** ``RUN_RETENTION`` set so that the oldest 24 slots of every instance have
expired: 2,400,000 runs, what 100,000 hourly instances expire every day.

* A real ``runjobs`` loop with a job every second, for 40 s with nothing to purge, then for
  40 s with that backlog: the job's lateness (start minus slot) in each, the runner's own
  retention chore draining the backlog in the second (the runs it deleted are counted).
* Then the rest of the backlog drained by the chore's own turns (``Retention.turn``), called
  back to back and each timed: the runs a turn deletes, how long a turn holds the runner
  (its chores run between its passes), and the cost per deleted run. The runs deleted a day
  at the chore's cadence (a turn, then :data:`~django_fencedjobs.retention.BEHIND_EVERY`)
  must be at least the 2,400,000 expiring a day.
"""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

from bench import common

KEY = "i000050"
TICK_JOB = "bench.p14.every_second"
#: The runner's retention, in hours, and its runs kept per job (bench/settings.py reads
#: them).
RETENTION_ENV = "FENCEDJOBS_BENCH_RETENTION_HOURS"
KEPT_ENV = "FENCEDJOBS_BENCH_RUNS_KEPT"
#: The runs of every instance that expire: a day of hourly slots.
EXPIRED_SLOTS = 24


def sizes(smoke: bool) -> tuple[int, int, int, int, int, int]:
    """(instances, slots at the small size, at the middle one, at the large, samples,
    runner window s)."""
    return (2_000, 10, 30, 40, 3, 10) if smoke else (100_000, 10, 110, 200, 3, 40)


def latest_hour() -> int:
    return int(time.time() // 3600 * 3600)


def load_slots(first: int, last: int, instances: int, latest: int) -> None:
    """The runs of slots ``first`` <= s < ``last`` hours back from ``latest``, of every
    instance, one statement per slot."""
    from django.db import connection

    from bench.benchapp.jobs import DIGEST

    with connection.cursor() as cursor:
        for slot in range(first, last):
            cursor.execute(
                """
                INSERT INTO fencedjobs_jobrun (job, scheduled_for, started_at, finished_at,
                    outcome, capped, items, batches, fence, owner, missed_slots,
                    watermark_before, watermark_after, error)
                SELECT %(job)s || '[i' || lpad(i::text, 6, '0') || ']', t,
                       CASE WHEN g %% 97 = 0 THEN NULL ELSE t + interval '1 second' END,
                       t + interval '3 seconds',
                       CASE WHEN g %% 97 = 0 THEN 'missed'
                            WHEN g %% 23 = 0 THEN 'failed' ELSE 'succeeded' END,
                       false, g %% 1000, 1, %(fence)s, 'bench-host:4242', 0, '', '',
                       CASE WHEN g %% 23 = 0 AND g %% 97 <> 0
                            THEN 'Traceback (most recent call last):' || repeat(' frame', 40)
                                 || E'\\nRuntimeError: the upstream API answered 503'
                            ELSE '' END
                FROM generate_series(0, %(n)s - 1) AS i,
                     LATERAL (SELECT i + %(slot)s * %(n)s) AS x(g),
                     LATERAL (SELECT to_timestamp(%(latest)s - %(slot)s * 3600)) AS s(t)
                """,
                {
                    "job": DIGEST,
                    "n": instances,
                    "slot": slot,
                    "latest": latest,
                    "fence": 1000 - slot,
                },
            )


def settle_leases(job: str) -> None:
    """Each instance's lease row as its runs' ends would have left it: its last success,
    its failures since, and the ages of its last two failures among its judged slots
    (``JobLease.last_failure_age``), read from its latest 64 judged runs."""
    from django.db import connection

    with connection.cursor() as cursor:
        # The runs just loaded, counted for the planner: without it, the latest runs of an
        # instance may be looked for along every run of an outcome, for each instance.
        cursor.execute("ANALYZE fencedjobs_jobrun")
        cursor.execute(
            """
            UPDATE fencedjobs_joblease AS lease SET
                last_success_at = (SELECT MAX(finished_at) FROM fencedjobs_jobrun
                                   WHERE job = lease.name AND outcome = 'succeeded'),
                consecutive_failures = COALESCE(array_position(judged.o, 'succeeded'),
                                                cardinality(judged.o) + 1) - 1,
                last_failure_age = array_position(judged.o, 'failed'),
                previous_failure_age = CASE WHEN 'failed' = ANY(judged.o) THEN array_position(
                    judged.o, 'failed', array_position(judged.o, 'failed') + 1) END
            FROM (SELECT row.id, COALESCE(latest.o, '{}') AS o
                  FROM fencedjobs_joblease AS row
                  JOIN fencedjobs_jobinstance AS instance ON instance.id = row.instance_id,
                  LATERAL (SELECT array_agg(outcome ORDER BY scheduled_for DESC) AS o
                           FROM (SELECT outcome, scheduled_for FROM fencedjobs_jobrun
                                 WHERE job = row.name AND outcome IN ('succeeded', 'failed')
                                 ORDER BY scheduled_for DESC LIMIT 64) AS runs) AS latest
                  WHERE instance.job = %s) AS judged
            WHERE lease.id = judged.id
            """,
            [job],
        )


def measure(smoke: bool) -> common.Report:
    from django.contrib.auth.models import Permission, User
    from django.core.management import CommandError, call_command
    from django.test import Client, override_settings
    from django.urls import reverse

    from bench.benchapp.jobs import DIGEST
    from django_fencedjobs import clock, health
    from django_fencedjobs.clock import fake_clock
    from django_fencedjobs.declared import sync as sync_rows
    from django_fencedjobs.models import JobInstance, JobRun
    from django_fencedjobs.registry import registry

    instances, small_slots, mid_slots, big_slots, repeats, window = sizes(smoke)
    report = common.Report("P14", "history at tens of millions of runs, and retention")
    common.drop_instances(DIGEST)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE fencedjobs_runtask, fencedjobs_jobrun")
    sync_rows([registry.get(DIGEST)], clock.now())
    made = common.make_instances(DIGEST, instances, cron="0 * * * *")
    User.objects.filter(username="bench-p14").delete()
    staff = User.objects.create_user("bench-p14", is_staff=True)
    staff.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="fencedjobs",
            codename__in=["view_jobrun", "view_joblease", "view_jobinstance"],
        )
    )
    client = Client()
    client.force_login(staff)
    instance = f"{DIGEST}[{KEY}]"
    runs_list = reverse("admin:fencedjobs_jobrun_changelist")
    pages = {
        "runs list": runs_list,
        "an instance's runs": f"{runs_list}?job={instance}",
        "Jobs page": reverse("admin:fencedjobs_joblease_changelist"),
        "the job's instances": reverse("admin:fencedjobs_jobinstance_changelist")
        + f"?job={DIGEST}",
        "an instance's page": reverse(
            "admin:fencedjobs_jobinstance_change",
            args=[JobInstance.objects.get(job=DIGEST, key=KEY).pk],
        ),
    }

    def page(url: str) -> None:
        response = client.get(url)
        if response.status_code != 200:
            raise RuntimeError(f"P14: GET {url} answered {response.status_code}")

    def checkjobs() -> None:
        try:
            call_command("checkjobs", "--json", stdout=io.StringIO(), stderr=io.StringIO())
        except CommandError:
            pass  # the instances have no runner: exit 2, as it should

    reads = {
        **{name: (lambda url=url: page(url)) for name, url in pages.items()},
        "checkjobs --json": checkjobs,
        "an instance's health": lambda: health.job_health(instance),
    }
    # The same moment two hours on, nothing run meanwhile: every instance is past its
    # deadline (a dead runner, or one far behind), so all 100,000 may not be ok.
    late_reads = {
        "Jobs page, every instance late": lambda: page(pages["Jobs page"]),
        "checkjobs --json, every instance late": checkjobs,
    }
    samples: dict[tuple[int, str], list[float]] = {}

    latest = latest_hour()

    def measure_size(runs: int) -> None:
        common.vacuum("fencedjobs_jobrun")
        # Every size read at the same moment, ten minutes after the latest slot: the
        # measurement takes half an hour, and no runner runs the instances meanwhile, so
        # past the next hour's deadline every instance would read late (and be judged one
        # by one) at the sizes measured after it, not at the others.
        with override_settings(FENCEDJOBS={"CLOCK": "django_fencedjobs.clock.fake_clock"}):
            for moment, some in ((timedelta(minutes=10), reads), (timedelta(hours=2), late_reads)):
                fake_clock.set(datetime.fromtimestamp(latest, UTC) + moment)
                for fn in some.values():  # warm
                    fn()
                for _, name in common.alternate(repeats, list(some)):
                    samples.setdefault((runs, name), []).append(common.timed(some[name], 1))

    began = time.monotonic()
    load_slots(0, small_slots, instances, latest)
    settle_leases(DIGEST)
    small_load = time.monotonic() - began
    small = JobRun.objects.count()
    measure_size(small)
    began = time.monotonic()
    load_slots(small_slots, mid_slots, instances, latest)
    settle_leases(DIGEST)
    mid = JobRun.objects.count()
    measure_size(mid)
    load_slots(mid_slots, big_slots, instances, latest)
    settle_leases(DIGEST)
    big_load = time.monotonic() - began
    big = JobRun.objects.count()
    measure_size(big)

    report.add(
        f"{instances:,} hourly instances of one job (made in {made:.0f} s); their runs "
        f"loaded {instances:,} a statement: {small:,} runs in {small_load:.0f} s, then "
        f"{mid:,} and {big:,} in {big_load:.0f} s more; `VACUUM ANALYZE` after each. "
        f"Medians of {repeats} alternating samples per read and size, ms. At {small:,} "
        f"runs an instance has {small_slots}, fewer than a page of runs (100), the "
        f"failure rate's window (20) and a day's timeline (24): from {mid:,} on, every "
        f"read shows as many rows as at {big:,}, and only the history behind them grows."
    )
    report.add("")
    rows = []
    for name in [*reads, *late_reads]:
        at_small, at_mid, at_big = (
            common.summarize([s * 1000 for s in samples[size, name]]) for size in (small, mid, big)
        )
        ratio = at_big.median / at_small.median
        history = at_big.median / at_mid.median
        rows.append(
            [
                name,
                at_small.fmt(".1f"),
                at_mid.fmt(".1f"),
                at_big.fmt(".1f"),
                f"{ratio:.2f}x",
                f"{history:.2f}x",
            ]
        )
        report.goal(
            f"{name} at {big:,} runs / at {small:,}",
            "≤ 1.2x",
            f"{ratio:.2f}x ({at_big.median:.1f} ms against {at_small.median:.1f} ms)",
            ratio <= 1.2,
        )
        report.goal(
            f"{name} at {big:,} runs / at {mid:,} (the same rows shown)",
            "≤ 1.2x",
            f"{history:.2f}x ({at_big.median:.1f} ms against {at_mid.median:.1f} ms)",
            history <= 1.2,
        )
    report.add("")
    header = ["read", *(f"ms at {size:,}" for size in (small, mid, big)), "ratio", "ratio"]
    header[-2:] = [f"{big:,} / {small:,}", f"{big:,} / {mid:,}"]
    for line in common.table(header, rows):
        report.add(line)
    report.add("")
    retention(report, instances, big_slots, window)
    with connection.cursor() as cursor:  # first: deleting 17 million runs takes minutes
        cursor.execute("TRUNCATE fencedjobs_runtask, fencedjobs_jobrun")
    common.drop_instances(DIGEST)
    return report


def retention(report: common.Report, instances: int, slots: int, window: int) -> None:
    from django.test import override_settings

    from django_fencedjobs import clock, retention
    from django_fencedjobs.models import JobRun

    hours = slots - EXPIRED_SLOTS - 0.5
    # The default (100), but for the smoke run's shorter history.
    kept = min(100, slots - EXPIRED_SLOTS)
    expiring = instances * EXPIRED_SLOTS
    before = JobRun.objects.count()
    baseline = runner_window(window, retention=None)
    during = runner_window(window, retention=(hours, kept))
    by_runner = before - JobRun.objects.count()

    turns: list[tuple[float, int]] = []
    purged = {"RUN_RETENTION": timedelta(hours=hours), "RUNS_KEPT_PER_JOB": kept}
    with override_settings(FENCEDJOBS=purged):
        purging = retention.Retention()
        now = clock.now()
        while True:
            began = time.perf_counter()
            deleted, purging.behind = retention._purge_runs(
                now, retention.BATCH_SIZE, retention.MAX_BATCHES, retention.TURN_BUDGET
            )
            turns.append((time.perf_counter() - began, deleted))
            if not purging.behind:
                break
    left = sum(deleted for _, deleted in turns)
    held = [seconds * 1000 for seconds, deleted in turns if deleted]
    seconds = sum(s for s, _ in turns)
    per_turn = left / max(len(held), 1)
    turn_ms = common.summarize(held).median if held else 0.0
    per_day = per_turn / (turn_ms / 1000 + retention.BEHIND_EVERY) * 86_400
    report.add(
        f"Retention: `RUN_RETENTION` {hours} hours (`RUNS_KEPT_PER_JOB` {kept}) expires the "
        f"oldest {EXPIRED_SLOTS} slots of every instance, {expiring:,} runs (a day of "
        f"{instances:,} hourly instances)."
    )
    report.add("")
    report.add(
        f"A `runjobs` loop with a job every second, {window} s each way: with nothing to "
        f"purge, lateness p50 {baseline.p50:.0f} ms, p99 {baseline.p99:.0f} ms ({baseline.runs} "
        f"runs); with the backlog, p50 {during.p50:.0f} ms, p99 {during.p99:.0f} ms "
        f"({during.runs} runs), while its retention chore deleted {by_runner:,} runs."
    )
    report.add("")
    report.add(
        f"The rest ({left:,} runs) by the chore's turns back to back: {len(held)} turns, "
        f"{per_turn:,.0f} runs a turn, a turn holding the runner {turn_ms:.0f} ms (median, "
        f"max {max(held, default=0):.0f} ms), {seconds / max(left, 1) * 1e6:.0f} µs per deleted "
        f"run ({left / max(seconds, 1e-9):,.0f} runs/s while deleting). At the chore's cadence "
        f"(a turn, then {retention.BEHIND_EVERY:.0f} s): {per_day:,.0f} runs a day."
    )
    report.add("")
    report.goal(
        "retention: runs deleted a day at the chore's cadence",
        f"≥ {expiring:,} (a day's runs)",
        f"{per_day:,.0f}",
        per_day >= expiring,
    )
    report.goal(
        "a job every second: lateness p99, nothing to purge / with the backlog",
        "(printed)",
        f"{baseline.p99:.0f} ms / {during.p99:.0f} ms",
        None,
    )
    report.goal(
        "retention: a turn holds the runner (median / max)",
        "(printed)",
        f"{turn_ms:.0f} ms / {max(held, default=0):.0f} ms",
        None,
    )
    report.figures.update(
        per_day=per_day,
        turn_ms=turn_ms,
        late_p99_idle=baseline.p99,
        late_p99_purging=during.p99,
        deleted_by_runner=by_runner,
    )


class Window:
    def __init__(self, late: list[float]) -> None:
        self.runs = len(late)
        self.p50 = common.percentile(late, 50) * 1000 if late else float("nan")
        self.p99 = common.percentile(late, 99) * 1000 if late else float("nan")


def runner_window(seconds: int, *, retention: tuple[float, int] | None) -> Window:
    """A ``runjobs`` loop over a job every second for ``seconds``; its runs' lateness."""
    from django_fencedjobs.models import JobRun

    JobRun.objects.filter(job=TICK_JOB).delete()
    purging = {RETENTION_ENV: str(retention[0]), KEPT_ENV: str(retention[1])} if retention else {}
    env = common.child_env(**purging)
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.p14_history", "--serve-runner"], cwd=common.REPO, env=env
    )
    try:
        time.sleep(seconds)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    late = [
        (run.started_at - run.scheduled_for).total_seconds()
        for run in JobRun.objects.filter(job=TICK_JOB).exclude(started_at=None)
    ]
    JobRun.objects.filter(job=TICK_JOB).delete()
    return Window(late)


def serve_runner() -> int:
    common.setup_django()
    from django.core.management import call_command

    from django_fencedjobs import job

    @job(every=timedelta(seconds=1), name=TICK_JOB, timeout=timedelta(milliseconds=500))
    def every_second(run: object) -> None:
        return None

    call_command("runjobs", "--job", TICK_JOB, verbosity=0)
    return 0


if __name__ == "__main__":
    if "--serve-runner" in sys.argv:
        sys.exit(serve_runner())
    sys.exit(common.main(measure))
