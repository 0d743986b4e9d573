"""The add-backfill form in a real browser: Playwright (from PyPI) driving Debian's Chromium,
as tests/test_admin_browser.py does (its launch, log-in and fit check are used here). Runs
in the PostgreSQL pass of ``make test``; the SQLite pass deselects the ``browser`` marker.

The live server runs in a thread of this process, so it shares the fake clock and the job
registry with the test. Django's ORM is used only outside the Playwright block.
"""

from __future__ import annotations

from datetime import UTC, datetime, time

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from django.urls import reverse

from django_fencedjobs import job, loop
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.models import (
    Backfill,
    Calendar,
    CalendarExclusion,
    JobLease,
    JobRun,
    Outcome,
    RunKind,
)
from django_fencedjobs.registry import registry
from tests.test_admin_browser import SCREENS, assert_fits, launch, log_in, require_browser

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

NOW = datetime(2026, 11, 29, 9, 0, 30, tzinfo=UTC)


def _h(hour: int) -> datetime:
    return datetime(2026, 11, 29, hour, 0, tzinfo=UTC)


@pytest.fixture
def hourly():
    """At 09:00:30 UTC: billing.sync_invoices, hourly in Berlin, its 06:00 UTC slot failed;
    no other slot of the morning has a run."""
    with (
        registry.isolated(),
        override_settings(FENCEDJOBS={"CLOCK": "django_fencedjobs.clock.fake_clock"}),
    ):

        @job("0 * * * *", name="billing.sync_invoices", timezone="Europe/Berlin")
        def sync_invoices(run):
            pass

        JobRun.objects.create(
            job="billing.sync_invoices", scheduled_for=_h(6), outcome=Outcome.FAILED
        )
        fake_clock.set(NOW)
        yield


def test_a_backfill_is_dry_run_then_queued_from_its_form_and_opens_its_page(hourly, live_server):
    sync_playwright = require_browser()
    User.objects.create_superuser("admin", "admin@example.com", "correct horse")
    add_url = f"{live_server.url}{reverse('admin:fencedjobs_backfill_add')}"

    with sync_playwright() as playwright:  # type: ignore[operator]
        browser = launch(playwright)
        try:
            page = log_in(browser, live_server)
            page.goto(f"{live_server.url}{reverse('admin:fencedjobs_backfill_changelist')}")
            page.click("text=Add backfill")
            page.wait_for_url("**/backfill/add/")
            # Each choice of slots on one line, not squeezed into a narrow column.
            heights = page.locator("#id_selection label").evaluate_all(
                "labels => labels.map(label => label.getBoundingClientRect().height)"
            )
            assert len(heights) == 3 and max(heights) < 1.6 * min(heights), heights
            page.fill("#id_job", "billing.sync_invoices")
            page.fill("#id_start", "2026-11-29T04:00:00Z")
            page.fill("#id_end", "2026-11-29T09:00:00+00:00")
            page.check("#id_selection input[value=all]")
            page.fill("#id_concurrency", "2")

            page.click("input[name=_dry_run]")
            page.wait_for_selector("#fj-plan-queue")
            assert page.url == f"{add_url}#fj-plan"  # the form again, with what it would queue
            # The dry run is where the page opens (scrolled to it as far as the page goes),
            # its first slots in sight, not below the fold of a laptop's screen.
            first = page.locator("#fj-plan-queue tbody tr").first
            bottom = first.evaluate("row => row.getBoundingClientRect().bottom")
            assert 0 < bottom < page.viewport_size["height"], bottom
            rows = page.locator("#fj-plan-queue tbody tr")
            assert rows.count() == 5
            assert rows.nth(0).inner_text().startswith("2026-11-29 05:00:00 Europe/Berlin")
            failed = rows.nth(2).inner_text()
            assert "2026-11-29 06:00:00 UTC" in failed and "failed" in failed
            assert page.locator("#fj-plan-left").count() == 0  # all: none is left
            assert page.input_value("#id_end") == "2026-11-29T09:00:00+00:00"
            assert_fits(page, "the add-backfill form with its dry run")

            page.click("input[name=_backfill]")
            page.wait_for_url("**/backfill/*/change/")
            message = page.locator(".messagelist .success").inner_text()
            assert message == "Queued 5 slots of billing.sync_invoices for the runners."
            progress = page.locator(".fieldBox.field-progress .readonly").inner_text()
            assert progress.startswith("0 of 5 done, 0 running, 5 queued")
            assert_fits(page, "a backfill's page")
            backfill_url = page.url
        finally:
            browser.close()

    made = Backfill.objects.get()
    assert backfill_url.endswith(reverse("admin:fencedjobs_backfill_change", args=[made.pk]))
    assert (made.job, made.slots, made.concurrency, made.requested_by) == (
        "billing.sync_invoices",
        5,
        2,
        "admin",
    )
    assert JobLease.objects.filter(backfill=made, kind=RunKind.BACKFILL).count() == 5


