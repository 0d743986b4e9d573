"""Prometheus metrics: every job's state, read from the database at each scrape.

Mount :func:`metrics_view`, register :class:`FencedJobsCollector` with your own registry,
or serve them from the runner (``runjobs --metrics``, :func:`serve`), which alone knows
``fencedjobs_runner_abandoned_handlers``. The figures come from
:func:`~django_fencedjobs.health.all_health` and one ``GROUP BY`` over the runs: the same in
every process, at a constant number of queries. The job is in a ``job_name`` label
(Prometheus renames a scraped ``job``). A job's instances are counted per job (a series
each only with ``instance_series="each"``). The view answers anyone unless
``METRICS_TOKEN`` is set. See docs/metrics.md.
"""

from __future__ import annotations

import hmac
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from django.db import connections
from django.db.models import Case, CharField, Count, F, Q, Value, When
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_safe

from django_fencedjobs import clock, health, instances, loop, runners
from django_fencedjobs.conf import get_settings
from django_fencedjobs.db import lease_db
from django_fencedjobs.models import JobLease, JobRun, Outcome
from django_fencedjobs.registry import registry

try:
    from prometheus_client.core import CollectorRegistry, GaugeMetricFamily, Metric
    from prometheus_client.exposition import choose_encoder
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "django_fencedjobs.integrations.prometheus needs prometheus-client: "
        'pip install "django-fencedjobs[prometheus]"'
    ) from exc

__all__ = ["METRICS", "FencedJobsCollector", "metrics_view", "serve"]

logger = logging.getLogger("django_fencedjobs")

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
    "fencedjobs_consecutive_failures": "Runs that failed or timed out in a row; 0 after a success.",
    "fencedjobs_failure_threshold": "Consecutive failures at which the job is failing.",
    "fencedjobs_failure_rate": (
        "Failed (or timed out) runs among the job's latest FAILURE_RATE_RUNS runs that ran "
        "to an end within FAILURE_RATE_PERIOD; absent without any."
    ),
    "fencedjobs_severity": (
        "The severity of the job's state: 0 healthy, 1 warning, 2 critical (what checkjobs "
        "exits 2 on)."
    ),
    "fencedjobs_state": (
        "1 for the job's current state, 0 for the others "
        "(ok, running, late, failing, never_run, paused, no_runner, capped, removed, invalid)."
    ),
    "fencedjobs_runs": (
        "Recorded runs by outcome, as retained: a gauge, not a counter, because run "
        "retention deletes old runs and the figure then goes down. For a job with "
        "instances, the runs of all its instances (each instance's own with "
        'instance_series="each").'
    ),
    "fencedjobs_instances": (
        "The instances of a job declared with instances=True, counted by state "
        "(ok, disabled, late, failing, no_runner, invalid, capped); ok counts the "
        "running and not yet run ones too."
    ),
    "fencedjobs_instances_critical": (
        "Instances of the job in a critical state (late, failing at its threshold or "
        "rate, no_runner, invalid): what checkjobs exits 2 on."
    ),
    "fencedjobs_runners_live": (
        "Runner loops (runjobs) seen within RUNNER_TIMEOUT: their last beat is younger. "
        "Jobs that no live runner serves are in state no_runner."
    ),
    "fencedjobs_runner_abandoned_handlers": (
        "Handlers this runner process gave up on (they did not return at their timeout plus "
        "the grace) whose threads are still running; at MAX_ABANDONED_HANDLERS the runner "
        "exits. Only from a process that runs jobs."
    ),
}

#: Each metric's labels, when not the job's alone.
_LABELS = {
    "fencedjobs_state": [JOB_LABEL, "state"],
    "fencedjobs_runs": [JOB_LABEL, "outcome"],
    "fencedjobs_instances": [JOB_LABEL, "state"],
    "fencedjobs_runner_abandoned_handlers": ["owner"],  # the runner's, as on its runs
    "fencedjobs_runners_live": [],
}


#: ``fencedjobs_severity``: 0 healthy, 1 warning, 2 critical.
SEVERITY_VALUE = {severity: 2.0 - severity.rank for severity in health.Severity}

#: The states ``fencedjobs_instances`` counts, every one present (0 when none is in it),
#: so that the series of a job with instances are the same set at every scrape.
INSTANCE_STATES = (
    "ok",
    "disabled",
    health.State.LATE.value,
    health.State.FAILING.value,
    health.State.NO_RUNNER.value,
    health.State.INVALID.value,
    health.State.CAPPED.value,
    health.State.PAUSED.value,
    health.UNJUDGED,
)

