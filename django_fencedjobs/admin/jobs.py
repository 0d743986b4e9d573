"""The jobs pages: every job with its health and its recent slots; a job's page with its slot
timeline, next fire times, lease and watermarks (and, for a job whose runs enqueued
``django.tasks`` tasks, its oldest unfinished ones and its latest task outcome, as health
read them); run now, pause, resume.

Each row's health is decided once per request, in :meth:`JobLeaseAdmin.get_queryset` (one
clock reading, one :func:`~django_fencedjobs.health.all_health`), and comes with the row:
the state filter and the worst-first ordering are SQL over it, the columns read it from
the row, whenever the response is rendered. The list's compact timelines are read in
:meth:`JobLeaseAdmin.get_changelist_instance`, for the page's rows in one query.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.db.models import Case, CharField, IntegerField, QuerySet, Value, When
from django.db.models.expressions import Combinable
from django.db.models.query import ModelIterable
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from django_fencedjobs import baseline, clock, db, health, manual, operations
from django_fencedjobs.admin import timeline
from django_fencedjobs.admin.display import (
    badge,
    breakable,
    health_badge,
    instant,
    job_zone,
    shortened,
)
from django_fencedjobs.health import JobHealth, State
from django_fencedjobs.instants import format_instant
from django_fencedjobs.models import JobLease, Outcome, RunKind, Watermark
from django_fencedjobs.registry import registry

#: Fire times listed on a job's page.
NEXT_FIRE_TIMES = 10
#: The annotations a row carries: its state, and its severity's rank (0: critical first).
STATE, RANK = "fencedjobs_state", "fencedjobs_rank"


def health_of(row: JobLease) -> JobHealth | None:
    """The health decided for ``row`` in this request (see :func:`_with_health`); None for
    a row recorded after it was decided."""
    found: JobHealth | None = getattr(row, "fencedjobs_health", None)
    return found


if TYPE_CHECKING:
    _ModelIterable = ModelIterable[JobLease]
    _ModelAdmin = admin.ModelAdmin[JobLease]
else:  # not subscriptable at run time
    _ModelIterable = ModelIterable
    _ModelAdmin = admin.ModelAdmin


def _with_health(rows: QuerySet[JobLease], healths: Mapping[str, JobHealth]) -> QuerySet[JobLease]:
    """``rows``, each fetched with its health attached. The rows a changelist pages, filters
    and sorts and the one ``get_object`` fetches all derive from this queryset, and a
    queryset keeps its iterable class through every ``filter()``, ``order_by()`` and slice."""

    class RowsWithHealth(_ModelIterable):
        def __iter__(self) -> Iterator[JobLease]:
            for row in super().__iter__():
                setattr(row, "fencedjobs_health", healths.get(row.name))  # noqa: B010
                yield row

    rows._iterable_class = RowsWithHealth
    return rows


def _all_health(request: HttpRequest, now: datetime) -> list[JobHealth]:
    """Every job's health, decided once per request (the changelist asks for its queryset
    more than once)."""
    found: list[JobHealth] | None = getattr(request, "fencedjobs_healths", None)
    if found is None:
        found = health.all_health(now=now)
        setattr(request, "fencedjobs_healths", found)  # noqa: B010
    return found


#: The state filter of the Instances list that finds the instances in a health state (by
#: their lease rows; the other states link to all the job's instances).
_INSTANCE_FILTER = {
    State.NO_RUNNER.value: "no runner",
    State.FAILING.value: "failing",
    State.LATE.value: "late",
    State.INVALID.value: "invalid",
    State.PAUSED.value: "paused",
}


def _instance_jobs(healths: list[JobHealth]) -> list[dict[str, Any]]:
    """Per job with instances: its name, its worst state's badge and its instances counted
    by state, the worst first, each count with the link to those instances (from the health
    of the instances that may not be ok, which every job's health lists, or their count by
    their lease rows: no read of the rest)."""
    url = reverse("admin:fencedjobs_jobinstance_changelist")
    jobs = []
    for summary in health.instance_summaries(healths):
        if not summary.total:
            continue
        states = summary.states
        counts: list[tuple[str, int, str]] = [
            (state, states[state], _INSTANCE_FILTER.get(state, ""))
            for state in health.STATES_WORST_FIRST
            if state in states
        ]
        counts.append((State.OK.value, summary.ok, ""))
        if summary.disabled:
            counts.append(("disabled", summary.disabled, "disabled"))
        worst = summary.worst
        reason = summary.no_runner or (
            "counted by their lease rows: more may not be ok than are judged one by one"
            if summary.counted is not None
            else ""
        )
        jobs.append(
            {
                "name": summary.job,
                "total": summary.total,
                "badge": badge(worst, worst.replace("_", " "), reason),
                "counts": [
                    {
                        "state": state.replace("_", " "),
                        "count": count,
                        "url": f"{url}?{urlencode(_filtered(summary.job, found))}",
                    }
                    for state, count, found in counts
                    if count
                ],
            }
        )
    return jobs


def _filtered(job: str, state: str) -> dict[str, str]:
    """The Instances list's filters for ``job``'s instances in ``state`` (all: "")."""
    return {"job": job, "state": state} if state else {"job": job}


def _per_job(values: Mapping[str, Any], default: Any, output_field: Any) -> Case:
    """A SQL expression that is ``values[name]`` for each job's row, ``default`` otherwise."""
    groups: dict[Any, list[str]] = {}
    for name, value in values.items():
        groups.setdefault(value, []).append(name)
    return Case(
        *(When(name__in=names, then=Value(value)) for value, names in groups.items()),
        default=Value(default),
        output_field=output_field,
    )


class StateFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(state.value, state.value.replace("_", " ")) for state in State]

    def queryset(self, request: HttpRequest, queryset: QuerySet[JobLease]) -> QuerySet[JobLease]:
        return queryset.filter(**{STATE: self.value()}) if self.value() else queryset


@admin.register(JobLease)
class JobLeaseAdmin(_ModelAdmin):
    # Fits a 1366-px laptop with Django's navigation sidebar open: the reason under the
    # state (shortened, the whole of it a click away), the schedule under the name, the
    # failures in a row and the lease of a run in progress with the last run.
    list_display = (
        "job",
        "job_state",
        "recent_slots",
        "next_run",
        "last_success",
        "last_outcome",
    )
    list_display_links = ("job",)
    list_filter = (StateFilter, "paused")
    show_full_result_count = False  # one row per job: the filtered count is all it needs
    search_fields = ("name",)
    actions = ("run_now", "pause", "resume", "skip_next_slot")
    fieldsets = (
        (None, {"fields": ("name", "state", "reason", "schedule")}),
        (_("Slots"), {"fields": ("slot_timeline",)}),
        (
            _("Timing"),
            {"fields": ("next_run", "expected_by", "last_success", "next_fire_times")},
        ),
        (_("Last run"), {"fields": ("last_outcome", "consecutive_failures")}),
        (
            _("Lease"),
            {"fields": ("paused_text", "holder", "fence", "lease_expiry", "first_seen")},
        ),
        (_("Progress"), {"fields": ("watermarks",)}),
    )
    readonly_fields = (
        "paused_text",
        "state",
        "reason",
        "schedule",
        "slot_timeline",
        "next_run",
        "expected_by",
        "last_success",
        "next_fire_times",
        "last_outcome",
        "holder",
        "lease_expiry",
        "first_seen",
        "watermarks",
        "tasks_unfinished",
        "tasks_last_outcome",
    )
    #: Shown on the page of a job whose runs enqueued ``django.tasks`` tasks.
    tasks_fieldset = (_("Tasks"), {"fields": ("tasks_unfinished", "tasks_last_outcome")})

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

    # -- the rows, with their health ---------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[JobLease]:
        """Every job's row, each with its health (decided here, once per request, against
        one clock reading), and its state and severity as SQL values for the state filter
        and the ordering."""
        now = self._record_first_sightings(request)
        healths = {h.name: h for h in _all_health(request, now)}
        # The jobs declared with a schedule; instances have a page of their own, and
        # backfill slots and one-offs are shown with their backfills and their job's runs.
        rows = (
            self.model._default_manager.get_queryset()
            .filter(instance__isnull=True, kind=RunKind.SCHEDULED)
            .annotate(
                **{
                    STATE: _per_job(
                        {n: h.state.value for n, h in healths.items()}, "", CharField()
                    ),
                    RANK: _per_job(
                        {n: h.severity.rank for n, h in healths.items()}, 2, IntegerField()
                    ),
                }
            )
        )
        ordering = self.get_ordering(request)
        if ordering:
            rows = rows.order_by(*ordering)
        return _with_health(rows, healths)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The jobs; above them, each job declared with ``instances=True``: its instances
        counted by state, each count a link to those instances."""
        response = super().changelist_view(request, extra_context)
        context = getattr(response, "context_data", None)
        if context is not None and "cl" in context:
            healths = getattr(request, "fencedjobs_healths", None)
            if healths is not None:
                context["instance_jobs"] = _instance_jobs(healths)
        return response

    def get_ordering(self, request: HttpRequest) -> list[str | Combinable]:
        """Late, failing and invalid jobs first, then warnings, then the rest; by name."""
        return [RANK, "name"]

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        """The page's rows, each with its compact timeline's window and runs (one query for
        the page)."""
        changelist = super().get_changelist_instance(request)
        rows = list(changelist.result_list)
        windows = {}
        for row in rows:
            h = health_of(row)
            found = timeline.window_of(h, row.created_at, timeline.LIST) if h else None
            if found is not None:
                windows[row.name] = found
        runs = timeline.runs_in(windows, using=db.lease_db())
        for row in rows:
            if row.name in windows:
                setattr(row, "fencedjobs_slots", (windows[row.name], runs[row.name]))  # noqa: B010
        changelist.result_list = rows
        return changelist

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        h = health_of(obj) if obj is not None else None
        if h is not None and h.tasks is not None:
            return [*fieldsets, self.tasks_fieldset]
        return fieldsets

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        # A POST is refused by Django itself: has_change_permission() is False.
        context = {**(extra_context or {}), "can_operate": self.has_operate_permission(request)}
        return super().change_view(request, object_id, form_url, context)

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

    # -- columns -----------------------------------------------------------------------------

    @admin.display(description=_("job"), ordering="name")
    def job(self, row: JobLease) -> SafeString:
        """The job's name, and its schedule in words below it."""
        h = health_of(row)
        schedule = (h.schedule or "not declared in code") if h else ""
        return format_html(
            '<span class="fj-name">{}</span><span class="fj-sub">{}</span>',
            breakable(row.name),
            schedule,
        )

    @admin.display(description=_("state"), ordering=RANK)
    def job_state(self, row: JobLease) -> SafeString | str:
        """The state's badge, and the reason below it (shortened, the whole a click away)."""
        h = health_of(row)
        if h is None:
            return "-"
        return format_html(
            "{}{}",
            health_badge(h.state.value, h.severity.value, h.reason),
            shortened(h.reason, css="fj-reason"),
        )

    @admin.display(description=_("state"), ordering=RANK)
    def state(self, row: JobLease) -> SafeString | str:
        h = health_of(row)
        if h is None:
            return "-"
        return health_badge(h.state.value, h.severity.value, h.reason)

    @admin.display(description=_("paused"))
    def paused_text(self, row: JobLease) -> str:
        """Yes or no, in words: Django's icon for a false boolean is a red cross, which
        beside a job reads as trouble."""
        return str(_("yes: no run starts until it is resumed") if row.paused else _("no"))

    @admin.display(description=_("reason"))
    def reason(self, row: JobLease) -> str:
        h = health_of(row)
        return h.reason if h else "-"

    @admin.display(description=_("recent slots"))
    def recent_slots(self, row: JobLease) -> SafeString | str:
        h = health_of(row)
        drawn = getattr(row, "fencedjobs_slots", None)
        if h is None or drawn is None:
            return "-"
        window, runs = drawn
        return timeline.render(h, window, runs, timeline.LIST)

    @admin.display(description=_("schedule"))
    def schedule(self, row: JobLease) -> str:
        h = health_of(row)
        return (h.schedule or "not declared in code") if h else "-"

    @admin.display(description=_("next run"), ordering="next_run_at")
    def next_run(self, row: JobLease) -> SafeString | str:
        h = health_of(row)
        if h is None:
            return "-"
        if h.state is State.REMOVED:
            return "never (not declared)"
        if row.paused:
            return format_html("paused<br>{}", instant(row.next_run_at, h.tz))
        if h.next_run_at is not None and h.next_run_at <= h.checked_at:
            return format_html("due now<br>{}", instant(h.next_run_at, h.tz))
        return instant(h.next_run_at, h.tz)

    @admin.display(description=_("expected by"))
    def expected_by(self, row: JobLease) -> SafeString | str:
        h = health_of(row)
        return instant(h.expected_by, h.tz) if h else "-"

    @admin.display(description=_("last success"), ordering="last_success_at")
    def last_success(self, row: JobLease) -> SafeString | str:
        h = health_of(row)
        if h is None or row.last_success_at is None:
            return "never"
        return instant(row.last_success_at, h.tz)

    @admin.display(description=_("last run"))
    def last_outcome(self, row: JobLease) -> SafeString | str:
        """The last run's outcome and when it ended (or started, while it runs); the
        failures in a row; while a run holds the lease, its owner, fence and lease expiry."""
        h = health_of(row)
        if h is None or h.last_run is None:
            return "-"
        run = h.last_run
        # A run in progress: when it started; any other: when it ended.
        when = run.started_at if run.outcome == Outcome.RUNNING else run.finished_at
        label = Outcome(run.outcome).label + (" (capped)" if run.capped else "")
        notes = []
        failures = row.consecutive_failures
        if failures > 1 and run.outcome != Outcome.RUNNING:
            notes.append((f"{failures} failures in a row",))
        if h.running and h.lease_until is not None:
            until = format_instant(h.lease_until, h.tz, ref=when)
            notes.append((f"{h.owner} (fence {h.fence}), lease until {until}",))
        return format_html(
            "{}<br>{}{}",
            badge(run.outcome, label, run.error_excerpt),
            instant(when, h.tz),
            format_html_join("", '<span class="fj-sub">{}</span>', notes),
        )

    @admin.display(description=_("oldest unfinished"))
    def tasks_unfinished(self, row: JobLease) -> SafeString | str:
        """The oldest slot whose tasks have not all finished, counted by status."""
        h = health_of(row)
        slot = h.tasks.unfinished if h is not None and h.tasks is not None else None
        if h is None or slot is None:
            return "-"
        counts = ", ".join(
            f"{n} {status}"
            for status, n in (
                ("pending", slot.pending),
                ("ready", slot.ready),
                ("running", slot.running),
            )
            if n
        )
        return format_html(
            "{}: {}", _run_link(slot.run_pk, instant(slot.scheduled_for, h.tz)), counts
        )

    @admin.display(description=_("latest outcome"))
    def tasks_last_outcome(self, row: JobLease) -> SafeString | str:
        """The latest slot with finished tasks: how many failed, and one failure's error."""
        h = health_of(row)
        slot = h.tasks.last_outcome if h is not None and h.tasks is not None else None
        if h is None or slot is None:
            return "-"
        counts = f"{slot.successful} successful, {slot.failed} failed"
        link = _run_link(slot.run_pk, instant(slot.scheduled_for, h.tz))
        if not slot.failed:
            return format_html("{}: {}", link, counts)
        return format_html(
            "{}: {}<br>{}: {}",
            link,
            counts,
            slot.failed_task,
            slot.error_excerpt or "-",
        )

    @admin.display(description=_("held by"))
    def holder(self, row: JobLease) -> str:
        h = health_of(row)
        if h is None or not h.running:
            return "-"
        return f"{h.owner} (fence {h.fence})"

    @admin.display(description=_("lease expires"))
    def lease_expiry(self, row: JobLease) -> SafeString | str:
        h = health_of(row)
        return instant(h.lease_until, h.tz) if h else "-"

    @admin.display(description=_("first seen"))
    def first_seen(self, row: JobLease) -> SafeString | str:
        """When the job's code was first seen live: its absence baseline."""
        return instant(row.created_at, job_zone(row.name))

    # -- the job's page ----------------------------------------------------------------------

    @admin.display(description=_("slots"))
    def slot_timeline(self, row: JobLease) -> SafeString | str:
        h = health_of(row)
        window = timeline.window_of(h, row.created_at, timeline.PAGE) if h else None
        if h is None or window is None:
            return "-"
        runs = timeline.runs_in({row.name: window}, using=db.lease_db(), with_errors=True)
        site = self.admin_site.name
        return timeline.render(
            h,
            window,
            runs[row.name],
            timeline.PAGE,
            run_url=lambda pk: reverse(f"{site}:fencedjobs_jobrun_change", args=[pk]),
            runs_url=reverse(f"{site}:fencedjobs_jobrun_changelist")
            + "?"
            + urlencode({"job": row.name}),
        )

    @admin.display(description=_("next fire times"))
    def next_fire_times(self, row: JobLease) -> SafeString | str:
        h = health_of(row)
        job = h.job if h else None
        if h is None or job is None or job.schedule is None:
            return "-"
        times: list[datetime] = []
        when = h.checked_at
        for _i in range(NEXT_FIRE_TIMES):
            when = job.schedule.next_after(when)
            times.append(when)
        items = format_html_join("", "<li>{}</li>", ((instant(t, h.tz),) for t in times))
        return format_html('<ol class="fj-fire-times">{}</ol>', items)

    @admin.display(description=_("watermarks"))
    def watermarks(self, row: JobLease) -> SafeString | str:
        marks = list(Watermark.objects.using(db.lease_db()).filter(job=row.name).order_by("key"))
        if not marks:
            return "none (this job keeps no watermark)"
        tz = job_zone(row.name)
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    m.key or "(default)",
                    instant(m.position, tz) if m.position is not None else m.cursor,
                    m.fence,
                    instant(m.updated_at, tz),
                )
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
        outcome = _Outcome()
        for row in queryset:
            if row.name not in registry:
                outcome.skipped.append(f"{row.name} (not declared in code)")
                continue
            change = operations.make_due(row.name, now)
            if change is operations.Change.DONE:
                when = format_instant(now, job_zone(row.name))
                self.log_change(request, row, f"Run now: made due at {when}.")
            outcome.add(row.name, change, already="already due")
        self._report(request, "Made due, it will run at the next tick", "made due", outcome)

    @admin.action(description=_("Pause"), permissions=["operate"])
    def pause(self, request: HttpRequest, queryset: Iterable[JobLease]) -> None:
        self._set_paused(request, queryset, paused=True)

    @admin.action(description=_("Resume"), permissions=["operate"])
    def resume(self, request: HttpRequest, queryset: Iterable[JobLease]) -> None:
        self._set_paused(request, queryset, paused=False)

    @admin.action(description=_("Skip the next slot"), permissions=["operate"])
    def skip_next_slot(self, request: HttpRequest, queryset: Iterable[JobLease]) -> None:
        outcome = _Outcome()
        for row in queryset:
            job = registry.get(row.name) if row.name in registry else None
            if job is None or job.schedule is None:
                why = "not declared in code" if job is None else "invalid: it does not run"
                outcome.skipped.append(f"{row.name} ({why})")
                continue
            try:
                operated = manual.skip_next_slot(job, by=f"admin ({request.user.get_username()})")
            except manual.JobBusy:
                outcome.add(row.name, operations.Change.BUSY)
                continue
            self.log_change(request, row, f"Skip: {operated.line}.")
            outcome.add(row.name, operations.Change.DONE)
        self._report(request, "Skipped the next slot", "skipped", outcome)

    def _set_paused(
        self, request: HttpRequest, queryset: Iterable[JobLease], *, paused: bool
    ) -> None:
        outcome = _Outcome()
        for row in queryset:
            if row.paused == paused:
                change = operations.Change.UNCHANGED
            else:
                change = operations.set_paused(row.name, paused)
            if change is operations.Change.DONE:
                self.log_change(request, row, "Paused." if paused else "Resumed.")
            outcome.add(row.name, change, already="already paused" if paused else "not paused")
        verb = "paused" if paused else "resumed"
        self._report(request, verb.capitalize(), verb, outcome)

    def _report(self, request: HttpRequest, happened: str, verb: str, outcome: _Outcome) -> None:
        # The admin capitalises a message's first letter: it never starts with a job's name.
        if outcome.done:
            self.message_user(request, f"{happened}: {', '.join(outcome.done)}.", messages.SUCCESS)
        if outcome.busy:
            self.message_user(
                request,
                f"Busy, not {verb}: {', '.join(outcome.busy)} (a run kept the job's lease row "
                f"locked inside a fenced transaction for {db.LOCK_WAIT:g}s); try again.",
                messages.ERROR,
            )
        if outcome.skipped:
            self.message_user(
                request, f"Nothing to do for {', '.join(outcome.skipped)}.", messages.WARNING
            )


class _Outcome:
    """What an action did to each selected job: done, busy (the row stayed locked, try
    again), or nothing to do (and why)."""

    def __init__(self) -> None:
        self.done: list[str] = []
        self.busy: list[str] = []
        self.skipped: list[str] = []

    def add(self, name: str, change: operations.Change, *, already: str = "") -> None:
        if change is operations.Change.DONE:
            self.done.append(name)
        elif change is operations.Change.BUSY:
            self.busy.append(name)
        else:
            self.skipped.append(f"{name} ({already})")


_OPERATIONS = {
    "run-now": JobLeaseAdmin.run_now,
    "pause": JobLeaseAdmin.pause,
    "resume": JobLeaseAdmin.resume,
    "skip": JobLeaseAdmin.skip_next_slot,
}


def _run_link(pk: int, label: SafeString | str) -> SafeString:
    return format_html(
        '<a href="{}">{}</a>', reverse("admin:fencedjobs_jobrun_change", args=[pk]), label
    )
