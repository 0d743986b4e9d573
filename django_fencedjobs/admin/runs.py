"""The run history: every run, read-only, filterable, fast over millions of rows.

Sorting is offered only where an index serves it, nothing counts the whole table (see
:class:`~django_fencedjobs.admin.paginator.EstimatedCountPaginator`), and the job filter's
choices come from the jobs table. Times are written in each run's job's zone, to the second.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.filters import DateFieldListFilter
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from django_fencedjobs import health, lease
from django_fencedjobs.admin.display import badge, instant, job_zone
from django_fencedjobs.admin.paginator import EstimatedCountPaginator
from django_fencedjobs.models import JobLease, JobRun, Outcome
from django_fencedjobs.registry import registry


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


if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[JobRun]
else:  # not subscriptable at run time
    _ModelAdmin = admin.ModelAdmin


@admin.register(JobRun)
class JobRunAdmin(_ModelAdmin):
    list_display = (
        "slot",
        "job",
        "outcome_badge",
        "started",
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
    sortable_by = ("slot",)
    # No COUNT(*) of the whole table per page, nor per filter choice ("Show counts").
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    paginator = EstimatedCountPaginator
    list_per_page = 100
    fields = (
        ("job", "slot"),
        ("outcome", "capped"),
        ("started", "finished", "duration_text"),
        ("items", "batches", "missed_slots"),
        ("fence", "owner"),
        ("watermark_before", "watermark_after"),
        "error_text",
    )
    readonly_fields = ("slot", "started", "finished", "duration_text", "error_text")

    class Media:
        css = {"all": ("fencedjobs/admin.css",)}

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # history; retention deletes old runs (django_fencedjobs.retention)

    @admin.display(description=_("scheduled for"), ordering="scheduled_for")
    def slot(self, run: JobRun) -> SafeString | str:
        return instant(run.scheduled_for, job_zone(run.job))

    @admin.display(description=_("started"))
    def started(self, run: JobRun) -> SafeString | str:
        return instant(run.started_at, job_zone(run.job))

    @admin.display(description=_("finished"))
    def finished(self, run: JobRun) -> SafeString | str:
        return instant(run.finished_at, job_zone(run.job))

    @admin.display(description=_("outcome"), ordering="outcome")
    def outcome_badge(self, run: JobRun) -> SafeString:
        label = Outcome(run.outcome).label + (" (capped)" if run.capped else "")
        return badge(run.outcome, label)

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