@pytest.fixture
def payroll():
    """At 09:00:30 UTC on Monday 28 December: payroll.export, weekdays at 06:00 in Berlin,
    avoiding Bavaria's public holidays and a maintenance calendar; its slots of Christmas
    Day and the Second Day of Christmas were recorded excluded, Thursday's and today's ran."""
    with (
        registry.isolated(),
        override_settings(FENCEDJOBS={"CLOCK": "django_fencedjobs.clock.fake_clock"}),
    ):
        Calendar.objects.create(
            name="de-by", timezone="Europe/Berlin", holidays_country="DE", holidays_subdivision="BY"
        )
        maintenance = Calendar.objects.create(name="maintenance", timezone="Europe/Berlin")
        CalendarExclusion.objects.create(
            calendar=maintenance,
            label="Saturday maintenance",
            weekday=5,
            starts=time(22),
            ends=time(2),
        )

        avoid = ["de-by", "maintenance"]

        @job("0 6 * * 1-5", name="payroll.export", timezone="Europe/Berlin", exclude=avoid)
        def export(run):
            pass

        fake_clock.set(datetime(2026, 12, 23, 12, 0, tzinfo=UTC))
        loop.tick()
        for day in (24, 25, 28):
            fake_clock.set(datetime(2026, 12, day, 5, 0, 30, tzinfo=UTC))
            loop.tick()
        fake_clock.set(datetime(2026, 12, 28, 9, 0, 30, tzinfo=UTC))
        yield


def test_a_calendar_and_a_job_that_avoids_it_read_well_at_both_screens(payroll, live_server):
    """The calendar's page (its exclusions inline, this year's holidays of Bavaria, the jobs
    that name it) and the job's page (its calendars, linked; its excluded slot on the
    timeline, saying by what) at 1366x768 and 1920x1080: nothing overflows or is cut."""
    sync_playwright = require_browser()
    User.objects.create_superuser("admin", "admin@example.com", "correct horse")
    excluded = list(
        JobRun.objects.filter(job="payroll.export", outcome=Outcome.EXCLUDED).values_list(
            "error", flat=True
        )
    )
    assert excluded == ["calendar 'de-by': Christmas Day"]  # the 26th is a Saturday
    calendar = Calendar.objects.get(name="de-by")
    calendar_url = reverse("admin:fencedjobs_calendar_change", args=[calendar.pk])
    job_url = reverse(
        "admin:fencedjobs_joblease_change",
        args=[JobLease.objects.get(name="payroll.export").pk],
    )
    with sync_playwright() as playwright:  # type: ignore[operator]
        browser = launch(playwright)
        try:
            for screen in SCREENS:
                page = log_in(browser, live_server, screen)
                page.goto(f"{live_server.url}{calendar_url}")
                holidays = page.locator(".field-holidays_this_year .readonly").inner_text()
                assert "Corpus Christi" in holidays and "Christmas Day" in holidays
                assert "payroll.export" in page.locator(".field-named_by").inner_text()
                assert_fits(page, f"a calendar's page ({screen})")
                page.goto(f"{live_server.url}{job_url}")
                calendars = page.locator(".field-calendars .readonly")
                assert calendars.inner_text() == "de-by, maintenance"
                assert "excluded by calendar 'de-by': Christmas Day" in page.content()
                assert_fits(page, f"a job's page with its calendars ({screen})")
                calendars.locator("a", has_text="maintenance").click()
                page.wait_for_url("**/calendar/?name=maintenance")
                assert page.locator("#result_list tbody tr").count() == 1
                page.close()
        finally:
            browser.close()
