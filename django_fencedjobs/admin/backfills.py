"""The backfills pages: an operator's backfills of a job's past slots, and one-offs at an
instant (:mod:`django_fencedjobs.backfills` does the work; these pages only ask and show).

The list and a backfill's page are read-only, with its progress (:func:`progress_of`).
*Add backfill* (job or instance ``job[key]``, from and to as ISO 8601 instants with their
offsets, as ``manage.py backfill`` takes them): *Dry run* lists the slots it would queue
and those it leaves, and why, and queues nothing; *Backfill* queues them. *Run once*: a job
or instance, an instant or ``now``, and arguments as a JSON object over the job's own. Both
forms need the Django *add* permission on backfills; the jobs declared in code stay
read-only.
"""

from __future__ import annotations

import json
import operator
from dataclasses import dataclass
from datetime import datetime
from functools import reduce
from typing import TYPE_CHECKING, Any, TypeVar, cast

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import AdminForm
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from django_fencedjobs import clock, db, instances
from django_fencedjobs.admin.display import (
    admin_urls,
    breakable,
    instant,
    job_zone,
    plural,
    runs_url,
)
from django_fencedjobs.backfills import (
    BackfillError,
    BackfillPlan,
    backfill,
    plan_backfill,
    run_once,
)
from django_fencedjobs.exceptions import UnknownJob
from django_fencedjobs.instants import format_instant, parse_instant
from django_fencedjobs.models import Backfill, BackfillSelection, JobLease, JobRun, Outcome, RunKind
from django_fencedjobs.registry import registry

__all__ = ["BackfillAdmin", "Progress", "progress_of"]

#: Slots a dry run lists in each of its two tables; past them, how many more there are.
PLAN_SHOWN = 200
#: ``at`` of a one-off that runs at once.
NOW = "now"

_Form = TypeVar("_Form", bound=forms.Form)

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[Backfill]
else:  # not subscriptable at run time
    _ModelAdmin = admin.ModelAdmin


@dataclass(frozen=True)
class Progress:
    """Where a backfill is: ``running`` and ``queued`` count its lease rows not done yet; the
    rest of its slots are done (a row queued again by a later backfill belongs to that one).
    The runs: of kind ``backfill``, of its job in its range, every attempt, by outcome."""

    slots: int
    running: int = 0
    queued: int = 0
    succeeded: int = 0
    failed: int = 0

    @property
    def done(self) -> int:
        return max(self.slots - self.running - self.queued, 0)

    @property
    def summary(self) -> str:
        """``2 of 6 done, 1 running, 3 queued``."""
        return f"{self.done} of {self.slots} done, {self.running} running, {self.queued} queued"

    @property
    def runs(self) -> str:
        """``runs: 2 succeeded, 1 failed``; ``no runs yet``."""
        if not self.succeeded and not self.failed:
            return "no runs yet"
        return f"runs: {self.succeeded} succeeded, {self.failed} failed"


def progress_of(backfills: list[Backfill], now: datetime) -> dict[int, Progress]:
    """Each backfill's :class:`Progress`, in two queries however many there are."""
    if not backfills:
        return {}
    alias = db.lease_db()
    rows = (
        JobLease.objects.using(alias)
        .filter(backfill__in=[b.pk for b in backfills], paused=False)
        .order_by()
        .values("backfill")
        .annotate(
            running=Count("pk", filter=Q(lease_until__gt=now)),
            queued=Count("pk", filter=Q(lease_until__lte=now)),
        )
    )
    pending = {row["backfill"]: (row["running"], row["queued"]) for row in rows}
    ended = ~Q(outcome__in=[Outcome.SUCCEEDED, Outcome.RUNNING])
    counts: dict[str, Count] = {}
    ranges = []
    for b in backfills:
        in_range = Q(job=b.job, scheduled_for__gte=b.start, scheduled_for__lt=b.end)
        ranges.append(in_range)
        counts[f"ok_{b.pk}"] = Count("pk", filter=in_range & Q(outcome=Outcome.SUCCEEDED))
        counts[f"failed_{b.pk}"] = Count("pk", filter=in_range & ended)
    runs = (
        JobRun.objects.using(alias)
        .filter(reduce(operator.or_, ranges), kind=RunKind.BACKFILL)
        .aggregate(**counts)
    )
    found = {}
    for b in backfills:
        running, queued = pending.get(b.pk, (0, 0))
        found[b.pk] = Progress(
            b.slots, running, queued, runs[f"ok_{b.pk}"] or 0, runs[f"failed_{b.pk}"] or 0
        )
    return found


