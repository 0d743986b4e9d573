"""The instances pages (docs/alerting.md, "Instances"): the schedules users add, change and
delete without a deploy, with the Django permissions on instances. The form validates with
the system checks' code and writes the lease row in the same transaction; the preview lists
the next fire times, each daylight-saving transition marked (:func:`fire_times`); the list
stays flat at 100,000 instances: ordered by ``(job, key)``, the unique constraint's index,
and no ``COUNT(*)`` of the table (:class:`InstancePaginator`).
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import math
import zoneinfo
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import NON_FIELD_ERRORS, PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db import DatabaseError
from django.db.models import Min, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.urls import URLPattern, reverse
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext_lazy as _

from django_fencedjobs import calendars, clock, db, health, operations, runners
from django_fencedjobs.admin.display import (
    admin_urls,
    badge,
    breakable,
    health_badge,
    health_of,
    instant,
    last_run_cell,
    run_url,
    runs_url,
    state_badge,
)
from django_fencedjobs.admin.jobs import may_operate
from django_fencedjobs.exceptions import ScheduleError, UnknownJob
from django_fencedjobs.instances import declared, instance_job, validate
from django_fencedjobs.instants import format_instant, iso_utc, zone_name
from django_fencedjobs.listing import describe_schedule
from django_fencedjobs.models import JobInstance, JobLease, JobRun, Outcome
from django_fencedjobs.registry import registry
from django_fencedjobs.schedule import Schedule, is_fixed_offset, resolve_zone

__all__ = ["JobInstanceAdmin", "fire_times", "preview"]

#: Fire times the preview lists.
PREVIEW_TIMES = 10
#: Runs listed on an instance's page (the latest; all of them a click away).
RECENT_RUNS = 5
#: The key the preview assumes while the add form has none (the jitter's offset depends on it).
_KEY_PLACEHOLDER = "key"
#: A gap's or repeated hour's wall times named one by one, at most.
_NAMED_WALLS = 4
_ONE_US = timedelta(microseconds=1)

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[JobInstance]
    _ModelForm = forms.ModelForm[JobInstance]
    _Paginator = Paginator[Any]
else:  # not subscriptable at run time
    _ModelAdmin = admin.ModelAdmin
    _ModelForm = forms.ModelForm
    _Paginator = Paginator


# -- the preview: the next fire times, each DST transition marked ----------------------------


@dataclass(frozen=True)
class FireTime:
    """A fire time (aware UTC) and what a DST transition does there: ``kind`` ``gap``,
    ``repeated`` (a wall time that happens twice) or ``change`` (none moved or doubled)."""

    at: datetime
    kind: str = ""
    note: str = ""


@dataclass(frozen=True)
class Preview:
    """The fire times in ``tz``, or the check's ``error`` (on ``field``), or a ``hint`` when
    there is nothing to preview yet."""

    times: tuple[FireTime, ...] = ()
    tz: tzinfo = UTC
    words: str = ""
    error: str = ""
    field: str = ""
    hint: str = ""

    def as_json(self) -> dict[str, Any]:
        tz = self.tz
        times = [
            {"at": iso_utc(t.at), "local": format_instant(t.at, tz), "kind": t.kind, "note": t.note}
            for t in self.times
        ]
        texts = {"words": self.words, "error": self.error, "field": self.field, "hint": self.hint}
        return {"timezone": zone_name(tz), "times": times, **texts}


def preview(instance: JobInstance, now: datetime, count: int = PREVIEW_TIMES) -> Preview:
    """The next ``count`` fire times of ``instance`` after ``now``, as a runner would fire
    them (:func:`~django_fencedjobs.instances.instance_job`); or why there are none, in the
    system check's words. Bad arguments alone (``fencedjobs.E012``) do not hide the times:
    the form says what is wrong with them."""
    if not instance.job:
        return Preview(hint=str(_("Choose a job to see the next fire times.")))
    if not instance.cron and instance.every is None:
        return Preview(hint=str(_("Give a cron expression or an interval (every).")))
    try:
        base = declared(instance.job)
    except UnknownJob as exc:
        return Preview(error=str(exc), field="job")
    hint = ""
    if not instance.key:
        instance = copy.copy(instance)
        instance.key = _KEY_PLACEHOLDER
        if instance.jitter:
            hint = str(_("The jitter's offset comes from the key: give one for exact times."))
    found = _schedule_problem(instance)
    if found is not None:
        return Preview(error=found[1], field=found[0])
    job = instance_job(base, instance)
    schedule = job.schedule or job.parsed_schedule
    if schedule is None:  # never: a problem other than the arguments' was returned above
        return Preview(error=str(job.schedule_error))
    times = fire_times(schedule, now, count)
    if job.exclude:  # what its calendars do to each, as a runner would judge it
        book = calendars.load(job.exclude)
        for i, t in enumerate(times):
            if verdict := calendars.judge(book, job, t.at):
                times[i] = FireTime(t.at, "excluded", f"{verdict.outcome}: {verdict.why}")
    return Preview(times=tuple(times), tz=schedule.tz, words=describe_schedule(schedule), hint=hint)


def _schedule_problem(instance: JobInstance) -> tuple[str, str] | None:
    """``(field, message)`` of what the checks find wrong with ``instance``'s schedule, as the
    form shows it (``... (fencedjobs.E001)``); None when it is fine."""
    try:
        validate(instance)
    except ValidationError as exc:
        errors = (
            exc.message_dict if hasattr(exc, "error_dict") else {NON_FIELD_ERRORS: exc.messages}
        )
        for field, found in errors.items():
            if field != "kwargs":
                return ("" if field == NON_FIELD_ERRORS else field), " ".join(found)
    return None


def fire_times(schedule: Schedule, after: datetime, count: int = PREVIEW_TIMES) -> list[FireTime]:
    """The next ``count`` fire times of ``schedule`` after ``after``, each with what a DST
    transition does to it (:class:`FireTime`). The schedule's rules (ISC cron's) apply to a
    fire time before its jitter, so that is what is examined."""
    result = []
    previous = after - schedule.offset
    for at in itertools.islice(schedule.iter_after(after), count):
        base = at - schedule.offset
        result.append(FireTime(at, *_dst_note(schedule, base, previous)))
        previous = base
    return result


@dataclass(frozen=True)
class _Change:
    """A change of a zone's UTC offset: at ``at`` (the first instant of the new offset) the
    wall clock goes from ``before`` to ``after`` (naive wall times)."""

    at: datetime
    before: datetime
    after: datetime
    old: str
    new: str

    @property
    def forward(self) -> bool:
        return self.after > self.before

    def words(self, on_day: datetime | None = None) -> str:
        """``clocks go forward at 02:00 to 03:00 (CET to CEST)``; with the date when it is
        not ``on_day``'s."""
        direction = "forward" if self.forward else "back"
        other_day = on_day is not None and on_day.date() != self.before.date()
        date = f" on {self.before:%Y-%m-%d}" if other_day else ""
        return (
            f"clocks go {direction}{date} at {_hm(self.before)} to {_hm(self.after)} "
            f"({self.old} to {self.new})"
        )


