"""The admin: every job with its health, each job's recent runs, the run history, and the
three things an operator may do (run now, pause, resume).

Nothing here is editable: the lease rows are written only through
:mod:`django_fencedjobs.lease` (saving a stale copy of a row through a form could move its
fence backwards), and runs are history (deleted only by retention). The Django *change*
permission on jobs is what allows "run now", "pause" and "resume"; a user with only the
*view* permission sees everything and can trigger nothing. Each action is recorded in the
admin log. States and reasons come from :mod:`django_fencedjobs.health`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.filters import DateFieldListFilter
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Case, IntegerField, QuerySet, Value, When
from django.db.models.expressions import Combinable, OrderBy
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from django_fencedjobs import baseline, clock, health, lease
from django_fencedjobs.health import JobHealth, Severity, State
from django_fencedjobs.models import JobLease, JobRun, Outcome, Watermark
from django_fencedjobs.registry import registry

#: Runs drawn in a job's timeline.
TIMELINE_RUNS = 60
#: Fire times listed on a job's page.
NEXT_FIRE_TIMES = 10

OUTCOME_COLOURS = {
    Outcome.SUCCEEDED: "#2e7d32",
    Outcome.RUNNING: "#1565c0",
    Outcome.FAILED: "#c62828",
    Outcome.TIMED_OUT: "#ef6c00",
    Outcome.FENCE_LOST: "#6a1b9a",
    Outcome.MISSED: "#9e9e9e",
    Outcome.ABANDONED: "#795548",
    Outcome.INTERRUPTED: "#f9a825",
}


# -- health, computed once per admin request -------------------------------------------------


@dataclass
class _HealthScope:
    #: Compact times (no date when it is today): the list; full ones on a job's page.
    short: bool = False
    #: The one clock reading of the request (None: read the clock when first needed).
    now: datetime | None = None
    by_name: dict[str, JobHealth] | None = None

    def get(self) -> dict[str, JobHealth]:
        if self.by_name is None:
            self.by_name = {h.name: h for h in health.all_health(now=self.now)}
        return self.by_name


_scope: ContextVar[_HealthScope | None] = ContextVar("fencedjobs_admin_health", default=None)


@contextmanager
def _health_scope(*, short: bool = False, now: datetime | None = None) -> Iterator[None]:
    """For one admin view: every column, filter and the ordering share one health reading
    (a constant number of queries, one clock reading), however many rows are shown."""
    token = _scope.set(_HealthScope(short=short, now=now))
    try:
        yield
    finally:
        _scope.reset(token)


def _healths() -> dict[str, JobHealth]:
    scope = _scope.get()
    return (scope or _HealthScope()).get()


def _health_of(row: JobLease) -> JobHealth | None:
    return _healths().get(row.name)


def _short() -> bool:
    scope = _scope.get()
    return scope is not None and scope.short


def _rendered(response: HttpResponse) -> HttpResponse:
    # Columns are computed while the template renders: render inside the health scope.
    if isinstance(response, TemplateResponse):
        response.render()
    return response


def _badge(state: str, label: str, title: str = "") -> SafeString:
    return format_html('<span class="fj-badge fj-{}" title="{}">{}</span>', state, title, label)


def _local_and_utc(
    value: datetime | None, h: JobHealth, *, short: bool = False
) -> SafeString | str:
    """Local time in the job's zone, and UTC below it; ``short``: no date when it is today."""
    if value is None:
        return "-"
    utc = value.astimezone(UTC)
    return format_html(
        '<span class="fj-when">{}</span><br><span class="fj-utc">{} UTC</span>',
        h.local(value, short=short),
        f"{utc:%H:%M:%S}"
        if short and utc.date() == h.checked_at.date()
        else f"{utc:%Y-%m-%d %H:%M:%S}",
    )


# -- jobs ------------------------------------------------------------------------------------


class StateFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(state.value, state.value.replace("_", " ")) for state in State]

    def queryset(self, request: HttpRequest, queryset: QuerySet[JobLease]) -> QuerySet[JobLease]:
        if not self.value():
            return queryset
        names = [name for name, h in _healths().items() if h.state == self.value()]
        return queryset.filter(name__in=names)


