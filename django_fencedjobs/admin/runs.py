"""The run history: every run, read-only, filterable, fast over millions of rows: sorting only
where an index serves it, no count of the whole table
(:class:`~django_fencedjobs.admin.paginator.EstimatedCountPaginator`), the job filter's
choices from the jobs table. Times are written in each run's job's zone, to the second. The
``django.tasks`` tasks a run enqueued are counted by status in the list (one query per
page), listed one by one on the run's page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.filters import DateFieldListFilter
from django.contrib.admin.utils import flatten_fieldsets
from django.contrib.admin.views.main import ChangeList
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from django_fencedjobs import db, text
from django_fencedjobs.admin.display import (
    ReadOnly,
    badge,
    breakable,
    instant,
    job_zone,
    owner_label,
    plural,
    shortened,
)
from django_fencedjobs.admin.paginator import EstimatedCountPaginator
from django_fencedjobs.models import JobLease, JobRun, Outcome, RunKind, RunTask, TaskStatus
from django_fencedjobs.registry import registry


class RunsPaginator(EstimatedCountPaginator):
    estimate_rows = staticmethod(db.estimated_rows)


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
    """Job names from the lease rows and the registry, never a ``SELECT DISTINCT`` over the
    runs. Instances (maybe 100,000) are not listed but the one chosen from its page."""

    title = _("job")
    parameter_name = "job"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        recorded = (
            JobLease.objects.using(db.lease_db())
            .filter(instance__isnull=True, kind=RunKind.SCHEDULED)
            .values_list("name", flat=True)
        )
        value = self.value()
        chosen = [value] if value else []
        names = sorted({*recorded, *registry.names(), *chosen})
        return [(name, name) for name in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet[JobRun]) -> QuerySet[JobRun]:
        return queryset.filter(job=self.value()) if self.value() else queryset


class RunChangeList(ChangeList):
    """The list, the tasks of its runs counted by status in one query: ``run.task_counts``."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        runs = list(self.result_list)  # evaluates the page once; the template reuses it
        counts: dict[int, dict[str, int]] = {}
        if runs:
            rows = (
                RunTask.objects.using(db.lease_db())
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
class JobRunAdmin(ReadOnly, _ModelAdmin):  # history; retention deletes old runs
    # Fits a 1366-px laptop with Django's navigation sidebar open: two facts to a column.
    list_display = (
        "slot",
        "job_name",
        "outcome_badge",
        "kind_attempt",
        "started",
        "duration_text",
        "owner_fence",
        "error_excerpt",
        "tasks_summary",
    )
    list_filter = (
        JobNameFilter,
        "outcome",
        "kind",
        ("scheduled_for", DateFieldListFilter),
        "capped",
    )
    # Sorting is offered only where an index serves it: a million rows stay fast.
    sortable_by = ("slot",)
    # No COUNT(*) of the whole table per page, nor per filter choice ("Show counts").
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    paginator = RunsPaginator
    list_per_page = 100
    fields = (
        ("job", "slot"),
        ("kind", "attempt"),
        ("outcome", "capped_text"),
        ("started_at_text", "finished", "duration_text"),
        ("items", "batches", "missed_slots"),
        ("fence", "owner"),
        ("watermark_before", "watermark_after"),
        "error_text",
        "tasks_table",
    )
    readonly_fields = flatten_fieldsets([(None, {"fields": fields})])

    class Media:
        css = {"all": ("fencedjobs/admin.css",)}

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return RunChangeList

    @admin.display(description=_("scheduled for"), ordering="scheduled_for")
    def slot(self, run: JobRun) -> SafeString | str:
        """The run's slot; in the list, with the earlier slots it caught up on below it."""
        when = instant(run.scheduled_for, job_zone(run.job))
        if not run.missed_slots:
            return when
        caught_up = plural(run.missed_slots, "earlier slot")
        return format_html('{}<span class="fj-sub">caught up {}</span>', when, caught_up)

    @admin.display(description=_("kind"))
    def kind_attempt(self, run: JobRun) -> SafeString:
        """Why the run exists (scheduled, backfill, one-off), and its attempt below."""
        return format_html(
            '{}<span class="fj-sub">attempt {}</span>', RunKind(run.kind).label, run.attempt
        )

    @admin.display(description=_("started"))
    def started(self, run: JobRun) -> SafeString | str:
        """In the list: on its slot's day, the time alone (the slot beside it has the date)."""
        return instant(run.started_at, job_zone(run.job), ref=run.scheduled_for)

    @admin.display(description=_("started"))
    def started_at_text(self, run: JobRun) -> SafeString | str:
        return instant(run.started_at, job_zone(run.job))

    @admin.display(description=_("finished"))
    def finished(self, run: JobRun) -> SafeString | str:
        return instant(run.finished_at, job_zone(run.job))

    @admin.display(description=_("outcome"), ordering="outcome")
    def outcome_badge(self, run: JobRun) -> SafeString:
        """The outcome, and below it the run's work (``40 items, 1 batch``)."""
        label = Outcome(run.outcome).label + (" (capped)" if run.capped else "")
        work = f"{plural(run.items, 'item')}, {plural(run.batches, 'batch', 'es')}"
        return format_html('{}<span class="fj-sub">{}</span>', badge(run.outcome, label), work)

    @admin.display(description=_("capped"))
    def capped_text(self, run: JobRun) -> SafeString | str:
        """Said only of a run that was: it stopped at max_batches with work left."""
        if not run.capped:
            return str(_("no"))
        return format_html(
            "{} {}",
            badge("capped", str(_("capped"))),
            _("stopped at max_batches with work left; the next run goes on from there"),
        )

    @admin.display(description=_("duration"))
    def duration_text(self, run: JobRun) -> str:
        return "-" if run.duration is None else f"{run.duration:.3f}s"

    @admin.display(description=_("job"), ordering="job")
    def job_name(self, run: JobRun) -> SafeString:
        return format_html('<span class="fj-name">{}</span>', breakable(run.job))

    @admin.display(description=_("owner"))
    def owner_fence(self, run: JobRun) -> SafeString | str:
        """The process that ran it (its host's first label), and its fence below."""
        return format_html(
            '<span class="fj-owner">{}</span><span class="fj-sub">fence {}</span>',
            owner_label(run.owner),
            run.fence,
        )

    @admin.display(description=_("error"))
    def error_excerpt(self, run: JobRun) -> SafeString | str:
        """The error's last line, shortened (the traceback is on the run's page)."""
        excerpt = text.error_excerpt(run.error)
        return shortened(excerpt, css="fj-error-line") if excerpt else "-"

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
        return f"{plural(total, 'task')}: {', '.join(parts)}"

    @admin.display(description=_("tasks"))
    def tasks_table(self, run: JobRun) -> SafeString | str:
        """The tasks the run enqueued, in order (the first :data:`TASKS_SHOWN`), read-only."""
        alias = db.lease_db()
        tasks = list(RunTask.objects.using(alias).filter(run_id=run.pk)[: TASKS_SHOWN + 1])
        if not tasks:
            return "-"
        tz = job_zone(run.job)
        slot = run.scheduled_for  # on the slot's day, a task's times are written as times
        rows = format_html_join(
            "",
            '<tr><td class="fj-path">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>'
            "<td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    breakable(task.task_path),
                    task.backend,
                    task.result_id or "-",
                    badge(TASK_BADGE.get(task.status, ""), str(TaskStatus(task.status).label)),
                    instant(task.enqueued_at, tz, ref=slot),
                    instant(task.started_at, tz, ref=slot),
                    instant(task.finished_at, tz, ref=slot),
                    _task_error(task.error),
                )
                for task in tasks[:TASKS_SHOWN]
            ),
        )
        more = ""
        if len(tasks) > TASKS_SHOWN:
            hidden = RunTask.objects.using(alias).filter(run_id=run.pk).count() - TASKS_SHOWN
            more = format_html('<p class="fj-more">… and {} more</p>', hidden)
        head = format_html(
            "<th>{}</th>" * 8,
            _("task"),
            _("backend"),
            _("result id"),
            _("status"),
            _("enqueued"),
            _("started"),
            _("finished"),
            _("error"),
        )
        return format_html(
            '<table class="fj-tasks"><thead><tr>{}</tr></thead><tbody>{}</tbody></table>{}',
            head,
            rows,
            more,
        )


def _task_error(error: str) -> SafeString | str:
    """A task's error in its table: its last line (shortened), its traceback a click away."""
    excerpt = text.error_excerpt(error)
    if not excerpt:
        return "-"
    return shortened(
        excerpt,
        limit=60,
        css="fj-error-line",
        whole=format_html('<pre class="fj-error">{}</pre>', error),
        more=str(_("traceback")),
    )