def _dst_note(schedule: Schedule, base: datetime, previous: datetime) -> tuple[str, str]:
    local = base.astimezone(schedule.tz)
    other = local.replace(fold=1 - local.fold)
    if other.utcoffset() != local.utcoffset():
        return "repeated", _repeated(schedule, local, other)
    change = _transition(schedule.tz, previous, base)
    if change is None:
        return "", ""
    return (
        _forward(schedule, change, base, local)
        if change.forward
        else ("change", change.words(local))
    )


def _repeated(schedule: Schedule, local: datetime, other: datetime) -> str:
    """A wall time that happens twice: which occurrence ``local`` is, and, for the first,
    whether the second runs too (a fixed-time expression runs once, at the first)."""
    wall = _hm(local + schedule.offset)  # the fire time's, jitter and all
    first, second = (local, other) if local.fold == 0 else (other, local)
    change = _transition(schedule.tz, first.astimezone(UTC), second.astimezone(UTC))
    words = change.words(local) if change is not None else "clocks go back"
    if local.fold == 1:
        return f"{wall} again: {words}; this is the second {wall} ({local.tzname()})"
    at = second.astimezone(UTC) + schedule.offset
    if schedule.fire_times(at - _ONE_US, at, limit=1):
        return (
            f"{wall} happens twice: {words}; this is the first {wall} ({local.tzname()}), "
            f"the second runs too"
        )
    return f"{wall} happens twice: {words}; runs once, at the first {wall} ({local.tzname()})"