@admin.register(JobLease)
class JobLeaseAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "state",
        "reason",
        "schedule",
        "next_run",
        "last_success",
        "last_outcome",
        "failures",
        "lease_held",
    )
    list_display_links = ("name",)
    list_filter = (StateFilter, "paused")
    show_full_result_count = False  # one row per job: the filtered count is all it needs
    search_fields = ("name",)
    actions = ("run_now", "pause", "resume")
    fieldsets = (
        (None, {"fields": ("name", "state", "reason", "schedule")}),
        (
            _("Timing"),
            {"fields": ("next_run", "expected_by", "last_success", "next_fire_times")},
        ),
        (_("Recent runs"), {"fields": ("timeline", "last_outcome", "consecutive_failures")}),
        (_("Lease"), {"fields": ("paused", "holder", "fence", "lease_expiry", "created_at")}),
        (_("Progress"), {"fields": ("watermarks",)}),
    )
    readonly_fields = (
        "state",
        "reason",
        "schedule",
        "next_run",
        "expected_by",
        "last_success",
        "next_fire_times",
        "timeline",
        "last_outcome",
        "holder",
        "lease_expiry",
        "watermarks",
    )

    class Media:
        css = {"all": ("fencedjobs/admin.css",)}

    # -- permissions: read-only rows; the change permission allows the operations ------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        # A job's row is created when its code is first seen live: by `migrate`, a runner,
        # `checkjobs`, or these pages (_record_first_sightings).
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # never edited through a form; see has_operate_permission

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Deleting the row would restart the job's fence at zero: a stale holder's old fence
        # could become current again.
        return False

    def has_operate_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Run now, pause, resume: the Django change permission on jobs."""
        opts = self.opts
        return request.user.has_perm(f"{opts.app_label}.{get_permission_codename('change', opts)}")

    # -- one health reading per request ------------------------------------------------------

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        now = self._record_first_sightings(request)
        with _health_scope(short=True, now=now):
            return _rendered(super().changelist_view(request, extra_context))

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        # A POST is refused by Django itself: has_change_permission() is False.
        context = {**(extra_context or {}), "can_operate": self.has_operate_permission(request)}
        now = self._record_first_sightings(request)
        with _health_scope(now=now):
            return _rendered(super().change_view(request, object_id, form_url, context))

    def _record_first_sightings(self, request: HttpRequest) -> datetime:
        """A declared job these pages see for the first time gets its lease row now: the
        baseline from which, never having run, it becomes late. Returns the clock reading.

        A database user that may not write still sees what is there, and is told which
        jobs are missing from the list."""
        now = clock.now()
        sightings = baseline.record_first_sightings(now)
        if sightings.refused:
            self.message_user(
                request,
                f"Could not record {', '.join(sightings.refused)}, declared in code but not "
                f"yet seen by `migrate`, a runner or `checkjobs` ({sightings.error}): not "
                "listed, and not alerted on, until one of them records it.",
                messages.WARNING,
            )
        return now

    def get_ordering(self, request: HttpRequest) -> list[str | Combinable]:
        """Late, failing and invalid jobs first, then warnings, then the rest; by name."""
        if _scope.get() is None:
            return ["name"]
        by_severity: dict[Severity, list[str]] = {severity: [] for severity in Severity}
        for name, h in _healths().items():
            by_severity[h.severity].append(name)
        rank = Case(
            When(name__in=by_severity[Severity.CRITICAL], then=Value(0)),
            When(name__in=by_severity[Severity.WARNING], then=Value(1)),
            default=Value(2),
            output_field=IntegerField(),
        )
        return [OrderBy(rank), "name"]

    # -- columns -----------------------------------------------------------------------------

    @admin.display(description=_("state"))
    def state(self, row: JobLease) -> SafeString | str:
        h = _health_of(row)
        if h is None:
            return "-"
        return _badge(h.state.value, h.state.value.replace("_", " "), h.reason)

    @admin.display(description=_("reason"))
    def reason(self, row: JobLease) -> str:
        h = _health_of(row)
        return h.reason if h else "-"

    @admin.display(description=_("schedule"))
    def schedule(self, row: JobLease) -> str:
        h = _health_of(row)
        return (h.schedule or "not declared in code") if h else "-"

    @admin.display(description=_("next run"), ordering="next_run_at")
    def next_run(self, row: JobLease) -> SafeString | str:
        h = _health_of(row)
        if h is None:
            return "-"
        if h.state is State.REMOVED:
            return "never (not declared)"
        if row.paused:
            return format_html("paused<br>{}", _local_and_utc(row.next_run_at, h, short=_short()))
        if h.next_run_at is not None and h.next_run_at <= h.checked_at:
            return format_html("due now<br>{}", _local_and_utc(h.next_run_at, h, short=_short()))
        return _local_and_utc(h.next_run_at, h, short=_short())

    @admin.display(description=_("expected by"))
    def expected_by(self, row: JobLease) -> SafeString | str:
        h = _health_of(row)
        return _local_and_utc(h.expected_by, h) if h and h.expected_by else "-"

    @admin.display(description=_("last success"), ordering="last_success_at")
    def last_success(self, row: JobLease) -> SafeString | str:
        h = _health_of(row)
        if h is None or row.last_success_at is None:
            return "never"
        return _local_and_utc(row.last_success_at, h, short=_short())

    @admin.display(description=_("last run"))
    def last_outcome(self, row: JobLease) -> SafeString | str:
        h = _health_of(row)
        if h is None or h.last_run is None:
            return "-"
        run = h.last_run
        when = run.finished_at or run.started_at or run.scheduled_for
        label = Outcome(run.outcome).label + (" (capped)" if run.capped else "")
        return format_html(
            '{} <span class="fj-utc">{}</span>',
            _badge(run.outcome, label, run.error_excerpt),
            h.local(when, short=_short()),
        )

    @admin.display(description=_("failures"), ordering="consecutive_failures")
    def failures(self, row: JobLease) -> int:
        return row.consecutive_failures

    @admin.display(description=_("lease"))
    def lease_held(self, row: JobLease) -> SafeString | str:
        """While a run holds it: owner, fence and expiry, in one column."""
        h = _health_of(row)
        if h is None or not h.running or h.lease_until is None:
            return "-"
        return format_html(
            "{} (fence {})<br>until {}",
            h.owner,
            h.fence,
            _local_and_utc(h.lease_until, h, short=True),
        )

    @admin.display(description=_("held by"))
    def holder(self, row: JobLease) -> str:
        h = _health_of(row)
        if h is None or not h.running:
            return "-"
        return f"{h.owner} (fence {h.fence})"

    @admin.display(description=_("lease expires"))
    def lease_expiry(self, row: JobLease) -> SafeString | str:
        h = _health_of(row)
        if h is None or h.lease_until is None:
            return "-"
        return _local_and_utc(h.lease_until, h, short=_short())

    # -- the job's page ----------------------------------------------------------------------

    @admin.display(description=_("next fire times"))
    def next_fire_times(self, row: JobLease) -> SafeString | str:
        h = _health_of(row)
        job = h.job if h else None
        if h is None or job is None or job.schedule is None:
            return "-"
        times: list[datetime] = []
        when = h.checked_at
        for _i in range(NEXT_FIRE_TIMES):
            when = job.schedule.next_after(when)
            times.append(when)
        items = format_html_join(
            "",
            '<li>{} <span class="fj-utc">= {} UTC</span></li>',
            ((h.local(t), f"{t:%Y-%m-%d %H:%M:%S}") for t in times),
        )
        return format_html('<ol class="fj-fire-times">{}</ol>', items)

    @admin.display(description=_("timeline"))
    def timeline(self, row: JobLease) -> SafeString:
        h = _health_of(row)
        runs = list(
            JobRun.objects.using(lease.lease_db())
            .filter(job=row.name)
            .order_by("-scheduled_for")[:TIMELINE_RUNS]
        )
        runs.reverse()
        now = h.checked_at if h else clock.now()
        context = {
            **_timeline(runs, now, (lambda value: h.local(value)) if h else str),
            "job": row.name,
            "runs_url": reverse(f"{self.admin_site.name}:fencedjobs_jobrun_changelist")
            + "?"
            + urlencode({"job": row.name}),
        }
        return SafeString(render_to_string("admin/fencedjobs/joblease/timeline.html", context))

    @admin.display(description=_("watermarks"))
    def watermarks(self, row: JobLease) -> SafeString | str:
        marks = list(Watermark.objects.using(lease.lease_db()).filter(job=row.name).order_by("key"))
        if not marks:
            return "none (this job keeps no watermark)"
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (m.key or "(default)", m.value, m.fence, f"{m.updated_at:%Y-%m-%d %H:%M:%S} UTC")
                for m in marks
            ),
        )
        return format_html(
            '<table class="fj-watermarks"><thead><tr><th>key</th><th>position</th>'
            "<th>fence of last writer</th><th>updated</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )

    # -- operations --------------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        opts = self.opts
        return [
            path(
                "<path:object_id>/operate/<str:operation>/",
                self.admin_site.admin_view(self.operate_view),
                name=f"{opts.app_label}_{opts.model_name}_operate",
            ),
            *super().get_urls(),
        ]

    def operate_view(self, request: HttpRequest, object_id: str, operation: str) -> HttpResponse:
        """The buttons on a job's page: POST only, change permission required."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if operation not in _OPERATIONS:
            raise Http404(f"no operation {operation!r}")
        obj = self.get_object(request, object_id)
        if obj is None:
            raise Http404(f"no job with id {object_id!r}")
        if not self.has_operate_permission(request, obj):
            raise PermissionDenied
        _OPERATIONS[operation](self, request, [obj])
        return HttpResponseRedirect(
            reverse(f"{self.admin_site.name}:fencedjobs_joblease_change", args=[obj.pk])
        )

    @admin.action(
        description=_("Run now (it still goes through the lease)"), permissions=["operate"]
    )
    def run_now(self, request: HttpRequest, queryset: Iterable[JobLease]) -> None:
        now = clock.now()
        done, skipped = [], []
        for row in queryset:
            if row.name not in registry:
                skipped.append(f"{row.name} (not declared in code)")
            elif lease.make_due(row.name, now):
                self.log_change(request, row, f"Run now: made due at {now:%Y-%m-%d %H:%M:%S} UTC.")
                done.append(row.name)
            else:
                skipped.append(f"{row.name} (already due)")
        self._report(request, "will run at the next tick", done, skipped)

    @admin.action(description=_("Pause"), permissions=["operate"])
    def pause(self, request: HttpRequest, queryset: Iterable[JobLease]) -> None:
        self._set_paused(request, queryset, paused=True)

    @admin.action(description=_("Resume"), permissions=["operate"])
    def resume(self, request: HttpRequest, queryset: Iterable[JobLease]) -> None:
        self._set_paused(request, queryset, paused=False)

    def _set_paused(
        self, request: HttpRequest, queryset: Iterable[JobLease], *, paused: bool
    ) -> None:
        done, skipped = [], []
        for row in queryset:
            if row.paused == paused:
                skipped.append(f"{row.name} (already {'paused' if paused else 'running'})")
            elif lease.set_paused(row.name, paused):
                self.log_change(request, row, "Paused." if paused else "Resumed.")
                done.append(row.name)
        self._report(request, "paused" if paused else "resumed", done, skipped)

    def _report(self, request: HttpRequest, what: str, done: list[str], skipped: list[str]) -> None:
        if done:
            self.message_user(request, f"{', '.join(done)}: {what}.", messages.SUCCESS)
        if skipped:
            self.message_user(request, f"Nothing to do for {', '.join(skipped)}.", messages.WARNING)


