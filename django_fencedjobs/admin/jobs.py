"""The jobs pages (docs/alerting.md, "The admin"): every job with its health and recent
slots; a job's page with its slot timeline, lease, watermarks and tasks; run now, pause,
resume, skip. Each row's health is decided once per request (one clock reading, one
:func:`~django_fencedjobs.health.all_health`, :meth:`JobLeaseAdmin.get_queryset`) and comes
with the row: the state filter and the worst-first ordering are SQL over it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime, tzinfo
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.utils import flatten_fieldsets
from django.contrib.admin.views.main import ChangeList
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
from django.urls import URLPattern, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from django_fencedjobs import baseline, clock, db, health, manual, operations
from django_fencedjobs.admin import timeline
from django_fencedjobs.admin.display import (
    ReadOnly,
    admin_urls,
    breakable,
    health_badge,
    health_of,
    instant,
    job_zone,
    last_run_cell,
    run_instant,
    run_url,
    runs_url,
    shortened,
    state_badge,
)
from django_fencedjobs.health import JobHealth, State, TaskSlot
from django_fencedjobs.instants import format_instant
from django_fencedjobs.models import JobLease, Outcome, RunKind, Watermark
from django_fencedjobs.registry import registry

#: Fire times listed on a job's page.
NEXT_FIRE_TIMES = 10
#: The annotations a row carries: its state, and its severity's rank (0: critical first).
STATE, RANK = "fencedjobs_state", "fencedjobs_rank"

if TYPE_CHECKING:
    _ModelIterable = ModelIterable[JobLease]
    _ModelAdmin = admin.ModelAdmin[JobLease]
else:  # not subscriptable at run time
    _ModelIterable = ModelIterable
    _ModelAdmin = admin.ModelAdmin


#: A job's ``overlap``, as its page says it.
_OVERLAP = {
    "buffer_one": "runs as soon as the run ends (buffer_one)",
    "skip": "is recorded skipped, not run (skip)",
    "replace": "replaces the run: fenced off, stopped, recorded replaced (replace)",
}


def may_operate(request: HttpRequest) -> bool:
    """Run now, pause, resume, skip (a job's or an instance's): the change permission on jobs."""
    return request.user.has_perm(f"{JobLease._meta.app_label}.change_joblease")


def _with_health(rows: QuerySet[JobLease], healths: Mapping[str, JobHealth]) -> QuerySet[JobLease]:
    """``rows``, each fetched with its health attached (:func:`health_of`): the changelist's
    rows and ``get_object``'s all derive from this queryset, which keeps its iterable class
    through every ``filter()``, ``order_by()`` and slice."""

    class RowsWithHealth(_ModelIterable):
        def __iter__(self) -> Iterator[JobLease]:
            for row in super().__iter__():
                setattr(row, "fencedjobs_health", healths.get(row.name))  # noqa: B010
                yield row

    rows._iterable_class = RowsWithHealth
    return rows


def _all_health(request: HttpRequest, now: datetime) -> list[JobHealth]:
    """Every job's health, once per request (the changelist asks for its queryset twice)."""
    found: list[JobHealth] | None = getattr(request, "fencedjobs_healths", None)
    if found is None:
        found = health.all_health(now=now)
        setattr(request, "fencedjobs_healths", found)  # noqa: B010
    return found


#: The Instances list's state filters: the instances in a state, by their lease rows.
_INSTANCE_FILTER = {
    state: state.replace("_", " ")
    for state in ("no_runner", "failing", "late", "invalid", "paused", "disabled")
}


def _instance_jobs(healths: list[JobHealth]) -> list[dict[str, Any]]:
    """Per job with instances: its worst state's badge and its instances counted by state, the
    worst first, each count linked to those instances (no read of the instances that are ok)."""
    jobs = []
    for summary in health.instance_summaries(healths):
        if not summary.total:
            continue
        states = summary.states
        counts = [(state, states[state]) for state in health.STATES_WORST_FIRST if state in states]
        counts += [(State.OK.value, summary.ok), ("disabled", summary.disabled)]
        reason = summary.no_runner or (
            "counted by their lease rows: more may not be ok than are judged one by one"
            if summary.counted is not None
            else ""
        )
        jobs.append(
            {
                "name": summary.job,
                "total": summary.total,
                "badge": state_badge(summary.worst, reason),
                "counts": [
                    {
                        "state": state.replace("_", " "),
                        "count": count,
                        "url": _instances_url(summary.job, state),
                    }
                    for state, count in counts
                    if count
                ],
            }
        )
    return jobs