def _forward(
    schedule: Schedule, change: _Change, base: datetime, local: datetime
) -> tuple[str, str]:
    """Clocks went forward since the previous fire time: the expression's wall times that did
    not exist, and where their run went (a fixed-time expression, minute and hour not ``*``,
    runs at the first instant after the gap; any other at the real instants only)."""
    words = change.words(local)
    skipped = _walls_between(schedule, change.before, change.after)
    if not skipped:
        return "change", words
    if len(skipped) > _NAMED_WALLS:
        missing = f"{_hm(change.before)} to {_hm(change.after)} does not exist"
    else:
        names = [_hm(wall) for wall in skipped]
        named = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        missing = f"{named} {'does' if len(names) == 1 else 'do'} not exist"
    crontab = schedule.crontab
    fixed = crontab is not None and not any(f.startswith("*") for f in crontab.split()[:2])
    if fixed and base == change.at:
        jitter = " plus its jitter" if schedule.offset else ""
        return "gap", f"{words}: {missing}, runs at {_hm(change.after)}{jitter}"
    return "gap", f"{words}: {missing}, no run then"


def _walls_between(schedule: Schedule, start: datetime, end: datetime) -> list[datetime]:
    """The wall times in ``[start, end)`` (naive) the cron expression names, at most one more
    than :data:`_NAMED_WALLS`: its fire times on a UTC clock, where wall time is instant."""
    if schedule.crontab is None:
        return []
    first, last = start.replace(tzinfo=UTC) - _ONE_US, end.replace(tzinfo=UTC) - _ONE_US
    return Schedule(schedule.crontab).fire_times(first, last, limit=_NAMED_WALLS + 1)


def _transition(tz: tzinfo, start: datetime, end: datetime) -> _Change | None:
    """The change of ``tz``'s UTC offset in ``(start, end]``, to the second (the last one,
    when there are several); None when the offset at both ends is the same."""

    def offset(second: int) -> timedelta | None:
        return datetime.fromtimestamp(second, UTC).astimezone(tz).utcoffset()

    lo, hi = math.floor(start.timestamp()), math.ceil(end.timestamp())
    old, new = offset(lo), offset(hi)
    if old == new or old is None or new is None:
        return None
    while hi - lo > 1:  # offset(lo) != new == offset(hi)
        mid = (lo + hi) // 2
        if offset(mid) == new:
            hi = mid
        else:
            lo = mid
    at = datetime.fromtimestamp(hi, UTC)
    before, after = at.astimezone(tz) - _ONE_US, at.astimezone(tz)
    return _Change(
        at=at,
        before=(at + (offset(lo) or timedelta(0))).replace(tzinfo=None),
        after=after.replace(tzinfo=None),
        old=before.tzname() or "",
        new=after.tzname() or "",
    )


def _hm(wall: datetime) -> str:
    """``02:30``; ``02:30:15`` when it has seconds."""
    return f"{wall:%H:%M:%S}" if wall.second else f"{wall:%H:%M}"


def render_preview(found: Preview) -> SafeString:
    """The preview's markup: the schedule in words, the fire times (each transition's note
    below its time); or the check's message."""
    if found.error:
        return format_html('<p class="fj-preview-error errornote">{}</p>', found.error)
    hint = format_html('<p class="fj-preview-hint">{}</p>', found.hint) if found.hint else ""
    if not found.times:
        return mark_safe(hint)
    items = format_html_join(
        "",
        '<li class="{}" data-at="{}">{}{}</li>',
        (
            (
                f"fj-dst fj-dst-{t.kind}" if t.kind else "",
                iso_utc(t.at),
                instant(t.at, found.tz),
                format_html('<span class="fj-dst-note">{}</span>', t.note) if t.note else "",
            )
            for t in found.times
        ),
    )
    return format_html(
        '<p class="fj-preview-words">{}</p><ol class="fj-fire-times fj-preview-times">{}</ol>{}',
        found.words,
        items,
        hint,
    )


# -- the form --------------------------------------------------------------------------------