class BackfillChangeList(ChangeList):
    """The list, each backfill with its progress: ``backfill.fencedjobs_progress``."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        page = list(self.result_list)
        progress = progress_of(page, clock.now())
        for b in page:
            setattr(b, "fencedjobs_progress", progress[b.pk])  # noqa: B010
        self.result_list = page


class InstantField(forms.CharField):
    """An ISO 8601 instant with its offset, as the commands take it."""

    def to_python(self, value: Any) -> datetime | None:  # type: ignore[override]
        text = super().to_python(value)
        if not text:
            return None
        try:
            return parse_instant(text)
        except ValueError as exc:
            raise ValidationError(str(exc), code="invalid") from None


class _JobForm(forms.Form):
    job = forms.CharField(
        label=_("Job"),
        max_length=200,
        help_text=_("A job's name, or an instance's: job[key]."),
        widget=forms.TextInput(attrs={"list": "fj-job-names", "size": 40}),
    )

    def clean_job(self) -> str:
        name: str = self.cleaned_data["job"].strip()
        try:
            instances.get_job(name)
        except UnknownJob as exc:
            raise ValidationError(str(exc), code="unknown_job") from None
        return name


class BackfillForm(_JobForm):
    start = InstantField(
        label=_("From"),
        help_text=_("Included. With its offset: 2026-11-29T06:00:00+01:00, or Z for UTC."),
        widget=forms.TextInput(attrs={"placeholder": "2026-11-29T06:00:00+00:00", "size": 30}),
    )
    end = InstantField(
        label=_("To"),
        help_text=_("Excluded, and not in the future."),
        widget=forms.TextInput(attrs={"placeholder": "2026-11-30T06:00:00+00:00", "size": 30}),
    )
    selection = forms.ChoiceField(
        label=_("Slots"),
        choices=BackfillSelection.choices,
        initial=BackfillSelection.MISSING,
        widget=forms.RadioSelect,
    )
    concurrency = forms.IntegerField(
        label=_("At once"),
        min_value=1,
        initial=1,
        help_text=_("At most this many of its slots run at the same time."),
    )
    newest_first = forms.BooleanField(
        label=_("Newest first"),
        required=False,
        help_text=_("Run the latest slot first (by default the oldest runs first)."),
    )


class RunOnceForm(_JobForm):
    at = forms.CharField(
        label=_("At"),
        initial=NOW,
        help_text=_("now, or an instant with its offset: 2026-11-29T14:00:00+01:00."),
        widget=forms.TextInput(attrs={"size": 30}),
    )
    arguments = forms.CharField(
        label=_("Arguments"),
        required=False,
        help_text=_('A JSON object over the job\'s own arguments: {"fmt": "csv"}.'),
        widget=forms.Textarea(attrs={"rows": 4, "cols": 60}),
    )

    def clean_at(self) -> datetime | str:
        text = self.cleaned_data["at"].strip()
        if text.lower() == NOW:
            return NOW
        try:
            return parse_instant(text)
        except ValueError as exc:
            raise ValidationError(f"{exc}, or now", code="invalid") from None

    def clean_arguments(self) -> dict[str, Any] | None:
        text = self.cleaned_data["arguments"].strip()
        if not text:
            return None
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValidationError(f"not JSON: {exc}", code="invalid") from None
        if not isinstance(value, dict):
            raise ValidationError(
                'a JSON object of keyword arguments, e.g. {"fmt": "csv"}', code="invalid"
            )
        return value


@admin.register(Backfill)
class BackfillAdmin(_ModelAdmin):
    list_display = (
        "job_name",
        "span",
        "which_slots",
        "concurrency",
        "slots_queued",
        "progress",
        "requested_by",
        "created",
    )
    list_filter = ("selection",)
    search_fields = ("job",)
    list_per_page = 50
    fields = (
        ("job", "selection"),
        "span",
        ("concurrency", "order"),
        ("slots", "progress"),
        "runs",
        ("requested_by", "created"),
    )
    readonly_fields = ("span", "order", "progress", "runs", "created")

    class Media:
        css = {"all": ("fencedjobs/admin.css",)}

    # -- permissions: read-only records; the add permission queues ----------------------------

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a record of what was asked

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Its rows would go with it: a slot's row made again would restart its fence at
        # zero, and a stale holder's old fence could become current again.
        return False

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return BackfillChangeList

    @admin.display(description=_("job"), ordering="job")
    def job_name(self, b: Backfill) -> SafeString:
        return format_html('<span class="fj-name">{}</span>', breakable(b.job))

    @admin.display(description=_("range"))
    def span(self, b: Backfill) -> SafeString:
        """From, and to (excluded), in the job's zone."""
        tz = job_zone(b.job)
        return format_html("{}<br>{} {}", instant(b.start, tz), _("to"), instant(b.end, tz))

    @admin.display(description=_("which slots"), ordering="selection")
    def which_slots(self, b: Backfill) -> str:
        return b.get_selection_display()

    @admin.display(description=_("slots queued"), ordering="slots")
    def slots_queued(self, b: Backfill) -> int:
        return b.slots

    @admin.display(description=_("order"))
    def order(self, b: Backfill) -> str:
        return str(_("newest first")) if b.newest_first else str(_("oldest first"))

    @admin.display(description=_("progress"))
    def progress(self, b: Backfill) -> SafeString:
        found: Progress | None = getattr(b, "fencedjobs_progress", None)
        if found is None:
            found = progress_of([b], clock.now())[b.pk]
        return format_html('{}<span class="fj-sub">{}</span>', found.summary, found.runs)

    @admin.display(description=_("runs"))
    def runs(self, b: Backfill) -> SafeString:
        url = runs_url(self.admin_site.name, job=b.job, kind__exact=RunKind.BACKFILL)
        return format_html('<a href="{}">{}</a>', url, _("the backfill runs of the job"))

    @admin.display(description=_("created"), ordering="created_at")
    def created(self, b: Backfill) -> SafeString | str:
        return instant(b.created_at, job_zone(b.job))

    def get_urls(self) -> list[URLPattern]:
        return [
            *admin_urls(self, ("run-once/", self.run_once_view, "run_once")),
            *super().get_urls(),
        ]

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Add backfill: *Dry run* shows what it would queue and leave; *Backfill* queues."""
        form = self._form(request, BackfillForm)
        plan: BackfillPlan | None = None
        if form.is_valid():
            values = form.cleaned_data
            try:
                plan = plan_backfill(
                    values["job"], values["start"], values["end"], selection=values["selection"]
                )
                if "_backfill" in request.POST:
                    if plan.slots:
                        return self._backfill(request, values)
                    form.add_error(
                        None,
                        f"Nothing to queue: none of the {plural(len(plan.left), 'slot')} of "
                        f"{plan.job} in this range is selected ({plan.selection}); the dry run "
                        "below says why.",
                    )
            except BackfillError as exc:
                form.add_error(None, str(exc))
                plan = None
        found = _plan_context(plan, form) if plan is not None else None
        more = {"title": _("Add backfill"), "plan": found, **(extra_context or {})}
        return self._render(request, "backfill_form", form, **more)

    def _backfill(self, request: HttpRequest, values: dict[str, Any]) -> HttpResponse:
        options = {name: values[name] for name in ("selection", "concurrency", "newest_first")}
        by = request.user.get_username()
        made, plan = backfill(
            values["job"], values["start"], values["end"], requested_by=by, **options
        )
        queued = plural(len(plan.slots), "slot")
        self.log_addition(request, made, f"Backfill: queued {queued}.")
        self.message_user(
            request, f"Queued {queued} of {made.job} for the runners.", messages.SUCCESS
        )
        site = self.admin_site.name
        if not self.has_view_permission(request, made):
            return HttpResponseRedirect(reverse(f"{site}:index"))
        return HttpResponseRedirect(reverse(f"{site}:fencedjobs_backfill_change", args=[made.pk]))

    def run_once_view(self, request: HttpRequest) -> HttpResponse:
        """Run once: a one-off of a job or instance, at an instant or now."""
        form = self._form(request, RunOnceForm)
        if form.is_valid():
            values = form.cleaned_data
            now = clock.now()
            at = now if values["at"] == NOW else values["at"]
            try:
                name = run_once(values["job"], at, kwargs=values["arguments"])
            except BackfillError as exc:
                form.add_error(None, str(exc))
            else:
                return self._queued_once(request, values["job"], name, at, now)
        return self._render(request, "run_once", form, title=_("Run once"))

    def _queued_once(
        self, request: HttpRequest, target: str, name: str, at: datetime, now: datetime
    ) -> HttpResponse:
        row = JobLease.objects.using(db.lease_db()).filter(name=name).first()
        if row is not None:  # logged as the one-off's row, the job it runs as
            self.log_addition(request, cast(Any, row), "Run once.")
        when = format_instant(at, job_zone(target))
        due = "at the next tick" if at <= now else f"at {when}"
        self.message_user(request, f"Queued a one-off run of {target}: it runs {due}.")
        url = runs_url(self.admin_site.name, job=target, kind__exact=RunKind.ONCE)
        return HttpResponseRedirect(url)

    def _form(self, request: HttpRequest, form_class: type[_Form]) -> _Form:
        """An operation's form, bound to a POST: for users who may add backfills."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        data = request.POST if request.method == "POST" else None
        return form_class(data, initial={"job": request.GET.get("job", "")})

    def _render(
        self, request: HttpRequest, template: str, form: forms.Form, **more: Any
    ) -> HttpResponse:
        """An operation's page, ``more`` (its ``title``...) in its context."""
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "form": form,
            # Laid out as the admin's own forms are, a field per row.
            "adminform": AdminForm(cast(Any, form), [(None, {"fields": list(form.fields)})], {}),
            "media": self.media + form.media,
            "has_view_permission": self.has_view_permission(request),
            "job_names": [job.name for job in registry.all() if not job.instances],
            **more,
        }
        return TemplateResponse(request, f"admin/fencedjobs/backfill/{template}.html", context)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        context = {**(extra_context or {}), "can_run_once": self.has_add_permission(request)}
        return super().changelist_view(request, context)


def _plan_context(plan: BackfillPlan, form: forms.Form) -> dict[str, Any]:
    """A dry run: the slots it would queue, in the order they would run, and those it leaves,
    at most :data:`PLAN_SHOWN` of each, in the job's zone."""
    tz = instances.get_job(plan.job).valid_schedule.tz
    queued = list(plan.slots)
    if form.cleaned_data.get("newest_first"):
        queued.reverse()
    return {
        "job": plan.job,
        "queue": [
            {
                "slot": instant(p.slot, tz),
                "attempt": p.attempt,
                "last": Outcome(p.last_outcome).label if p.last_outcome else _("no run yet"),
            }
            for p in queued[:PLAN_SHOWN]
        ],
        "queue_count": len(queued),
        "queue_more": max(len(queued) - PLAN_SHOWN, 0),
        "left": [
            {"slot": instant(slot, tz), "reason": why} for slot, why in plan.left[:PLAN_SHOWN]
        ],
        "left_count": len(plan.left),
        "left_more": max(len(plan.left) - PLAN_SHOWN, 0),
    }