def _instances_url(job: str, state: str) -> str:
    """The Instances list of ``job``'s instances in ``state`` (all, for a state it lacks)."""
    query = {"job": job}
    if state in _INSTANCE_FILTER:
        query["state"] = _INSTANCE_FILTER[state]
    return f"{reverse('admin:fencedjobs_jobinstance_changelist')}?{urlencode(query)}"


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
class JobLeaseAdmin(ReadOnly, _ModelAdmin):
    # A job's row is created when its code is first seen live; deleting it would restart the
    # job's fence at zero (a stale holder's old fence could become current again). The change
    # permission on jobs allows the operations instead (has_operate_permission).
    # Fits a 1366-px laptop with Django's navigation sidebar open: the reason under the state,
    # the schedule under the name, the lease of a run in progress with the last run.
    list_display = ("job", "job_state", "recent_slots", "next_run", "last_success", "last_outcome")
    list_display_links = ("job",)
    list_filter = (StateFilter, "paused")
    show_full_result_count = False  # one row per job: the filtered count is all it needs
    search_fields = ("name",)
    actions = ("run_now", "pause", "resume", "skip_next_slot")
    fieldsets = (
        (None, {"fields": ("name", "state", "reason", "schedule", "calendars", "overlap")}),
        (_("Slots"), {"fields": ("slot_timeline",)}),
        (_("Timing"), {"fields": ("next_run", "expected_by", "last_success", "next_fire_times")}),
        (_("Last run"), {"fields": ("last_outcome", "consecutive_failures")}),
        (_("Lease"), {"fields": ("paused_text", "holder", "fence", "lease_expiry", "first_seen")}),
        (_("Progress"), {"fields": ("watermarks",)}),
    )
    #: Shown on the page of a job whose runs enqueued ``django.tasks`` tasks.
    tasks_fieldset = (_("Tasks"), {"fields": ("tasks_unfinished", "tasks_last_outcome")})
    # Nothing is edited through a form: every field is read-only.
    readonly_fields = (*flatten_fieldsets(fieldsets), "tasks_unfinished", "tasks_last_outcome")

    class Media:
        css = {"all": ("fencedjobs/admin.css",)}

    def has_operate_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return may_operate(request)

    # -- the rows, with their health ---------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[JobLease]:
        """Every job's row with its health, and its state and severity as SQL values for the
        state filter and the ordering."""
        now = self._record_first_sightings(request)
        healths = {h.name: h for h in _all_health(request, now)}
        states = _per_job({n: h.state.value for n, h in healths.items()}, "", CharField())
        ranks = _per_job({n: h.severity.rank for n, h in healths.items()}, 2, IntegerField())
        # The jobs declared with a schedule; instances have a page of their own, and
        # backfill slots and one-offs are shown with their backfills and their job's runs.
        rows = (
            self.model._default_manager.get_queryset()
            .filter(instance__isnull=True, kind=RunKind.SCHEDULED)
            .annotate(**{STATE: states, RANK: ranks})
            .order_by(*self.get_ordering(request))
        )
        return _with_health(rows, healths)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The jobs; above them, each job with instances: its instances counted by state."""
        response = super().changelist_view(request, extra_context)
        context = getattr(response, "context_data", None)
        healths = getattr(request, "fencedjobs_healths", None)
        if context is not None and "cl" in context and healths is not None:
            context["instance_jobs"] = _instance_jobs(healths)
        return response

    def get_ordering(self, request: HttpRequest) -> list[str | Combinable]:
        """Late, failing and invalid jobs first, then warnings, then the rest; by name."""
        return [RANK, "name"]

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        """The page's rows, each with its compact timeline's window and runs (one query)."""
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
        return [*fieldsets, self.tasks_fieldset] if h and h.tasks is not None else fieldsets

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
        """A declared job seen for the first time gets its lease row now: the baseline from
        which, never having run, it becomes late. Returns the clock reading. A database user
        that may not write is told which jobs are missing from the list."""
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
        return format_html("{}{}", health_badge(h), shortened(h.reason, css="fj-reason"))

    @admin.display(description=_("state"), ordering=RANK)
    def state(self, row: JobLease) -> SafeString | str:
        h = health_of(row)
        return health_badge(h) if h else "-"

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

    @admin.display(description=_("a slot during a run"))
    def overlap(self, row: JobLease) -> str:
        declared = (
            registry.get(row.parent or row.name) if (row.parent or row.name) in registry else None
        )
        if declared is None:
            return "-"
        return _OVERLAP[declared.overlap]

    @admin.display(description=_("calendars to avoid"))
    def calendars(self, row: JobLease) -> SafeString | str:
        names: Sequence[str] = ()
        declared = None
        if row.name in registry:
            declared = registry.get(row.name)
            names = declared.exclude
        elif row.instance is not None and row.parent in registry:
            declared = registry.get(row.parent)
            own = row.instance.exclude if isinstance(row.instance.exclude, list) else []
            names = (*declared.exclude, *own)
        if not names:
            return "-"
        links = format_html_join(
            ", ",
            '<a href="{}">{}</a>',
            (
                (reverse("admin:fencedjobs_calendar_changelist") + "?" + urlencode({"name": n}), n)
                for n in names
            ),
        )
        if declared is not None and declared.defer_excluded:
            return format_html(
                "{}<br>{}", links, _("an excluded slot runs at the next allowed time")
            )
        return links

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
        """The last run; the failures in a row; while a run holds the lease, its owner, fence
        and lease expiry."""
        h = health_of(row)
        if h is None or h.last_run is None:
            return "-"
        run = h.last_run
        notes = []
        failures = row.consecutive_failures
        if failures > 1 and run.outcome != Outcome.RUNNING:
            notes.append((f"{failures} failures in a row",))
        if h.running and h.lease_until is not None:
            until = format_instant(h.lease_until, h.tz, ref=run_instant(run))
            notes.append((f"{h.owner} (fence {h.fence}), lease until {until}",))
        label = Outcome(run.outcome).label + (" (capped)" if run.capped else "")
        below = format_html_join("", '<span class="fj-sub">{}</span>', notes)
        return last_run_cell(run, h.tz, label, below)

    @admin.display(description=_("oldest unfinished"))
    def tasks_unfinished(self, row: JobLease) -> SafeString | str:
        """The oldest slot whose tasks have not all finished, counted by status."""
        h = health_of(row)
        if h is None or h.tasks is None or (slot := h.tasks.unfinished) is None:
            return "-"
        counts = {"pending": slot.pending, "ready": slot.ready, "running": slot.running}
        text = ", ".join(f"{n} {status}" for status, n in counts.items() if n)
        return format_html("{}: {}", _slot_link(slot, h.tz), text)

    @admin.display(description=_("latest outcome"))
    def tasks_last_outcome(self, row: JobLease) -> SafeString | str:
        """The latest slot with finished tasks: how many failed, and one failure's error."""
        h = health_of(row)
        if h is None or h.tasks is None or (slot := h.tasks.last_outcome) is None:
            return "-"
        link = _slot_link(slot, h.tz)
        counts = f"{slot.successful} successful, {slot.failed} failed"
        if not slot.failed:
            return format_html("{}: {}", link, counts)
        return format_html(
            "{}: {}<br>{}: {}", link, counts, slot.failed_task, slot.error_excerpt or "-"
        )

    @admin.display(description=_("held by"))
    def holder(self, row: JobLease) -> str:
        h = health_of(row)
        return f"{h.owner} (fence {h.fence})" if h and h.running else "-"

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
            run_url=lambda pk: run_url(site, pk),
            runs_url=runs_url(site, job=row.name),
        )

    @admin.display(description=_("next fire times"))
    def next_fire_times(self, row: JobLease) -> SafeString | str:
        h = health_of(row)
        schedule = h.job.schedule if h and h.job else None
        if h is None or schedule is None:
            return "-"
        times = itertools.islice(schedule.iter_after(h.checked_at), NEXT_FIRE_TIMES)
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
        route = "<path:object_id>/operate/<str:operation>/"
        return [*admin_urls(self, (route, self.operate_view, "operate")), *super().get_urls()]

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
    """What an action did to each selected job: done, busy (its row stayed locked), or
    nothing to do (and why)."""

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


def _slot_link(slot: TaskSlot, tz: tzinfo) -> SafeString:
    """A slot's instant, linked to its run."""
    return format_html(
        '<a href="{}">{}</a>', run_url("admin", slot.run_pk), instant(slot.scheduled_for, tz)
    )
