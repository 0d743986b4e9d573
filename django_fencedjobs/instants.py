"""How an instant is written for a reader (the admin, ``checkjobs``, health reasons): to the
second, so two runs 30 seconds apart never read the same, in the zone of its job's schedule
(UTC without a valid one) and named by it: ``2026-11-29 10:00:00 Europe/Berlin``. Django-free.
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
    """``value`` in ``tz`` and in UTC, for a terminal's line:
    ``2026-11-29 10:00:00 CET (Europe/Berlin) = 2026-11-29 09:00:00 UTC``; once in UTC."""
    in_utc = format_instant(value, UTC)
    if is_utc(tz):
        return in_utc
    return f"{value.astimezone(tz):%Y-%m-%d %H:%M:%S %Z} ({zone_name(tz)}) = {in_utc}"


def format_wait(delta: timedelta) -> str:
    """A wait, to the second: ``0:04:31``, ``36 days, 1:02:03``; ``0:00:00`` once past."""
    return str(timedelta(seconds=max(int(delta.total_seconds()), 0)))


def iso_utc(value: datetime) -> str:
    """Machine-readable, for attributes and JSON: ``2026-11-29T09:00:00+00:00``."""
    return value.astimezone(UTC).isoformat()


def parse_instant(text: str) -> datetime:
    """An instant an operator typed: ISO 8601 with its offset, ``2026-11-29T10:00:00+01:00``
    or ``2026-11-29 09:00Z``. Without an offset it names no instant (which zone?):
    :class:`ValueError`, with a message that says what to write, as for any other text."""
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