#: How many instances one health read judges by name (``instance_series="each"``): their
#: names and runs' ids are parameters of one statement (SQLite takes at most 32,766).
EACH_CHUNK = 5_000

_Add = Callable[[str, Iterable[str], "float | None"], None]


def _timestamp(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


class FencedJobsCollector:
    """A Prometheus collector of every job's figures, read when collected."""

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The metric families without samples, so that registering the collector does
        not query the database (``CollectorRegistry.register`` calls this)."""
        for name, documentation in METRICS.items():
            yield GaugeMetricFamily(name, documentation, labels=_LABELS.get(name, [JOB_LABEL]))

    def collect(self) -> Iterator[Metric]:
        families = {family.name: family for family in self.describe()}

        def add(name: str, labels: Iterable[str], value: float | None) -> None:
            if value is not None:
                families[name].add_metric(list(labels), value)

        now = clock.now()
        # Every job declared in code, and only the instances that may not be ok.
        seen = runners.read(now)
        listed = health.all_health(now=now, coverage=seen)
        summaries = health.instance_summaries(listed, coverage=seen, now=now)
        parents = {summary.job: _instance_series(summary.job) for summary in summaries}
        each = sorted(parent for parent, series in parents.items() if series == "each")
        # A series per job: the jobs declared in code, and every instance of a job that
        # asked for a series each (judged by name: the listing holds only some of them).
        own = [h for h in listed if _parent_of(h, parents) is None]
        jobs = sorted(own + _health_of_instances(each, now, seen), key=lambda h: h.name)
        for job_health in jobs:
            _job_series(add, job_health)
        _instance_counts(add, summaries, listed, parents)

        aggregated = [parent for parent in parents if parent not in each]
        counts = _run_counts(aggregated)
        # Every outcome of every job, zeros included, so that a rule can compare them
        # before the first failure; then runs of jobs no longer known at all.
        named = [h.name for h in jobs] + aggregated
        keys = {(name, outcome.value) for name in named for outcome in Outcome} | set(counts)
        for job_name, outcome in sorted(keys):
            add("fencedjobs_runs", [job_name, outcome], counts.get((job_name, outcome), 0))

        add("fencedjobs_runners_live", [], len(seen.live()))

        # This process's own figure: none in a process that runs no job (a web process).
        abandoned = loop.abandoned_handlers()
        if abandoned is not None:
            add("fencedjobs_runner_abandoned_handlers", [get_settings().owner], abandoned)

        yield from families.values()


def _job_series(add: _Add, h: health.JobHealth) -> None:
    """The series of one job (declared in code, or an instance with a series each)."""
    name = h.name
    add("fencedjobs_last_success_timestamp_seconds", [name], _timestamp(h.last_success_at))
    add("fencedjobs_deadline_timestamp_seconds", [name], _timestamp(h.expected_by))
    add("fencedjobs_consecutive_failures", [name], h.consecutive_failures)
    add("fencedjobs_failure_rate", [name], h.failure_rate)
    add("fencedjobs_severity", [name], SEVERITY_VALUE[h.severity])
    for state in health.State:
        add("fencedjobs_state", [name, state.value], float(state is h.state))
    if h.last_finished_run is not None:  # no duration: never started, or abandoned
        add("fencedjobs_last_run_duration_seconds", [name], h.last_finished_run.duration)
    job = h.job
    if job is not None and (schedule := job.schedule) is not None:
        add("fencedjobs_expected_interval_seconds", [name], schedule.min_interval().total_seconds())
        add("fencedjobs_timeout_seconds", [name], job.run_timeout.total_seconds())
        add("fencedjobs_grace_seconds", [name], job.grace.total_seconds())
        add("fencedjobs_failure_threshold", [name], job.failure_threshold)


def _instance_series(parent: str) -> str:
    """What the job ``parent`` asked its instances to get (``aggregated`` for a job no
    longer declared: its instances are counted, never listed)."""
    job = registry.get(parent) if parent in registry else None
    return job.instance_series if job is not None and job.instances else "aggregated"


def _parent_of(job_health: health.JobHealth, parents: dict[str, str]) -> str | None:
    """The job whose instance ``job_health`` is (None for a job declared in code), also
    for an instance whose job is no longer declared (health knows no job for it)."""
    if job_health.job is not None:
        return job_health.job.parent
    parsed = instances.parse_name(job_health.name)
    return parsed[0] if parsed is not None and parsed[0] in parents else None


def _health_of_instances(
    parents: list[str], now: datetime, seen: runners.Coverage
) -> list[health.JobHealth]:
    """The health of every instance of ``parents``, judged by name, in chunks."""
    if not parents:
        return []
    names = list(
        JobLease.objects.using(lease_db())
        .filter(parent__in=parents, instance__isnull=False)
        .order_by("name")
        .values_list("name", flat=True)
    )
    found: list[health.JobHealth] = []
    for start in range(0, len(names), EACH_CHUNK):
        found += health.all_health(names[start : start + EACH_CHUNK], now=now, coverage=seen)
    return found


def _instance_counts(
    add: _Add,
    summaries: list[health.InstanceSummary],
    listed: list[health.JobHealth],
    parents: dict[str, str],
) -> None:
    """``fencedjobs_instances`` and ``fencedjobs_instances_critical`` per job with
    instances: the critical ones are among those listed, unless the summary counted them."""
    critical = Counter(
        _parent_of(h, parents) for h in listed if h.severity is health.Severity.CRITICAL
    )
    for summary in summaries:
        counts = {"ok": summary.ok, "disabled": summary.disabled, **summary.states}
        if summary.no_runner is not None:
            critical[summary.job] = summary.total - summary.disabled
        elif summary.counted is not None:
            critical[summary.job] = summary.counted_critical
        for state in INSTANCE_STATES:
            add("fencedjobs_instances", [summary.job, state], counts.get(state, 0))
        add("fencedjobs_instances_critical", [summary.job], critical.get(summary.job, 0))


def _run_counts(aggregated: Iterable[str]) -> dict[tuple[str, str], int]:
    """Runs per job and outcome (one ``GROUP BY``), the runs of the instances of the jobs
    in ``aggregated`` under the job's name: a row per job, not per instance."""
    # An instance's runs are named job[key]; a job may hold a bracket in its name, so the
    # longest job's prefix is tried first.
    folds = [
        When(Q(job__startswith=f"{parent}[") & Q(job__endswith="]"), then=Value(parent))
        for parent in sorted(aggregated, key=len, reverse=True)
    ]
    series = Case(*folds, default=F("job"), output_field=CharField()) if folds else F("job")
    rows = (
        JobRun.objects.using(lease_db())
        .annotate(series=series)
        .values("series", "outcome")
        .annotate(n=Count("pk"))
        .order_by()
    )
    return {(row["series"], row["outcome"]): row["n"] for row in rows}


_registry = CollectorRegistry(auto_describe=False)
_registry.register(FencedJobsCollector())


def _exposition(authorization: str, accept: str) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of a scrape: the metrics in Prometheus' text format (or
    OpenMetrics, if ``accept`` asks), or 401 when ``METRICS_TOKEN`` is set and
    ``authorization`` is not ``Bearer <token>``."""
    token = get_settings().METRICS_TOKEN
    if token and not hmac.compare_digest(authorization.encode(), f"Bearer {token}".encode()):
        return (
            401,
            {"Content-Type": "text/plain", "WWW-Authenticate": 'Bearer realm="fencedjobs metrics"'},
            b"401 Unauthorized: send FENCEDJOBS['METRICS_TOKEN'] as a bearer token\n",
        )
    encoder, content_type = choose_encoder(accept)
    return 200, {"Content-Type": content_type}, encoder(_registry)


@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """The metrics in Prometheus' text format (or OpenMetrics, if the scraper asks); with
    ``FENCEDJOBS["METRICS_TOKEN"]`` set, only to ``Authorization: Bearer <token>`` (else 401)."""
    status, headers, body = _exposition(
        request.headers.get("Authorization", ""), request.headers.get("Accept", "")
    )
    return HttpResponse(body, status=status, headers=headers)


class _ScrapeHandler(BaseHTTPRequestHandler):
    """A GET on any path: what :func:`metrics_view` answers."""

    def do_GET(self) -> None:
        try:
            status, headers, body = _exposition(
                self.headers.get("Authorization", ""), self.headers.get("Accept", "")
            )
        except Exception:
            logger.exception("serving the metrics failed", extra={"event": "metrics_failed"})
            status, headers, body = 500, {"Content-Type": "text/plain"}, b"500 metrics failed\n"
        finally:
            connections.close_all()  # this request thread's connections only
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Scrapes are not logged."""


def serve(host: str, port: int) -> ThreadingHTTPServer:
    """Serve the metrics on ``host:port`` (HTTP, any path; ``METRICS_TOKEN`` as for the
    view) from a daemon thread, for as long as this process lives: ``runjobs --metrics``.
    Raises ``OSError`` when the address cannot be bound."""
    server = ThreadingHTTPServer((host, port), _ScrapeHandler)
    threading.Thread(target=server.serve_forever, name="fencedjobs-metrics", daemon=True).start()
    return server
