"""The Prometheus metrics view, scraped after real runs (fake clock, ``runner.tick``)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.db import connection, transaction
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import path
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from django_fencedjobs import fenced_atomic, job
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.health import State
from django_fencedjobs.instances import write_lease
from django_fencedjobs.integrations.prometheus import (
    INSTANCE_STATES,
    METRICS,
    FencedJobsCollector,
    metrics_view,
)
from django_fencedjobs.loop import tick
from django_fencedjobs.models import JobInstance, JobRun, Outcome
from django_fencedjobs.registry import JobRegistry, registry
from tests.testapp.models import Write

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
FAKE = "django_fencedjobs.clock.fake_clock"

urlpatterns = [path("metrics", metrics_view)]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def jobs() -> Iterator[JobRegistry]:
    with (
        registry.isolated() as isolated,
        override_settings(FENCEDJOBS={"CLOCK": FAKE}, ROOT_URLCONF=__name__),
    ):
        fake_clock.set(T0)
        yield isolated


def scrape(client: Client | None = None, **headers: str) -> Samples:
    response = (client or Client()).get("/metrics", headers=headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[sample.name, frozenset(sample.labels.items())] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def declare_two_jobs() -> None:
    @job("*/15 * * * *", name="m.invoices")
    def invoices(run):
        with fenced_atomic():
            Write.objects.create(job="m.invoices", fence=run.fence, seq=1)
        fake_clock.advance(timedelta(seconds=42))  # the run takes 42 s

    @job("*/15 * * * *", name="m.broken", failure_threshold=2)
    def broken(run):
        fake_clock.advance(timedelta(seconds=3))
        raise RuntimeError("the API is down")


def test_the_metrics_view_reports_each_jobs_figures_after_real_runs(jobs: JobRegistry) -> None:
    declare_two_jobs()
    tick()  # the lease rows; the first slots are at 09:15
    for slot in (T0 + timedelta(minutes=15), T0 + timedelta(minutes=30)):
        fake_clock.set(slot + timedelta(seconds=1))
        # One worker: the handlers move the one fake clock, so they must take turns.
        assert len(tick(workers=1).runs) == 2
    assert JobRun.objects.filter(job="m.invoices", outcome=Outcome.SUCCEEDED).count() == 2
    assert JobRun.objects.filter(job="m.broken", outcome=Outcome.FAILED).count() == 2

    samples = scrape()
    # Jobs due at one instant run in an order of the process's own: m.broken's 3 s came
    # first or did not.
    last_start = JobRun.objects.filter(job="m.invoices").latest("scheduled_for").started_at
    assert last_start in (T0 + timedelta(minutes=30, seconds=1 + d) for d in (0, 3))
    ok, broken = {"job_name": "m.invoices"}, {"job_name": "m.broken"}

    last_success = value(samples, "fencedjobs_last_success_timestamp_seconds", **ok)
    assert last_success == last_start.timestamp()
    assert value(samples, "fencedjobs_last_success_timestamp_seconds", **broken) is None
    assert value(samples, "fencedjobs_last_run_duration_seconds", **ok) == 42
    assert value(samples, "fencedjobs_last_run_duration_seconds", **broken) == 3
    assert value(samples, "fencedjobs_consecutive_failures", **ok) == 0
    assert value(samples, "fencedjobs_consecutive_failures", **broken) == 2
    assert value(samples, "fencedjobs_failure_threshold", **broken) == 2
    assert value(samples, "fencedjobs_expected_interval_seconds", **ok) == 15 * 60
    assert value(samples, "fencedjobs_timeout_seconds", **ok) == 7.5 * 60  # half the interval
    assert value(samples, "fencedjobs_grace_seconds", **ok) == 5 * 60
    # The dead man's switch: the slot after the last success (09:45) + timeout + grace.
    deadline = T0 + timedelta(minutes=45) + timedelta(minutes=7.5) + timedelta(minutes=5)
    assert value(samples, "fencedjobs_deadline_timestamp_seconds", **ok) == deadline.timestamp()

    states = {
        (labels["job_name"], labels["state"]): v
        for (name, frozen), v in samples.items()
        if name == "fencedjobs_state"
        for labels in [dict(frozen)]
    }
    assert {key for key, v in states.items() if v == 1} == {
        ("m.invoices", "ok"),
        ("m.broken", "failing"),
    }
    assert len(states) == 2 * len(State)  # one-hot: every state, 0 or 1

    assert value(samples, "fencedjobs_runs", outcome="succeeded", **ok) == 2
    assert value(samples, "fencedjobs_runs", outcome="failed", **broken) == 2
    assert value(samples, "fencedjobs_runs", outcome="failed", **ok) == 0
    assert value(samples, "fencedjobs_runs", outcome="timed_out", **broken) == 0


def test_a_job_past_its_deadline_is_late_in_the_metrics(jobs: JobRegistry) -> None:
    declare_two_jobs()
    tick()
    fake_clock.set(T0 + timedelta(minutes=15, seconds=1))
    tick()
    deadline = value(scrape(), "fencedjobs_deadline_timestamp_seconds", job_name="m.invoices")
    assert deadline is not None
    fake_clock.set(datetime.fromtimestamp(deadline, UTC) + timedelta(seconds=1))
    samples = scrape()
    assert value(samples, "fencedjobs_state", job_name="m.invoices", state="late") == 1
    assert value(samples, "fencedjobs_state", job_name="m.invoices", state="ok") == 0


def test_a_last_run_that_was_abandoned_or_missed_has_no_duration(jobs: JobRegistry) -> None:
    declare_two_jobs()
    tick()
    fake_clock.set(T0 + timedelta(minutes=15, seconds=1))
    tick(workers=1)
    assert value(scrape(), "fencedjobs_last_run_duration_seconds", job_name="m.invoices") == 42
    # Its process died mid-run: a later run noticed a quarter of an hour after it started.
    slot = T0 + timedelta(minutes=30)
    JobRun.objects.create(
        job="m.invoices",
        scheduled_for=slot,
        started_at=slot,
        finished_at=slot + timedelta(minutes=15),
        outcome=Outcome.ABANDONED,
    )
    JobRun.objects.create(
        job="m.broken", scheduled_for=slot, finished_at=slot, outcome=Outcome.MISSED
    )
    samples = scrape()
    assert value(samples, "fencedjobs_last_run_duration_seconds", job_name="m.invoices") is None
    assert value(samples, "fencedjobs_last_run_duration_seconds", job_name="m.broken") is None


def test_every_metric_is_exposed_and_documented(jobs: JobRegistry) -> None:
    declare_two_jobs()
    declare_digest().instances.upsert("a", every=timedelta(hours=1), kwargs={"fail": False})
    tick()
    fake_clock.set(T0 + timedelta(minutes=15, seconds=1))
    tick()
    exposed = {name for name, _ in scrape()}
    assert exposed == set(METRICS)
    doc = (Path(__file__).resolve().parent.parent / "docs" / "metrics.md").read_text()
    assert [name for name in METRICS if f"`{name}`" not in doc] == []


def test_a_scrape_costs_the_same_queries_for_one_job_or_twenty(jobs: JobRegistry) -> None:
    def queries() -> int:
        tick()
        with CaptureQueriesContext(connection) as captured:
            scrape()
        return len(captured)

    @job("*/15 * * * *", name="m.first")
    def first(run):
        pass

    one = queries()
    for n in range(19):
        job("*/15 * * * *", name=f"m.more{n}")(lambda run: None)
    assert queries() == one


def test_registering_the_collector_does_not_query_the_database(jobs: JobRegistry) -> None:
    with CaptureQueriesContext(connection) as captured:
        CollectorRegistry().register(FencedJobsCollector())
    assert len(captured) == 0


def test_with_a_token_set_only_a_bearer_of_the_token_gets_the_metrics(jobs: JobRegistry) -> None:
    declare_two_jobs()
    tick()
    with override_settings(FENCEDJOBS={"CLOCK": FAKE, "METRICS_TOKEN": "s3cret"}):
        client = Client()
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        samples = scrape(client, Authorization="Bearer s3cret")
        assert value(samples, "fencedjobs_consecutive_failures", job_name="m.broken") == 0
        post = client.post("/metrics", headers={"Authorization": "Bearer s3cret"})
        assert post.status_code == 405


def test_the_view_speaks_openmetrics_when_asked(jobs: JobRegistry) -> None:
    declare_two_jobs()
    tick()
    response = Client().get("/metrics", headers={"Accept": "application/openmetrics-text"})
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.decode().rstrip().endswith("# EOF")


def test_the_alert_rules_use_only_exposed_metrics_and_are_in_the_docs() -> None:
    repo = Path(__file__).resolve().parent.parent
    rules_file = repo / "deploy" / "prometheus" / "fencedjobs.rules.yml"
    (group,) = yaml.safe_load(rules_file.read_text())["groups"]
    alerts = {rule["alert"]: rule for rule in group["rules"]}
    assert set(alerts) == {
        "FencedJobLate",
        "FencedJobFailing",
        "FencedJobUnreliable",
        "FencedJobNoRunner",
        "FencedJobInvalid",
        "FencedJobCapped",
        "FencedJobInstancesCritical",
        "FencedJobsMetricsAbsent",
    }
    for rule in alerts.values():
        assert rule["labels"]["severity"] in ("critical", "warning")
        assert rule["annotations"]["summary"]
        used = set(re.findall(r"\bfencedjobs_\w+", rule["expr"]))
        assert used and used <= set(METRICS), rule["expr"]
        # Our label is job_name: a `job` matcher would hit Prometheus' own scrape-job label.
        assert not re.search(r"\bjob\s*[=!~]|\bby \(job\)|\bon \(job\)", rule["expr"])
    assert "fencedjobs_deadline_timestamp_seconds" in alerts["FencedJobLate"]["expr"]
    assert 'fencedjobs_state{state="failing"}' in alerts["FencedJobFailing"]["expr"]
    assert "fencedjobs_instances_critical" in alerts["FencedJobInstancesCritical"]["expr"]
    assert rules_file.read_text().strip() in (repo / "docs" / "metrics.md").read_text()


# -- instances -----------------------------------------------------------------------------


def declare_digest(**options: Any) -> Any:
    @job(instances=True, timeout=timedelta(seconds=30), name="m.digest", **options)
    def digest(run, *, fail: bool):
        if fail:
            raise RuntimeError("the tenant's mail server said no")

    return digest


def add_instances(count: int, start: int = 0) -> None:
    """``count`` hourly instances of m.digest, written as ``JobInstance.save()`` writes
    them (the row, then its lease row), in one transaction, each with a run that
    succeeded an hour ago and one that was missed."""
    added = JobInstance.objects.bulk_create(
        JobInstance(job="m.digest", key=f"t{n}", every=timedelta(hours=1), kwargs={"fail": False})
        for n in range(start, start + count)
    )
    with transaction.atomic():
        for instance in added:
            write_lease(instance)
    hour_ago = T0 - timedelta(hours=1)
    JobRun.objects.bulk_create(
        JobRun(job=instance.name, scheduled_for=slot, outcome=outcome)
        for instance in added
        for slot, outcome in (
            (hour_ago, Outcome.SUCCEEDED),
            (hour_ago - timedelta(hours=1), Outcome.MISSED),
        )
    )


def exposition() -> str:
    response = Client().get("/metrics")
    assert response.status_code == 200
    return response.content.decode()


def series_of(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def instance_counts(samples: Samples, job_name: str = "m.digest") -> dict[str, float]:
    return {
        state: count
        for state in INSTANCE_STATES
        if (count := value(samples, "fencedjobs_instances", job_name=job_name, state=state))
    }


def test_a_thousand_instances_make_as_many_series_as_ten_and_cost_the_same_queries(
    jobs: JobRegistry,
) -> None:
    declare_digest()
    add_instances(10)

    def scrape_counted() -> tuple[list[str], int]:
        with CaptureQueriesContext(connection) as captured:
            text = exposition()
        return series_of(text), len(captured)

    ten, ten_queries = scrape_counted()
    add_instances(990, start=10)
    thousand, thousand_queries = scrape_counted()
    assert len(thousand) == len(ten)
    assert thousand_queries == ten_queries
    assert not [line for line in thousand if "m.digest[" in line]
    samples = scrape()
    assert instance_counts(samples) == {"ok": 1000}
    assert value(samples, "fencedjobs_runs", job_name="m.digest", outcome="succeeded") == 1000
    assert value(samples, "fencedjobs_instances_critical", job_name="m.digest") == 0


def test_an_aggregated_instance_shows_in_its_jobs_counts_and_runs_not_in_series_of_its_own(
    jobs: JobRegistry,
) -> None:
    digest = declare_digest()
    for key in ("a", "b", "c"):
        digest.instances.upsert(key, every=timedelta(hours=1), kwargs={"fail": False})
    digest.instances.upsert("broken", every=timedelta(minutes=1), kwargs={"fail": True})
    digest.instances.upsert("off", every=timedelta(minutes=1), kwargs={"fail": False})
    digest.instances.set_enabled(["off"], False)
    for minute in (1, 2):
        fake_clock.set(T0 + timedelta(minutes=minute, seconds=1))
        assert [r.job for r in tick().runs] == ["m.digest[broken]"]

    samples = scrape()
    assert instance_counts(samples) == {"ok": 3, "disabled": 1, "failing": 1}
    assert value(samples, "fencedjobs_instances_critical", job_name="m.digest") == 0  # 2 < 3
    assert value(samples, "fencedjobs_runs", job_name="m.digest", outcome="failed") == 2
    assert value(samples, "fencedjobs_runs", job_name="m.digest", outcome="succeeded") == 0
    named = {dict(labels).get("job_name") for _, labels in samples}
    assert named - {None} == {"m.digest"}

    # No runner for a while: its first slot (09:01) was due to succeed by 09:06:30.
    fake_clock.set(T0 + timedelta(minutes=20))
    samples = scrape()
    assert instance_counts(samples) == {"ok": 3, "disabled": 1, "late": 1}
    assert value(samples, "fencedjobs_instances_critical", job_name="m.digest") == 1


def test_instances_of_a_job_that_asks_for_a_series_each_have_every_series_of_a_job(
    jobs: JobRegistry,
) -> None:
    digest = declare_digest(instance_series="each")
    for key in ("a", "b"):
        digest.instances.upsert(key, every=timedelta(hours=1), kwargs={"fail": False})
    digest.instances.upsert("broken", every=timedelta(minutes=1), kwargs={"fail": True})
    fake_clock.set(T0 + timedelta(minutes=1, seconds=1))
    tick()
    fake_clock.set(T0 + timedelta(minutes=20))

    samples = scrape()
    states = {
        labels["job_name"]: labels["state"]
        for (name, frozen), v in samples.items()
        if name == "fencedjobs_state" and v == 1
        for labels in [dict(frozen)]
    }
    # Every instance, the ok ones too (health lists only the ones that may not be ok).
    assert states == {
        "m.digest[a]": "never_run",
        "m.digest[b]": "never_run",
        "m.digest[broken]": "late",
    }
    broken = {"job_name": "m.digest[broken]"}
    assert value(samples, "fencedjobs_consecutive_failures", **broken) == 1
    assert value(samples, "fencedjobs_expected_interval_seconds", **broken) == 60
    assert value(samples, "fencedjobs_timeout_seconds", job_name="m.digest[a]") == 30
    assert value(samples, "fencedjobs_runs", outcome="failed", **broken) == 1
    assert value(samples, "fencedjobs_runs", job_name="m.digest", outcome="failed") is None
    # The counts per job and state are there as well.
    assert instance_counts(samples) == {"ok": 2, "late": 1}
    # Up to 31 series an instance (docs/metrics.md): 10 states, 11 outcomes, 10 figures, of
    # which the last success comes with the first success.
    per_instance = [
        line for line in series_of(exposition()) if 'job_name="m.digest[broken]"' in line
    ]
    assert len(per_instance) == 30