def _instanced_jobs() -> list[tuple[str, str]]:
    """The choices of the job field: the declared jobs with instances."""
    names = sorted(job.name for job in registry.all() if job.instances)
    return [("", "---------"), *((name, name) for name in names)]


@functools.cache
def _zone_names() -> tuple[str, ...]:
    """The IANA zones a schedule accepts (not fixed offsets), for the zone field."""
    names = zoneinfo.available_timezones()
    return tuple(sorted(name for name in names if not is_fixed_offset(name)))


class ZoneInput(forms.TextInput):
    """A zone's name, every accepted zone suggested (a ``<datalist>``: typing filters it)."""

    list_id = "fj-zone-names"

    def __init__(self, attrs: dict[str, Any] | None = None) -> None:
        super().__init__({"list": self.list_id, "autocomplete": "off", **(attrs or {})})

    def render(
        self, name: str, value: Any, attrs: dict[str, Any] | None = None, renderer: Any = None
    ) -> SafeString:
        options = format_html_join("", '<option value="{}">', ((zone,) for zone in _zone_names()))
        return format_html(
            '{}<datalist id="{}">{}</datalist>',
            super().render(name, value, attrs, renderer),
            self.list_id,
            options,
        )


class InstanceForm(_ModelForm):
    job = forms.ChoiceField(label=_("Job"), choices=_instanced_jobs)

    class Meta:
        model = JobInstance
        exclude = ("paused",)  # jobctl's; the admin's fieldsets choose and order the rest
        widgets = {"timezone": ZoneInput(), "kwargs": forms.Textarea(attrs={"rows": 3})}
        help_texts = {
            "key": _(
                "Unique within its job, and fixed once saved: its runs are recorded as job[key]."
            ),
            "every": _("An interval instead of cron, e.g. 00:15:00 (15 minutes)."),
            "timezone": _("An IANA zone such as Europe/Berlin; fixed offsets are refused."),
            "jitter": _(
                "Spreads instances that share a schedule: a stable offset below it, e.g. 00:03:00."
            ),
            "timeout": _(
                "This instance's own, shorter than its shortest interval, e.g. 00:00:50. "
                "Empty: the job's (declared in code)."
            ),
            "grace": _("Slack past the timeout before a missing run is late. Empty: the job's."),
        }


# -- the list: filters, a paginator that does not count the table ----------------------------


class InstancePaginator(_Paginator):
    """Pages of instances that never count the whole table. The unfiltered list on
    PostgreSQL takes the planner's estimate; otherwise a ``COUNT`` over a ``LIMIT``ed
    subquery, bounded by :attr:`exact_below` or :attr:`pages_ahead` pages past the page
    asked for: past it the count is a lower bound (:attr:`more`), and a filtered list costs
    no more than the unfiltered one."""

    exact_below = 10_000
    pages_ahead = 10
    #: The count is the planner's estimate.
    estimated = False
    #: More rows match than the count says: more than ``bound``.
    more = False
    bound = 0

    def __init__(self, *args: Any, page: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requested = page

    @cached_property
    def count(self) -> int:
        rows = self.object_list
        if not isinstance(rows, QuerySet):
            return super().count
        if not rows.query.where:
            estimate = db.estimated_rows(rows)
            if estimate is not None and estimate >= self.exact_below:
                self.estimated = True
                return estimate
        bound = max(self.exact_below, (self.requested + self.pages_ahead) * self.per_page)
        counted = rows.order_by()[: bound + 1].count()
        if counted <= bound:
            return counted
        self.more, self.bound = True, bound
        return bound + self.per_page  # one page past the bound, which has rows


class JobFilter(admin.SimpleListFilter):
    """The declared jobs with instances (never a ``SELECT DISTINCT`` over the instances)."""

    title = _("job")
    parameter_name = "job"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return _instanced_jobs()[1:]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[JobInstance]
    ) -> QuerySet[JobInstance]:
        return queryset.filter(job=self.value()) if self.value() else queryset


