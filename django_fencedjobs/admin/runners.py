"""The runners page: every ``runjobs`` process (a loop) and every host's ``--once`` passes,
when each was last seen and whether it is live (:mod:`django_fencedjobs.runners`). Read-only:
the runners write their rows, and one gone for ``RUNNER_RETENTION`` is deleted by the next
that registers."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from django.contrib import admin
from django.db.models import DateTimeField, QuerySet, Value
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from django_fencedjobs import clock, runners
from django_fencedjobs.admin.display import ReadOnly, badge, instant
from django_fencedjobs.conf import get_settings
from django_fencedjobs.models import Runner, RunnerMode

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[Runner]
else:  # not subscriptable at run time
    _ModelAdmin = admin.ModelAdmin


def status(row: Runner, now: datetime) -> tuple[str, str]:
    """(badge class, label): live, stopping or gone for a loop; recent or old for passes."""
    settings = get_settings()
    seen = runners.Seen(
        row.owner, row.mode, row.started_at, row.last_beat_at, row.stopped_at, frozenset()
    )
    if row.mode == RunnerMode.ONCE:
        every = settings.RUNNER_PASS_INTERVAL
        if every is None or now - row.last_beat_at < every + settings.RUNNER_TIMEOUT:
            return "ok", "passes"
        return "late", "no recent pass"
    if seen.live(now):
        return ("paused", "stopped") if row.stopped_at else ("ok", "live")
    return ("removed", "stopped") if row.stopped_at else ("late", "gone")


@admin.register(Runner)
class RunnerAdmin(ReadOnly, _ModelAdmin):
    list_display = (
        "owner",
        "state",
        "last_seen",
        "mode",
        "started",
        "version",
        "workers",
        "served",
    )
    list_filter = ("mode",)
    search_fields = ("owner", "host", "jobs")
    ordering = ("-last_beat_at",)
    fields = (
        "owner",
        "state",
        "last_seen",
        "mode",
        "host",
        "pid",
        "version",
        "workers",
        "started",
        "stopped",
        "job_list",
    )
    readonly_fields = fields

    class Media:
        css = {"all": ("fencedjobs/admin.css",)}

    def get_queryset(self, request: HttpRequest) -> QuerySet[Runner]:
        """Every row, each with the page's one clock reading (``fencedjobs_now``)."""
        now = clock.now()
        return super().get_queryset(request).annotate(fencedjobs_now=Value(now, DateTimeField()))

    @staticmethod
    def _checked_at(row: Runner) -> datetime:
        found: datetime | None = getattr(row, "fencedjobs_now", None)
        return found or clock.now()

    @admin.display(description=_("state"))
    def state(self, row: Runner) -> SafeString:
        css, label = status(row, self._checked_at(row))
        timeout = get_settings().RUNNER_TIMEOUT.total_seconds()
        return badge(css, label, f"live while its last beat is under {timeout:g} s old")

    @admin.display(description=_("last seen"), ordering="last_beat_at")
    def last_seen(self, row: Runner) -> SafeString:
        ago = runners.duration_text(self._checked_at(row) - row.last_beat_at)
        return format_html("{}<br>{} ago", instant(row.last_beat_at, UTC), ago)

    @admin.display(description=_("started"), ordering="started_at")
    def started(self, row: Runner) -> SafeString | str:
        return instant(row.started_at, UTC)

    @admin.display(description=_("stopped"))
    def stopped(self, row: Runner) -> SafeString | str:
        return instant(row.stopped_at, UTC)

    @admin.display(description=_("jobs"))
    def served(self, row: Runner) -> SafeString:
        names = row.job_names
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        return format_html('<span title="{}">{}</span>', "\n".join(names), shown or "none")

    @admin.display(description=_("jobs"))
    def job_list(self, row: Runner) -> str:
        return "\n".join(row.job_names) or "none"
