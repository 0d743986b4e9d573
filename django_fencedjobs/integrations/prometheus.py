"""Prometheus metrics: every job's state, read from the database at each scrape.

Install the extra (``pip install "django-fencedjobs[prometheus]"``) and mount the view::

    # urls.py
    from django_fencedjobs.integrations.prometheus import metrics_view

    urlpatterns = [..., path("metrics/fencedjobs", metrics_view)]

Or add the collector to a registry you already expose (django-prometheus, your own)::

    from prometheus_client import REGISTRY
    from django_fencedjobs.integrations.prometheus import FencedJobsCollector

    REGISTRY.register(FencedJobsCollector())

The figures come from :func:`django_fencedjobs.health.all_health` (the admin and
``checkjobs`` ask the same function) and one ``GROUP BY`` over the runs, so every process
serving them reports the same values, whichever process ran the jobs, and a scrape costs a
constant number of queries whatever the number of jobs. Nothing is counted in memory.

Every series carries the job in a ``job_name`` label, not ``job``: Prometheus gives every
scraped series a ``job`` label of its own (the scrape job), and would rename ours to
``exported_job``.

The view answers anyone, like any ``/metrics`` endpoint: keep it off the public internet
(a separate port or path your proxy does not route, a network policy), or set
``FENCEDJOBS["METRICS_TOKEN"]`` and give Prometheus the same token
(``authorization: {credentials: ...}`` in the scrape config). See docs/metrics.md.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Iterator
from datetime import datetime

from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_safe

from django_fencedjobs import health
from django_fencedjobs.conf import get_settings
from django_fencedjobs.lease import lease_db
from django_fencedjobs.models import JobRun, Outcome

try:
    from prometheus_client.core import CollectorRegistry, GaugeMetricFamily, Metric
    from prometheus_client.exposition import choose_encoder
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "django_fencedjobs.integrations.prometheus needs prometheus-client: "
        'pip install "django-fencedjobs[prometheus]"'
    ) from exc

__all__ = ["METRICS", "FencedJobsCollector", "metrics_view"]

#: The label that names the job on every series.
JOB_LABEL = "job_name"

#: Every metric the collector exposes, with its help text.
METRICS: dict[str, str] = {
    "fencedjobs_last_success_timestamp_seconds": (
        "When the job's last successful run started (Unix time); absent until it first succeeds."
    ),
    "fencedjobs_deadline_timestamp_seconds": (
        "The dead man's switch (Unix time): past this without a success the job is late. "
        "The first slot after the last success (or after the job was first seen) plus "
        "timeout plus grace."
    ),
    "fencedjobs_expected_interval_seconds": (
        "The shortest interval between two slots of the job's schedule."
    ),
    "fencedjobs_timeout_seconds": "The run timeout in force for the job.",
    "fencedjobs_grace_seconds": "Slack after timeout before a missing run makes the job late.",
    "fencedjobs_last_run_duration_seconds": (
        "Duration of the job's latest finished run, whatever its outcome (abandoned "
        "runs, whose process died, have none)."
    ),
    "fencedjobs_consecutive_failures": (
        "Runs that failed or timed out in a row; 0 after a success."
    ),
    "fencedjobs_failure_threshold": "Consecutive failures at which the job is failing.",
    "fencedjobs_state": (
        "1 for the job's current state, 0 for the others "
        "(ok, running, late, failing, never_run, paused, capped, removed, invalid)."
    ),
    "fencedjobs_runs": (
        "Recorded runs by outcome, as retained: a gauge, not a counter, because run "
        "retention deletes old runs and the figure then goes down."
    ),
}

#: Labels besides the job's.
_EXTRA_LABELS = {"fencedjobs_state": ["state"], "fencedjobs_runs": ["outcome"]}


def _timestamp(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


class FencedJobsCollector:
    """A Prometheus collector of every job's figures, read when collected."""

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The metric families without samples, so that registering the collector does
        not query the database (``CollectorRegistry.register`` calls this)."""
        for name, documentation in METRICS.items():
            yield GaugeMetricFamily(
                name, documentation, labels=[JOB_LABEL, *_EXTRA_LABELS.get(name, [])]
            )

    def collect(self) -> Iterator[Metric]:
        families = {family.name: family for family in self.describe()}

        def add(name: str, labels: Iterable[str], value: float | None) -> None:
            if value is not None:
                families[name].add_metric(list(labels), value)

        healths = sorted(health.all_health(), key=lambda h: h.name)
        for job_health in healths:
            name = job_health.name
            add(
                "fencedjobs_last_success_timestamp_seconds",
                [name],
                _timestamp(job_health.last_success_at),
            )
            add(
                "fencedjobs_deadline_timestamp_seconds",
                [name],
                _timestamp(job_health.expected_by),
            )
            add("fencedjobs_consecutive_failures", [name], job_health.consecutive_failures)
            for state in health.State:
                add("fencedjobs_state", [name, state.value], float(state is job_health.state))
            finished = job_health.last_finished_run
            if finished is not None:
                # JobRun.duration: none for a run that never started or was abandoned.
                add("fencedjobs_last_run_duration_seconds", [name], finished.duration)
            job = job_health.job
            if job is not None and job.schedule is not None:
                add(
                    "fencedjobs_expected_interval_seconds",
                    [name],
                    job.schedule.min_interval().total_seconds(),
                )
                add("fencedjobs_timeout_seconds", [name], job.run_timeout.total_seconds())
                add("fencedjobs_grace_seconds", [name], job.grace.total_seconds())
                add("fencedjobs_failure_threshold", [name], job.failure_threshold)

        counts = {
            (row["job"], row["outcome"]): row["n"]
            for row in JobRun.objects.using(lease_db())
            .values("job", "outcome")
            .annotate(n=Count("pk"))
            .order_by()
        }
        # Every outcome of every job, zeros included, so that a rule can compare them
        # before the first failure; then runs of jobs no longer known at all.
        keys = {(h.name, outcome.value) for h in healths for outcome in Outcome} | set(counts)
        for job_name, outcome in sorted(keys):
            add("fencedjobs_runs", [job_name, outcome], counts.get((job_name, outcome), 0))

        yield from families.values()


_registry = CollectorRegistry(auto_describe=False)
_registry.register(FencedJobsCollector())


@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """The metrics in Prometheus' text format (or OpenMetrics, if the scraper asks).

    With ``FENCEDJOBS["METRICS_TOKEN"]`` set, only a request with
    ``Authorization: Bearer <token>`` gets them; any other gets 401.
    """
    token = get_settings().METRICS_TOKEN
    if token:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            response = HttpResponse(
                "401 Unauthorized: send FENCEDJOBS['METRICS_TOKEN'] as a bearer token\n",
                status=401,
                content_type="text/plain",
            )
            response["WWW-Authenticate"] = 'Bearer realm="fencedjobs metrics"'
            return response
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encoder(_registry), content_type=content_type)