#: An instance's state by its row and its lease row (paused while the instance is disabled,
#: paused or invalid): invalid is enabled and not paused, but its lease row paused.
STATES: dict[str, Q] = {
    "enabled": Q(enabled=True, paused=False, lease__paused=False),
    "disabled": Q(enabled=False),
    "paused": Q(enabled=True, paused=True),
    "invalid": Q(enabled=True, paused=False, lease__paused=True),
}
#: The health states to look at, found by the lease row alone (:func:`_troubled`): its
#: stored deadline passed (by the index), failures in a row, or no live runner.
TROUBLE = ("late", "failing", "no runner")


def state_of(instance: JobInstance) -> str:
    if not instance.enabled:
        return "disabled"
    if instance.paused:
        return "paused"
    lease = _lease(instance)
    return "invalid" if lease is not None and lease.paused else "enabled"


def _lease(instance: JobInstance) -> JobLease | None:
    try:
        return instance.lease
    except JobLease.DoesNotExist:
        return None


def _troubled(state: str, now: datetime) -> Q:
    """The enabled instances that may be in ``state`` (of :data:`TROUBLE`)."""
    running = STATES["enabled"]
    if state == "late":
        return running & Q(lease__late_after__lt=now)
    if state == "failing":
        return running & Q(lease__consecutive_failures__gt=0)
    # Each job with instances declared in code, and when its first instance's row was made.
    first_seen = (
        JobLease.objects.using(db.lease_db())
        .filter(instance__isnull=False, parent__in=[j.name for j in registry.all() if j.instances])
        .order_by()
        .values("parent")
        .annotate(first=Min("created_at"))
    )
    coverage = runners.read(now)
    unserved = [
        row["parent"]
        for row in first_seen
        if coverage.problem(row["parent"], row["first"], lambda at: format_instant(at, UTC))
        is not None
    ]
    return running & Q(job__in=unserved)


class StateFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(state, state) for state in [*STATES, *TROUBLE]]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[JobInstance]
    ) -> QuerySet[JobInstance]:
        value = self.value()
        if value in STATES:
            return queryset.filter(STATES[value])
        if value in TROUBLE:
            return queryset.filter(_troubled(value, clock.now()))
        return queryset


