"""What the admin's pages share: badges, instants written the app's one way
(:mod:`django_fencedjobs.instants`) in the zone of the job they belong to, and long text
shortened in a list with the whole of it a click away."""

from __future__ import annotations

import re
from datetime import UTC, datetime, tzinfo

from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _

from django_fencedjobs.instants import format_instant, is_utc, iso_utc
from django_fencedjobs.registry import registry

#: The most characters of a reason or an error a list shows before "more".
SHORT_CHARS = 70


def badge(state: str, label: str, title: str = "") -> SafeString:
    return format_html('<span class="fj-badge fj-{}" title="{}">{}</span>', state, title, label)


def health_badge(state: str, severity: str, reason: str) -> SafeString:
    """A job's state as a badge, the reason on hover: failing as a warning in amber and
    critical in red, labelled so (``failing (warning)``), as checkjobs writes them."""
    if state == "failing":
        return badge(f"failing-{severity}", f"failing ({severity})", reason)
    return badge(state, state.replace("_", " "), reason)


def instant(value: datetime | None, tz: tzinfo, *, ref: datetime | None = None) -> SafeString | str:
    """``value`` in ``tz`` to the second, and below it in UTC unless ``tz`` is UTC. With
    ``ref``, an instant written earlier in the same row: on the same local day, the time
    alone (``10:15:01``, and ``09:15:01 UTC`` below). A narrow column may wrap an instant
    before its zone, never inside its date and time."""
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
    """``2026-12-01 14:15:00 Europe/Berlin`` with its date and time in one unbreakable
    piece; a time alone, or a time and its zone (``14:15:00 UTC``), in one."""
    parts = text.split(" ")
    if len(parts) == 3:  # date, time, zone (an IANA name has no space)
        return format_html('<span class="fj-nw">{} {}</span> {}', *parts)
    return format_html('<span class="fj-nw">{}</span>', text)


#: A name this short fits the narrowest column it is shown in: it is never wrapped.
UNWRAPPED_CHARS = 16


def breakable(name: str, *, at: str = "._") -> SafeString:
    """A dotted name (a job, a task's path) that a narrow column wraps after a dot or an
    underscore (the characters ``at``), never inside a word; a short one as it is."""
    if len(name) <= UNWRAPPED_CHARS:
        return escape(name)
    return mark_safe(re.sub(f"([{re.escape(at)}])", r"\1<wbr>", str(escape(name))))


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
    """The first clauses of ``text`` that fit in ``limit`` characters; else its first words;
    else its first ``limit`` characters."""
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
    """The zone of the job declared as ``name``: its schedule's; UTC for a job that is not
    declared or whose schedule is invalid (as :attr:`JobHealth.tz
    <django_fencedjobs.health.JobHealth.tz>`)."""
    job = registry.get(name) if name in registry else None
    schedule = job.schedule if job is not None else None
    return schedule.tz if schedule is not None else UTC
