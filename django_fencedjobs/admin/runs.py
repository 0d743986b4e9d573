"""The run history: every run, read-only, filterable, fast over millions of rows.

Sorting is offered only where an index serves it, nothing counts the whole table (see
:class:`~django_fencedjobs.admin.paginator.EstimatedCountPaginator`), and the job filter's
choices come from the jobs table. Times are written in each run's job's zone, to the second.

The ``django.tasks`` tasks a run enqueued (:class:`~django_fencedjobs.models.RunTask`) are
shown with it: counted by status in the list (one query per page, for the page's runs),
one by one on the run's page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.filters import DateFieldListFilter
from django.contrib.admin.views.main import ChangeList
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from django_fencedjobs import health, lease
from django_fencedjobs.admin.display import badge, instant, job_zone
from django_fencedjobs.admin.paginator import EstimatedCountPaginator
from django_fencedjobs.models import JobLease, JobRun, Outcome, RunTask, TaskStatus
from django_fencedjobs.registry import registry

#: The tasks listed on a run's page; past them, how many more there are.
TASKS_SHOWN = 200
#: A task's status badge, in the colours of the run outcomes it resembles.
TASK_BADGE: dict[str, str] = {
    TaskStatus.PENDING: "missed",
    TaskStatus.READY: "never_run",
    TaskStatus.RUNNING: "running",
    TaskStatus.SUCCESSFUL: "succeeded",
    TaskStatus.FAILED: "failed",
}
#: A task's status in the list's summary ("3 tasks: 2 ok, 1 failed"), in this order.
TASK_SUMMARY = (
    (TaskStatus.SUCCESSFUL, _("ok")),
    (TaskStatus.FAILED, _("failed")),
    (TaskStatus.RUNNING, _("running")),
    (TaskStatus.READY, _("enqueued")),
    (TaskStatus.PENDING, _("not dispatched")),
)


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


class RunChangeList(ChangeList):
    """The run list, with the tasks of the page's runs counted by status in one query
    (none for a page without runs): ``run.task_counts``, ``{status: count}``."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        runs = list(self.result_list)  # evaluates the page once; the template reuses it
        counts: dict[int, dict[str, int]] = {}
        if runs:
            rows = (
                RunTask.objects.using(lease.lease_db())
                .filter(run_id__in=[run.pk for run in runs])
                .order_by()
                .values_list("run_id", "status")
                .annotate(count=Count("pk"))
            )
            for run_id, status, count in rows:
                counts.setdefault(run_id, {})[status] = count
        for run in runs:
            run.task_counts = counts.get(run.pk, {})


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
        "tasks_summary",
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
        "tasks_table",
    )
    readonly_fields = (
        "slot",
        "started",
        "finished",
        "duration_text",
        "error_text",
        "tasks_table",
    )

    class Media:
        css = {"all": ("fencedjobs/admin.css",)}

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return RunChangeList

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

    @admin.display(description=_("tasks"))
    def tasks_summary(self, run: JobRun) -> str:
        """``3 tasks: 2 ok, 1 failed``; ``-`` for a run that enqueued none."""
        counts: dict[str, int] = getattr(run, "task_counts", {})
        total = sum(counts.values())
        if not total:
            return "-"
        parts = [f"{counts[status]} {label}" for status, label in TASK_SUMMARY if status in counts]
        return f"{total} task{'s' if total != 1 else ''}: {', '.join(parts)}"

    @admin.display(description=_("tasks"))
    def tasks_table(self, run: JobRun) -> SafeString | str:
        """The tasks the run enqueued, in order (the first :data:`TASKS_SHOWN`), read-only."""
        alias = lease.lease_db()
        tasks = list(RunTask.objects.using(alias).filter(run_id=run.pk)[: TASKS_SHOWN + 1])
        if not tasks:
            return "-"
        tz = job_zone(run.job)
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
            '<td title="{}">{}</td></tr>',
            (
                (
                    task.task_path,
                    task.backend,
                    task.result_id or "-",
                    badge(TASK_BADGE.get(task.status, ""), str(TaskStatus(task.status).label)),
                    instant(task.enqueued_at, tz),
                    instant(task.started_at, tz),
                    instant(task.finished_at, tz),
                    task.error,
                    health.error_excerpt(task.error) or "-",
                )
                for task in tasks[:TASKS_SHOWN]
            ),
        )
        more = ""
        if len(tasks) > TASKS_SHOWN:
            hidden = RunTask.objects.using(alias).filter(run_id=run.pk).count() - TASKS_SHOWN
            more = format_html('<p class="fj-more">… and {} more</p>', hidden)
        head = format_html_join(
            "",
            "<th>{}</th>",
            (
                (label,)
                for label in (
                    _("task"),
                    _("backend"),
                    _("result id"),
                    _("status"),
                    _("enqueued"),
                    _("started"),
                    _("finished"),
                    _("error"),
                )
            ),
        )
        return format_html(
            '<table class="fj-tasks"><thead><tr>{}</tr></thead><tbody>{}</tbody></table>{}',
            head,
            rows,
            more,
        )