@admin.register(JobInstance)
class JobInstanceAdmin(_ModelAdmin):
    form = InstanceForm
    list_display = ("key", "job_name", "schedule", "state", "health", "last_run", "next_run")
    list_display_links = ("key",)
    list_filter = (JobFilter, StateFilter)
    list_select_related = ("lease",)
    search_fields = ("key", "job")
    # (job, key): the unique constraint's index serves the order, and the page is its first
    # rows; no other column sorts (one would sort every row to show 100).
    ordering = ("job", "key")
    sortable_by = ()
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    list_per_page = 100
    actions = ("enable", "disable")
    fieldsets = (
        (None, {"fields": ("job", "key", "enabled")}),
        (_("Schedule"), {"fields": ("cron", "every", "timezone", "jitter", "fire_preview")}),
        (_("Calendars"), {"fields": ("exclude",)}),
        (_("Limits"), {"fields": ("timeout", "grace")}),
        (_("Arguments"), {"fields": ("kwargs",)}),
    )
    #: Shown on an instance's page, once it exists.
    runs_fieldset = (_("Runs"), {"fields": ("run_name", "lease_state", "recent_runs")})

    class Media:
        css = {"all": ("fencedjobs/admin.css", "fencedjobs/instances.css")}
        js = ("fencedjobs/instance_preview.js",)

    # -- the form ----------------------------------------------------------------------------

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """Saving waits a bounded time for the lease row (a run of the instance inside a
        fenced transaction holds it): past that, nothing is saved and the form says so."""
        context = {**(extra_context or {}), "can_operate": self.has_operate_permission(request)}
        try:
            return super().changeform_view(request, object_id, form_url, context)
        except DatabaseError as exc:
            if not db.is_lock_timeout(exc):
                raise
            self.message_user(
                request,
                _(
                    "Not saved: a run of this instance holds its lease row right now (inside "
                    "a fenced transaction). Nothing was changed; try again in a moment."
                ),
                messages.ERROR,
            )
            return HttpResponseRedirect(request.get_full_path())

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        """The job and key are the instance's identity (its name, ``job[key]``, is its
        lease's, runs' and watermarks'): fixed once it exists."""
        if obj is None:
            return ("fire_preview",)
        return ("job", "key", "fire_preview", "run_name", "lease_state", "recent_runs")

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        return fieldsets if obj is None else [*fieldsets, self.runs_fieldset]

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        """An instance's lease row goes with it: no permission on the jobs (read-only, so
        nobody has it) is asked for."""
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        perms_needed = {p for p in perms_needed if p != JobLease._meta.verbose_name}
        return deleted, counts, perms_needed, protected

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        """The page's instances, each with its health (:func:`health_of`): a constant number of
        queries, whatever the number of instances."""
        changelist = super().get_changelist_instance(request)
        rows = list(changelist.result_list)
        names = [row.name for row in rows if _lease(row) is not None]
        healths = {h.name: h for h in health.all_health(names, now=clock.now())} if names else {}
        for row in rows:
            setattr(row, "fencedjobs_health", healths.get(row.name))  # noqa: B010
        changelist.result_list = rows
        return changelist

    @admin.display(description=_("health"))
    def health(self, instance: JobInstance) -> SafeString | str:
        """Its state as ``checkjobs`` reads it (late, failing, no runner, ok...)."""
        h = health_of(instance)
        return health_badge(h) if h else "-"

    @admin.display(description=_("last run"))
    def last_run(self, instance: JobInstance) -> SafeString | str:
        """The last run; the last success and the failures in a row below."""
        h = health_of(instance)
        if h is None:
            return "-"
        notes: list[tuple[Any, Any]] = [
            (_("last success"), instant(h.last_success_at, h.tz) if h.last_success_at else "never")
        ]
        if h.consecutive_failures:
            notes.append((_("failures in a row"), h.consecutive_failures))
        sub = format_html_join("", '<span class="fj-sub">{}: {}</span>', notes)
        run = h.last_run
        if run is None:
            return format_html("-{}", sub)
        return last_run_cell(run, h.tz, str(Outcome(run.outcome).label), sub)

    @admin.display(description=_("job"))
    def job_name(self, instance: JobInstance) -> SafeString:
        return format_html('<span class="fj-name">{}</span>', breakable(instance.job))

    @admin.display(description=_("schedule"))
    def schedule(self, instance: JobInstance) -> SafeString:
        """The expression (or interval) and its zone; in words below, when it parses."""
        what = instance.cron or f"every {instance.every}"
        words = _words(instance.cron, instance.every, instance.timezone, instance.jitter)
        return format_html('<code>{}</code><span class="fj-sub">{}</span>', what, words)

    @admin.display(description=_("next run"))
    def next_run(self, instance: JobInstance) -> SafeString | str:
        lease = _lease(instance)
        if lease is None:
            return "-"
        if lease.paused:  # its next run time is not a promise while it is paused
            return str(_("paused"))
        return instant(lease.next_run_at, _zone(instance.timezone))

    @admin.display(description=_("state"))
    def state(self, instance: JobInstance) -> SafeString:
        """Invalid: enabled, but its lease row is paused (the check's message on hover)."""
        found = state_of(instance)
        problem = _schedule_problem(instance) if found == "invalid" else None
        css = {"enabled": "ok", "invalid": "invalid"}.get(found, "paused")
        return badge(css, found, problem[1] if problem else "")

    # -- an instance's page ------------------------------------------------------------------

    @admin.display(description=_("next fire times"))
    def fire_preview(self, instance: JobInstance) -> SafeString:
        """Refilled by the script while the form is edited (the job and key, read-only on a
        change page, ride along as data)."""
        url = reverse(f"{self.admin_site.name}:fencedjobs_jobinstance_preview")
        attrs = {"data-url": url}
        if instance.pk is not None:
            attrs.update({"data-job": instance.job, "data-key": instance.key})
        return format_html(
            '<div class="fj-preview" aria-live="polite" {}>{}</div>',
            format_html_join(" ", '{}="{}"', attrs.items()),
            render_preview(preview(instance, clock.now())),
        )

    @admin.display(description=_("runs as"))
    def run_name(self, instance: JobInstance) -> SafeString:
        return format_html('<span class="fj-name">{}</span>', breakable(instance.name))

    @admin.display(description=_("lease"))
    def lease_state(self, instance: JobInstance) -> SafeString | str:
        """Its health when :mod:`django_fencedjobs.health` knows it, and its lease row's facts."""
        lease = _lease(instance)
        if lease is None:
            return "-"
        tz = _zone(instance.timezone)
        facts = [
            (_("next run"), instant(lease.next_run_at, tz)),
            (_("last success"), instant(lease.last_success_at, tz)),
            (_("failures in a row"), lease.consecutive_failures),
            (_("paused"), _("yes") if lease.paused else _("no")),
        ]
        try:
            known = health.job_health(instance.name)
        except UnknownJob:
            known = None
        if known is not None and known.job is not None:  # else read as a job removed from code
            badged = state_badge(known.state.value, known.reason)
            facts.insert(0, (_("health"), format_html("{} {}", badged, known.reason)))
        return format_html(
            '<dl class="fj-facts">{}</dl>', format_html_join("", "<dt>{}</dt><dd>{}</dd>", facts)
        )

    @admin.display(description=_("recent runs"))
    def recent_runs(self, instance: JobInstance) -> SafeString:
        """Its latest runs (by the runs' ``(job, -scheduled_for)`` index), and a link to all."""
        site = self.admin_site.name
        runs = (
            JobRun.objects.using(db.lease_db())
            .filter(job=instance.name)
            .order_by("-scheduled_for")[:RECENT_RUNS]
        )
        tz = _zone(instance.timezone)
        items = format_html_join(
            "",
            '<li><a href="{}">{}</a> {}</li>',
            (
                (
                    run_url(site, run.pk),
                    instant(run.scheduled_for, tz),
                    badge(run.outcome, str(Outcome(run.outcome).label)),
                )
                for run in runs
            ),
        )
        listed = (
            format_html('<ul class="fj-recent-runs">{}</ul>', items)
            if items
            else format_html('<p class="fj-recent-runs">{}</p>', _("None yet."))
        )
        return format_html(
            '{}<a class="fj-all-runs" href="{}">{}</a>',
            listed,
            runs_url(site, job=instance.name),
            _("All runs of this instance"),
        )

    # -- the list ----------------------------------------------------------------------------

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: Any,
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> InstancePaginator:
        try:
            page = max(int(request.GET.get("p", 1)), 1)
        except ValueError:
            page = 1
        return InstancePaginator(queryset, per_page, orphans, allow_empty_first_page, page=page)

    @admin.action(description=_("Enable"), permissions=["change"])
    def enable(self, request: HttpRequest, queryset: QuerySet[JobInstance]) -> None:
        self._set_enabled(request, queryset, enabled=True)

    @admin.action(description=_("Disable"), permissions=["change"])
    def disable(self, request: HttpRequest, queryset: QuerySet[JobInstance]) -> None:
        self._set_enabled(request, queryset, enabled=False)

    def _set_enabled(
        self, request: HttpRequest, queryset: QuerySet[JobInstance], *, enabled: bool
    ) -> None:
        """Save each selected instance not already so: its lease row follows in the save's
        transaction. One whose lease row a run keeps locked is left as it was, and named."""
        done, busy = [], []
        for instance in _to_change(queryset, enabled):
            instance.enabled = enabled
            try:
                instance.save(update_fields=["enabled", "updated_at"])
            except DatabaseError:
                busy.append(instance.name)
                continue
            self.log_change(request, instance, "Enabled." if enabled else "Disabled.")
            done.append(instance.name)
        verb = "enabled" if enabled else "disabled"
        if done:
            self.message_user(
                request, f"{verb.capitalize()} {len(done)}: {_listed(done)}.", messages.SUCCESS
            )
        if busy:
            self.message_user(
                request,
                f"Busy, not {verb}: {_listed(busy)} (a run kept the lease row locked for "
                f"{db.LOCK_WAIT:g}s); try again.",
                messages.ERROR,
            )
        if not done and not busy:
            self.message_user(request, f"Nothing to do: already {verb}.", messages.WARNING)

    # -- run now, and the preview while editing ----------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        return [
            *admin_urls(
                self,
                ("preview/", self.preview_view, "preview"),
                ("<path:object_id>/run-now/", self.run_now_view, "run_now"),
            ),
            *super().get_urls(),
        ]

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return may_operate(request)  # run now, as on a job's page

    def run_now_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Run now (POST): the lease row is made due; a runner still acquires it at its next
        tick. A disabled, paused or invalid instance does not run: the page says so."""
        if request.method != "POST" or not self.has_operate_permission(request):
            raise PermissionDenied
        instance = self.get_object(request, object_id)
        if instance is None:
            raise Http404(f"no instance with the id {object_id!r}")
        back = HttpResponseRedirect(
            reverse(f"{self.admin_site.name}:fencedjobs_jobinstance_change", args=[instance.pk])
        )
        state = state_of(instance)
        if state != "enabled":
            self.message_user(
                request, f"{instance.name} is {state}: it does not run.", messages.WARNING
            )
            return back
        now = clock.now()
        change = operations.make_due(instance.name, now)
        if change is operations.Change.DONE:
            when = format_instant(now, _zone(instance.timezone))
            self.log_change(request, instance, f"Run now: made due at {when}.")
            self.message_user(request, f"{instance.name}: made due, it will run at the next tick.")
        elif change is operations.Change.UNCHANGED:
            self.message_user(request, f"{instance.name} is due already.")
        else:
            self.message_user(
                request,
                f"{instance.name}: a run holds its lease row right now; try again in a moment.",
                messages.WARNING,
            )
        return back

    def preview_view(self, request: HttpRequest) -> JsonResponse:
        """The preview of the form's fields as typed (the query string), as JSON with the
        markup the page shows; for users who may add or view instances."""
        if not (self.has_add_permission(request) or self.has_view_or_change_permission(request)):
            raise PermissionDenied
        instance, wrong = _instance_from(request.GET)
        found = Preview(error=wrong[1], field=wrong[0]) if wrong else preview(instance, clock.now())
        return JsonResponse({**found.as_json(), "html": str(render_preview(found))})


def _instance_from(values: Any) -> tuple[JobInstance, tuple[str, str] | None]:
    """An unsaved instance from the form's values as typed; ``(field, message)`` for a
    duration that does not parse. Arguments that are not JSON are left out (the form says
    so)."""
    instance = JobInstance(
        job=values.get("job", ""),
        key=values.get("key", ""),
        cron=values.get("cron", "").strip(),
        timezone=values.get("timezone", "").strip() or "UTC",
    )
    blanks = {"every": None, "jitter": timedelta(0), "timeout": None, "grace": None}
    for field, blank in blanks.items():
        text = values.get(field, "").strip()
        try:
            parsed = forms.DurationField().to_python(text) if text else blank
        except ValidationError as exc:
            return instance, (field, f"{field}: {' '.join(exc.messages)}")
        setattr(instance, field, parsed)
    try:
        kwargs = json.loads(values.get("kwargs", "") or "{}")
    except ValueError:
        kwargs = {}
    instance.kwargs = kwargs if isinstance(kwargs, dict) else {}
    try:
        exclude = json.loads(values.get("exclude", "") or "[]")
    except ValueError:
        exclude = []
    instance.exclude = (
        [n for n in exclude if isinstance(n, str)] if isinstance(exclude, list) else []
    )
    return instance, None


def _to_change(
    queryset: QuerySet[JobInstance], enabled: bool, chunk: int = 500
) -> Iterable[JobInstance]:
    """The selected instances not already ``enabled``, a chunk at a time (keys read first:
    saving them changes what the selection matches)."""
    pks = list(queryset.exclude(enabled=enabled).order_by().values_list("pk", flat=True))
    for start in range(0, len(pks), chunk):
        yield from JobInstance.objects.using(queryset.db).filter(pk__in=pks[start : start + chunk])


def _listed(names: list[str], shown: int = 10) -> str:
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


@functools.lru_cache(maxsize=1024)
def _words(cron: str, every: timedelta | None, timezone: str, jitter: timedelta) -> str:
    """A schedule in words (its zone alone when it does not parse), cached: a page of
    instances shares a few schedules."""
    try:
        schedule = Schedule(cron=cron or None, every=every, timezone=timezone, jitter=jitter)
    except (ScheduleError, TypeError):
        return timezone
    return describe_schedule(schedule)


def _zone(name: str) -> tzinfo:
    try:
        return resolve_zone(name)
    except ScheduleError:
        return UTC