_OPERATIONS = {
    "run-now": JobLeaseAdmin.run_now,
    "pause": JobLeaseAdmin.pause,
    "resume": JobLeaseAdmin.resume,
}


def _timeline(runs: list[JobRun], now: datetime, local: Any) -> dict[str, Any]:
    """Bars for the SVG timeline: one per run, height = duration, colour = outcome."""
    height, bar, gap = 60, 8, 2
    durations = [_seconds(run, now) for run in runs]
    longest = max(durations, default=0.0) or 1.0
    bars = []
    for index, (run, seconds) in enumerate(zip(runs, durations, strict=True)):
        h = max(2, round(height * seconds / longest))
        bars.append(
            {
                "x": index * (bar + gap),
                "y": height - h,
                "width": bar,
                "height": h,
                "colour": OUTCOME_COLOURS.get(Outcome(run.outcome), "#000"),
                "outcome": run.outcome,
                "title": (
                    f"{local(run.scheduled_for)}: {Outcome(run.outcome).label}, "
                    f"{seconds:.1f}s, {run.items} items"
                    + (", capped" if run.capped else "")
                    + (f", {run.missed_slots} missed slot(s) coalesced" if run.missed_slots else "")
                ),
                "pk": run.pk,
            }
        )
    outcomes = sorted({run.outcome for run in runs})
    return {
        "bars": bars,
        "svg_width": max(len(runs) * (bar + gap), bar),
        "svg_height": height,
        "longest": f"{longest:.1f}s" if runs else "",
        "legend": [(o, Outcome(o).label) for o in outcomes],
        "count": len(runs),
    }


