"""How an instant is written for a reader: one presentation for the admin, ``checkjobs`` and
the reasons :mod:`django_fencedjobs.health` gives.

To the second, in the zone of the job it belongs to, and named by that zone:
``2026-11-29 10:00:00 Europe/Berlin``, ``2026-11-29 09:00:00 UTC``. Seconds are always
written, so two runs 30 seconds apart never read the same. Inside one sentence, an instant
on the same local day as one already written there drops the date and the zone
(``no successful run since 2026-11-29 09:15:00 UTC; expected by 09:42:30``).

The zone is the job's schedule's (resolved once, by
:func:`django_fencedjobs.schedule.resolve_zone`); a job without a valid schedule is written
in UTC. The admin adds the instant in UTC below a non-UTC one; a line of a terminal adds it
after (:func:`format_with_utc`); a UTC instant is written once. Django-free.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo

__all__ = [
    "UTC_NAMES",
    "format_instant",
    "format_wait",
    "format_with_utc",
    "is_utc",
    "iso_utc",
    "parse_instant",
    "zone_name",
]

#: Zone names that are UTC itself: a second line "in UTC" would repeat them, and a schedule
#: in one of them has no transitions to look for.
UTC_NAMES = frozenset({"UTC", "Etc/UTC", "Etc/UCT", "UCT", "Etc/Universal", "Universal", "Zulu"})


def zone_name(tz: tzinfo) -> str:
    """The IANA name of ``tz`` (``Europe/Berlin``); ``UTC`` for :data:`datetime.UTC`."""
    return getattr(tz, "key", None) or "UTC"


def is_utc(tz: tzinfo) -> bool:
    return zone_name(tz) in UTC_NAMES


def format_instant(value: datetime, tz: tzinfo, *, ref: datetime | None = None) -> str:
    """``value`` in ``tz``: ``2026-11-29 10:00:00 Europe/Berlin``. With ``ref`` (an instant
    written earlier in the same sentence) on the same local day: only ``10:00:00``."""
    local = value.astimezone(tz)
    if ref is not None and ref.astimezone(tz).date() == local.date():
        return f"{local:%H:%M:%S}"
    return f"{local:%Y-%m-%d %H:%M:%S} {zone_name(tz)}"


def format_with_utc(value: datetime, tz: tzinfo) -> str:
    """``value`` in ``tz``, with the zone's abbreviation, then in UTC, for a line of a
    terminal that has no second line (a first run, the next fire times, an operator's
    change): ``2026-11-29 10:00:00 CET (Europe/Berlin) = 2026-11-29 09:00:00 UTC``. In a UTC
    zone, once: ``2026-11-29 09:00:00 UTC``."""
    in_utc = format_instant(value, UTC)
    if is_utc(tz):
        return in_utc
    return f"{value.astimezone(tz):%Y-%m-%d %H:%M:%S %Z} ({zone_name(tz)}) = {in_utc}"


def format_wait(delta: timedelta) -> str:
    """A wait until an instant, to the second: ``0:04:31``, ``36 days, 1:02:03``; none
    (``0:00:00``) once the instant has passed."""
    return str(timedelta(seconds=max(int(delta.total_seconds()), 0)))


def iso_utc(value: datetime) -> str:
    """Machine-readable, for attributes and JSON: ``2026-11-29T09:00:00+00:00``."""
    return value.astimezone(UTC).isoformat()


def parse_instant(text: str) -> datetime:
    """An instant an operator typed (``manage.py backfill``, ``runonce``, the admin's forms):
    ISO 8601 with its offset, ``2026-11-29T10:00:00+01:00`` or ``2026-11-29 09:00Z``. A time
    without an offset names no instant (which zone?), so it is refused like any other text:
    :class:`ValueError`, with a message that says what to write."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{text!r} is not an ISO 8601 instant: write e.g. 2026-11-29T09:00:00+00:00"
        ) from None
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(
            f"{text!r} has no offset: add one, e.g. {value.isoformat()}+00:00 (or Z for UTC)"
        )
    return value
