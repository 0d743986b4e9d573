"""The admin in a real browser: Playwright (from PyPI) driving Debian's Chromium.

Needs ``pip install playwright`` and ``apt-get install -y chromium`` (never
``playwright install``: the system Chromium is used through ``executable_path``). When
either is missing the test fails and says which. It runs in the PostgreSQL pass of
``make test``; the SQLite pass deselects the ``browser`` marker.

The live server runs in a thread of this process, so it shares the fake clock and the job
registry with the test. Django's ORM is used only outside the Playwright block (the sync
API runs an event loop, and Django refuses database calls from an async context).
"""

from __future__ import annotations

import itertools
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import override_settings

from django_fencedjobs import clock, fenced_atomic, job
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.loop import tick
from django_fencedjobs.models import JobLease
from django_fencedjobs.registry import registry
from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM = Path(os.environ.get("FENCEDJOBS_TEST_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = REPO_ROOT / "docs" / "img"

T0 = datetime(2026, 11, 29, 8, 0, tzinfo=UTC)  # 09:00 in Berlin
TICKS = 20  # every 15 minutes, until 13:00 UTC
NOW = T0 + TICKS * timedelta(minutes=15) + timedelta(seconds=30)


def require_browser() -> object:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(
            "Playwright is not installed: pip install playwright (the PyPI package; the "
            "browser is Debian's Chromium, so never run `playwright install`)",
            pytrace=False,
        )
    if not CHROMIUM.exists():
        pytest.fail(
            f"Chromium not found at {CHROMIUM}: apt-get update && apt-get install -y chromium "
            "(or set FENCEDJOBS_TEST_CHROMIUM to its path)",
            pytrace=False,
        )
    return sync_playwright


@pytest.fixture
def history():
    """Four jobs with real runs: one healthy with a varied timeline, one failing, one late
    (its runner stopped after 10:00), one healthy with a watermark."""
    durations = itertools.cycle([12, 31, 18, 46, 22, 15, 58, 26, 19, 34])
    with (
        registry.isolated(),
        override_settings(FENCEDJOBS={"CLOCK": "django_fencedjobs.clock.fake_clock"}),
    ):

        @job("*/15 * * * *", name="billing.sync_invoices", timezone="Europe/Berlin")
        def sync_invoices(run):
            fake_clock.advance(timedelta(seconds=next(durations)))
            if run.scheduled_for == T0 + timedelta(hours=2):
                raise TimeoutError("invoice API did not answer in 30s")
            run.add_items(40)

        @job("*/15 * * * *", name="crm.import_contacts")
        def import_contacts(run):
            fake_clock.advance(timedelta(seconds=2))
            raise ConnectionRefusedError("crm.example.com:443: connection refused")

        @job("0 * * * *", name="reports.hourly_rollup", timezone="Europe/Berlin")
        def hourly_rollup(run):
            fake_clock.advance(timedelta(seconds=40))

        @job(every=timedelta(minutes=30), name="search.reindex")
        def reindex(run):
            for window in run.windows(timedelta(minutes=30), start=T0):
                with fenced_atomic():
                    run.advance_watermark(window.end)
                    run.add_items(100)

        fake_clock.set(T0 - timedelta(minutes=1))
        tick()
        for n in range(1, TICKS + 1):
            fake_clock.set(T0 + n * timedelta(minutes=15))
            stopped = ["reports.hourly_rollup"] if n > 8 else []  # its runner went away at 10:00
            tick([name for name in registry.names() if name not in stopped])
        fake_clock.set(NOW)
        yield


def test_the_admin_shows_badges_and_a_timeline_and_run_now_makes_a_job_due(history, live_server):
    sync_playwright = require_browser()
    User.objects.create_superuser("admin", "admin@example.com", "correct horse")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    jobs_url = f"{live_server.url}/admin/fencedjobs/joblease/"

    with sync_playwright() as playwright:  # type: ignore[operator]
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1700, "height": 640})
            page.goto(f"{live_server.url}/admin/login/?next=/admin/fencedjobs/joblease/")
            page.fill("#id_username", "admin")
            page.fill("#id_password", "correct horse")
            page.click("input[type=submit]")
            page.wait_for_url(jobs_url)

            rows = page.locator("#result_list tbody tr")
            states = {
                rows.nth(i).locator("th.field-name").inner_text(): rows.nth(i)
                .locator("td.field-state .fj-badge")
                .inner_text()
                for i in range(rows.count())
            }
            assert states == {
                "crm.import_contacts": "failing",
                "reports.hourly_rollup": "late",
                "billing.sync_invoices": "ok",
                "search.reindex": "ok",
            }
            first_two = [rows.nth(i).locator("th.field-name").inner_text() for i in range(2)]
            assert first_two == ["crm.import_contacts", "reports.hourly_rollup"]
            assert page.locator(".fj-badge.fj-late").is_visible()
            late_reason = rows.nth(1).locator("td.field-reason").inner_text()
            assert late_reason.startswith("no successful run since 2026-11-29 11:00")
            assert late_reason.endswith("Europe/Berlin; expected by 12:35")
            page.screenshot(path=str(SCREENSHOTS / "admin-jobs.png"), full_page=True)

            page.click("text=billing.sync_invoices")
            page.wait_for_url("**/change/")
            bars = page.locator("svg.fj-timeline rect.fj-bar")
            assert bars.count() == TICKS
            assert page.locator("svg.fj-timeline rect.fj-bar-failed").count() == 1
            heights = {bars.nth(i).get_attribute("height") for i in range(bars.count())}
            assert len(heights) > 3  # height is duration
            assert page.locator("ol.fj-fire-times li").count() == 10
            page.set_viewport_size({"width": 1200, "height": 900})
            page.screenshot(path=str(SCREENSHOTS / "admin-job-timeline.png"), full_page=True)

            page.goto(jobs_url)
            page.click("text=search.reindex")
            page.wait_for_url("**/change/")
            assert "due now" not in page.locator(".field-next_run").inner_text()
            page.click("button:has-text('Run now')")
            page.wait_for_selector(".messagelist .success")
            assert "will run at the next tick" in page.locator(".messagelist").inner_text()
            assert "due now" in page.locator(".field-next_run").inner_text()
        finally:
            browser.close()

    reindex = JobLease.objects.get(name="search.reindex")
    assert reindex.next_run_at <= clock.now()
    (run,) = tick(["search.reindex"]).runs
    assert run.outcome == "succeeded"
