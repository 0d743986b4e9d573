"""What the admin's pages share: badges, instants written the app's one way
(:mod:`django_fencedjobs.instants`) in the zone of the job they belong to, long text
shortened with the whole of it a click away, and links and URLs."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, tzinfo
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.contrib.admin import ModelAdmin
from django.http import HttpRequest
from django.urls import URLPattern, path, reverse
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _

from django_fencedjobs.instants import format_instant, is_utc, iso_utc
from django_fencedjobs.models import Outcome
from django_fencedjobs.registry import registry

if TYPE_CHECKING:
    from django_fencedjobs.health import JobHealth, RunSummary

#: The most characters of a reason or an error a list shows before "more".
SHORT_CHARS = 70
#: A name this short fits the narrowest column it is shown in: it is never wrapped.
UNWRAPPED_CHARS = 16


def badge(state: str, label: str, title: str = "") -> SafeString:
    return format_html('<span class="fj-badge fj-{}" title="{}">{}</span>', state, title, label)


def state_badge(state: str, reason: str) -> SafeString:
    return badge(state, state.replace("_", " "), reason)


def health_badge(h: JobHealth) -> SafeString:
    """A job's state as a badge, the reason on hover: failing as a warning in amber and
    critical in red, labelled so (``failing (warning)``), as checkjobs writes them."""
    state, severity = h.state.value, h.severity.value
    if state == "failing":
        return badge(f"failing-{severity}", f"failing ({severity})", h.reason)
    return state_badge(state, h.reason)


def health_of(row: object) -> JobHealth | None:
    """The health decided in this request for a job's or instance's row (``fencedjobs_health``);
    None for a row recorded since."""
    found: JobHealth | None = getattr(row, "fencedjobs_health", None)
    return found


def run_instant(run: RunSummary) -> datetime | None:
    """When a run ended; while it runs, when it started."""
    return run.started_at if run.outcome == Outcome.RUNNING else run.finished_at


def last_run_cell(run: RunSummary, tz: tzinfo, label: str, below: SafeString) -> SafeString:
    """A run's outcome badge (its error on hover) and :func:`run_instant`, ``below`` them."""
    outcome = badge(run.outcome, label, run.error_excerpt)
    return format_html("{}<br>{}{}", outcome, instant(run_instant(run), tz), below)


def instant(value: datetime | None, tz: tzinfo, *, ref: datetime | None = None) -> SafeString | str:
    """``value`` in ``tz`` to the second, and below it in UTC unless ``tz`` is UTC; on the
    local day of ``ref`` (an instant earlier in the row), the time alone. A narrow column
    may wrap it before its zone, never inside its date and time."""
    if value is None:
        return "-"
    local = format_html(
        '<time class="fj-when" datetime="{}">{}</time>',
        iso_utc(value),
        _unbroken(format_instant(value, tz, ref=ref)),
    )
    if is_utc(tz):
        return local
    utc = format_instant(value, UTC, ref=ref)
    if not utc.endswith(" UTC"):  # the time alone: say which zone it is in
        utc = f"{utc} UTC"
    return format_html('{}<br><span class="fj-utc">{}</span>', local, _unbroken(utc))


def _unbroken(text: str) -> SafeString:
    """A date and time in one unbreakable piece, its zone after it; anything else in one."""
    parts = text.split(" ")
    if len(parts) == 3:  # date, time, zone (an IANA name has no space)
        return format_html('<span class="fj-nw">{} {}</span> {}', *parts)
    return format_html('<span class="fj-nw">{}</span>', text)


def breakable(name: str) -> SafeString:
    """A dotted name a narrow column wraps after a dot or underscore, never inside a word."""
    if len(name) <= UNWRAPPED_CHARS:
        return escape(name)
    return mark_safe(re.sub(r"([._])", r"\1<wbr>", str(escape(name))))


def owner_label(owner: str) -> SafeString | str:
    """A run's owner (``host:pid``) for a list: a fully qualified host by its first label
    (``ip-10-20-31-147:48211``), the whole of it on hover; the run's page has it whole."""
    host, sep, pid = owner.rpartition(":")
    if not sep or "." not in host:
        return owner or "-"
    return format_html('<span title="{}">{}:{}</span>', owner, host.split(".", 1)[0], pid)


def shortened(
    text: str,
    *,
    limit: int = SHORT_CHARS,
    css: str = "",
    whole: SafeString | None = None,
    more: str | None = None,
) -> SafeString:
    """``text`` whole when it is short; else its first clauses (up to ``; ``), or its first
    words, with the whole of it one click away (a ``<details>``, no script). ``whole``: what
    the click shows instead of ``text`` (a traceback), offered however short ``text`` is."""
    classes = f"fj-text {css}".strip()
    if whole is None and len(text) <= limit:
        return format_html('<span class="{}">{}</span>', classes, text)
    head = text if len(text) <= limit else f"{_head(text, limit)}…"
    return format_html(
        '<details class="fj-more {}"><summary><span class="fj-short">{} '
        '<span class="fj-toggle">{}</span></span><span class="fj-toggle fj-less">{}</span>'
        '</summary><div class="fj-full">{}</div></details>',
        classes,
        head,
        more or _("more"),
        _("less"),
        text if whole is None else whole,
    )


def _head(text: str, limit: int) -> str:
    """The first clauses of ``text`` that fit in ``limit``; else its first words or chars."""
    head = ""
    for clause in text.split("; "):
        longer = f"{head}; {clause}" if head else clause
        if len(longer) > limit:
            break
        head = longer
    if head:
        return head.rstrip(" ;:,.")
    words = text[:limit].rsplit(" ", 1)[0]
    return (words if len(words) >= limit // 2 else text[:limit]).rstrip(" ;:,.")


def job_zone(name: str) -> tzinfo:
    """The zone of the job declared as ``name``; UTC for one that is not declared or whose
    schedule is invalid (as ``JobHealth.tz``)."""
    job = registry.get(name) if name in registry else None
    schedule = job.schedule if job is not None else None
    return schedule.tz if schedule is not None else UTC


def plural(n: int, word: str, suffix: str = "s") -> str:
    """``1 slot``, ``2 slots``."""
    return f"{n} {word}{'' if n == 1 else suffix}"


def run_url(site: str, pk: int) -> str:
    return reverse(f"{site}:fencedjobs_jobrun_change", args=[pk])


def runs_url(site: str, **query: str) -> str:
    """The run history, filtered by ``query``."""
    return f"{reverse(f'{site}:fencedjobs_jobrun_changelist')}?{urlencode(query)}"


class ReadOnly:
    """A model admin mixin: rows the app writes, never added, changed or deleted by a form."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def admin_urls(
    model_admin: ModelAdmin[Any], *views: tuple[str, Callable[..., Any], str]
) -> list[URLPattern]:
    """A model admin's own pages, ``(route, view, name)``, each named ``<app>_<model>_<name>``."""
    opts, site = model_admin.opts, model_admin.admin_site
    prefix = f"{opts.app_label}_{opts.model_name}"
    return [
        path(route, site.admin_view(view), name=f"{prefix}_{name}") for route, view, name in views
    ]