def _seconds(run: JobRun, now: datetime) -> float:
    if run.started_at is None:
        return 0.0
    return max(((run.finished_at or now) - run.started_at).total_seconds(), 0.0)


# -- runs ------------------------------------------------------------------------------------


class EstimatedCountPaginator(Paginator):
    """A paginator that never counts a large table in full when nothing filters it.

    For the unfiltered list on PostgreSQL it asks the planner's estimate first
    (``pg_class.reltuples``, kept current by autovacuum): at or past :attr:`exact_below`
    rows that is the count, and the page count is approximate (the last page may be empty
    or a few rows short). Otherwise it counts at most :attr:`exact_below` rows (a bounded
    ``COUNT`` over a ``LIMIT``ed subquery: cheap whatever the table's size); below that
    the count is exact. A filtered list (or another database) past that bound is counted
    exactly; the indexes on ``(job, -scheduled_for)`` and ``(outcome, -scheduled_for)``
    serve those.
    """

    exact_below = 10_000

    @cached_property
    def count(self) -> int:
        rows = self.object_list
        if not isinstance(rows, QuerySet):
            return super().count
        unfiltered = not rows.query.where and not rows.query.distinct
        estimate = _pg_estimate(rows) if unfiltered else None
        if estimate is not None and estimate >= self.exact_below:
            return estimate
        bounded = rows.order_by()[: self.exact_below].count()
        if bounded < self.exact_below:
            return bounded
        if estimate is not None:  # a stale estimate (not analysed since a bulk load)
            return max(estimate, bounded)
        return rows.count()


