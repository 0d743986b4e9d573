"""One presentation of instants: in the job's zone, named by it; on a terminal's line, in
its zone with the abbreviation and then in UTC; a UTC instant once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from django_fencedjobs.instants import format_instant, format_wait, format_with_utc

BERLIN = ZoneInfo("Europe/Berlin")


def test_an_instant_is_written_in_its_zone_to_the_second_and_named_by_it():
    instant = datetime(2026, 11, 29, 9, 0, 5, tzinfo=UTC)
    assert format_instant(instant, BERLIN) == "2026-11-29 10:00:05 Europe/Berlin"
    assert format_instant(instant, UTC) == "2026-11-29 09:00:05 UTC"


def test_an_instant_on_the_local_day_of_one_written_before_drops_its_date_and_zone():
    ref = datetime(2026, 11, 29, 22, 30, tzinfo=UTC)  # 23:30 in Berlin
    assert format_instant(ref + timedelta(minutes=20), BERLIN, ref=ref) == "23:50:00"
    # 00:10 the next day in Berlin, though the same day in UTC.
    assert format_instant(ref + timedelta(minutes=40), BERLIN, ref=ref) == (
        "2026-11-30 00:10:00 Europe/Berlin"
    )


@pytest.mark.parametrize(
    ("instant", "written"),
    [
        (
            datetime(2026, 11, 29, 9, 0, tzinfo=UTC),
            "2026-11-29 10:00:00 CET (Europe/Berlin) = 2026-11-29 09:00:00 UTC",
        ),
        (
            datetime(2026, 7, 1, 7, 0, tzinfo=UTC),
            "2026-07-01 09:00:00 CEST (Europe/Berlin) = 2026-07-01 07:00:00 UTC",
        ),
    ],
    ids=["winter", "summer"],
)
def test_a_terminal_line_gives_the_zone_with_its_abbreviation_then_utc(instant, written):
    assert format_with_utc(instant, BERLIN) == written


@pytest.mark.parametrize("zone", [UTC, ZoneInfo("UTC"), ZoneInfo("Etc/UTC"), ZoneInfo("Zulu")])
def test_a_terminal_line_writes_an_instant_of_a_utc_zone_once(zone):
    instant = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
    assert format_with_utc(instant, zone) == "2026-11-29 09:00:00 UTC"


def test_a_wait_is_written_to_the_second_and_never_below_zero():
    assert format_wait(timedelta(minutes=4, seconds=31, milliseconds=900)) == "0:04:31"
    assert format_wait(timedelta(days=36, hours=1, minutes=2, seconds=3)) == "36 days, 1:02:03"
    assert format_wait(timedelta(seconds=-5)) == "0:00:00"
