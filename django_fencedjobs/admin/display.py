"""What the admin's pages share: badges, and instants written the app's one way
(:mod:`django_fencedjobs.instants`) in the zone of the job they belong to."""

from __future__ import annotations

from datetime import UTC, datetime, tzinfo

from django.utils.html import format_html
from django.utils.safestring import SafeString

from django_fencedjobs.instants import format_instant, is_utc, iso_utc
from django_fencedjobs.registry import registry


def badge(state: str, label: str, title: str = "") -> SafeString:
    return format_html('<span class="fj-badge fj-{}" title="{}">{}</span>', state, title, label)


def instant(value: datetime | None, tz: tzinfo) -> SafeString | str:
    """``value`` in ``tz`` to the second, and below it in UTC unless ``tz`` is UTC."""
    if value is None:
        return "-"
    local = format_html(
        '<time class="fj-when" datetime="{}">{}</time>', iso_utc(value), format_instant(value, tz)
    )
    if is_utc(tz):
        return local
    return format_html('{}<br><span class="fj-utc">{}</span>', local, format_instant(value, UTC))


def job_zone(name: str) -> tzinfo:
    """The zone of the job declared as ``name``: its schedule's; UTC for a job that is not
    declared or whose schedule is invalid (as :attr:`JobHealth.tz
    <django_fencedjobs.health.JobHealth.tz>`)."""
    job = registry.get(name) if name in registry else None
    schedule = job.schedule if job is not None else None
    return schedule.tz if schedule is not None else UTC