def _pg_estimate(rows: QuerySet[Any]) -> int | None:
    connection = connections[rows.db]
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)",
            [rows.model._meta.db_table],
        )
        found = cursor.fetchone()
    if found is None or found[0] is None or found[0] < 0:  # -1: never analysed
        return None
    return int(found[0])


class JobNameFilter(admin.SimpleListFilter):
    """Job names from the lease rows (one per job) and the registry, never a
    ``SELECT DISTINCT`` over the runs."""

    title = _("job")
    parameter_name = "job"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        recorded = JobLease.objects.using(lease.lease_db()).values_list("name", flat=True)
        names = sorted({*recorded, *registry.names()})
        return [(name, name) for name in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet[JobRun]) -> QuerySet[JobRun]:
        return queryset.filter(job=self.value()) if self.value() else queryset


@admin.register(JobRun)
class JobRunAdmin(admin.ModelAdmin):
    list_display = (
        "scheduled_for",
        "job",
        "outcome_badge",
        "started_at",
        "duration_text",
        "items",
        "batches",
        "missed_slots",
        "fence",
        "owner",
        "error_excerpt",
    )
    list_filter = (JobNameFilter, "outcome", ("scheduled_for", DateFieldListFilter), "capped")
    # Sorting is offered only where an index serves it: a million rows stay fast.
    sortable_by = ("scheduled_for",)
    # No COUNT(*) of the whole table per page, nor per filter choice ("Show counts").
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    paginator = EstimatedCountPaginator
    list_per_page = 100
    fields = (
        ("job", "scheduled_for"),
        ("outcome", "capped"),
        ("started_at", "finished_at", "duration_text"),
        ("items", "batches", "missed_slots"),
        ("fence", "owner"),
        ("watermark_before", "watermark_after"),
        "error_text",
    )
    readonly_fields = ("duration_text", "error_text")

    class Media:
        css = {"all": ("fencedjobs/admin.css",)}

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # history; retention deletes old runs (django_fencedjobs.retention)

    @admin.display(description=_("outcome"), ordering="outcome")
    def outcome_badge(self, run: JobRun) -> SafeString:
        label = Outcome(run.outcome).label + (" (capped)" if run.capped else "")
        return _badge(run.outcome, label)

    @admin.display(description=_("duration"))
    def duration_text(self, run: JobRun) -> str:
        seconds = run.duration
        return "-" if seconds is None else f"{seconds:.3f}s"

    @admin.display(description=_("error"))
    def error_excerpt(self, run: JobRun) -> str:
        return health.error_excerpt(run.error) or "-"

    @admin.display(description=_("error"))
    def error_text(self, run: JobRun) -> SafeString | str:
        return format_html('<pre class="fj-error">{}</pre>', run.error) if run.error else "-"
