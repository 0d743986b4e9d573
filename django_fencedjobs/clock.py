"""Clocks: where "now" comes from for lease arithmetic and due-ness.

Leases are compared against one clock for every host, so a worker whose system clock is
skewed cannot steal or keep a lease it should not. The default is the database's clock.
``FENCEDJOBS["CLOCK"]`` names any zero-argument callable returning an aware datetime; tests
use :data:`fake_clock`.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from django_fencedjobs.text import one_line

Clock = Callable[[], datetime]


def system_now() -> datetime:
    """This host's clock, in UTC. Fine for a single host; skew between hosts is not detected."""
    return datetime.now(UTC)


def database_now() -> datetime:
    """The database server's clock (the default): one clock for every host
    (:func:`db.server_now <django_fencedjobs.db.server_now>`). A SQLite database is a file
    on one host, so that host's clock *is* the database's clock and no query is needed."""
    from django_fencedjobs import db

    return db.server_now() or system_now()


class FakeClock:
    """A clock that only moves when told to, for tests.

    Select it with ``FENCEDJOBS = {"CLOCK": "django_fencedjobs.clock.fake_clock"}``.

    >>> fake_clock.set(datetime(2026, 3, 8, 6, 59, tzinfo=UTC))
    >>> fake_clock.advance(timedelta(minutes=1))
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._lock = threading.Lock()
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        with self._lock:
            return self._now

    def set(self, value: datetime) -> None:
        if value.tzinfo is None:
            raise ValueError("FakeClock.set() needs an aware datetime")
        with self._lock:
            self._now = value.astimezone(UTC)

    def advance(self, delta: timedelta) -> datetime:
        with self._lock:
            self._now += delta
            return self._now


#: The fake clock tests select through settings.
fake_clock = FakeClock()

_resolved: tuple[str, Clock] | None = None


def get_clock() -> Clock:
    """The clock ``FENCEDJOBS["CLOCK"]`` names (imported once). Raises
    :class:`~django.core.exceptions.ImproperlyConfigured`, on one line, when the path cannot
    be imported or names anything that cannot be called without arguments (check E010)."""
    global _resolved
    from django_fencedjobs.conf import get_settings

    path = get_settings().CLOCK
    if _resolved is None or _resolved[0] != path:
        _resolved = (path, _load(path))
    return _resolved[1]


def _load(path: str) -> Clock:
    setting = f"FENCEDJOBS['CLOCK'] = {path!r}"
    try:
        value = import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(f"{setting} cannot be imported: {one_line(exc)}") from None
    if inspect.isclass(value):
        raise ImproperlyConfigured(
            f"{setting} names a class, whose instances are not datetimes; name a "
            f"zero-argument function returning an aware datetime, or an instance such as "
            f"django_fencedjobs.clock.fake_clock."
        )
    if not callable(value):
        raise ImproperlyConfigured(
            f"{setting} is a {type(value).__name__}, not a zero-argument callable returning "
            f"an aware datetime."
        )
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):
        return cast(Clock, value)  # no signature to read (some builtins): let it be
    try:
        signature.bind()
    except TypeError:
        raise ImproperlyConfigured(
            f"{setting} cannot be called without arguments {signature}; name a "
            f"zero-argument callable returning an aware datetime."
        ) from None
    return cast(Clock, value)


def now() -> datetime:
    """The current instant by the configured clock, aware, in UTC."""
    value = get_clock()()
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise ImproperlyConfigured(
            f"the clock FENCEDJOBS['CLOCK'] names returned {value!r}, not an aware datetime."
        )
    return value.astimezone(UTC)


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    """A test that overrides ``FENCEDJOBS`` gets its clock."""
    global _resolved
    if setting == "FENCEDJOBS":
        _resolved = None
