"""The admin in a real browser: Playwright (from PyPI) driving Debian's Chromium.

Needs ``pip install playwright`` and ``apt-get install -y chromium`` (never
``playwright install``: the system Chromium is used through ``executable_path``). When
either is missing the test fails and says which. It runs in the PostgreSQL pass of
``make test``; the SQLite pass deselects the ``browser`` marker.

The live server runs in a thread of this process, so it shares the fake clock and the job
registry with the test. Django's ORM is used only outside the Playwright block (the sync
API runs an event loop, and Django refuses database calls from an async context).

Every page is checked at the two screens the admin is made for, a 1366x768 laptop and a
1920x1080 desktop, with the navigation sidebar open as Django first shows it and the
browser's scrollbars drawn: nothing overflows the window and no text is clipped. The
screenshots in ``docs/img/`` are taken here.
"""

from __future__ import annotations

import itertools
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from django.urls import reverse

from django_fencedjobs import clock, fenced_atomic, job
from django_fencedjobs.clock import fake_clock
from django_fencedjobs.loop import tick
from django_fencedjobs.models import JobLease, JobRun, RunTask, TaskStatus
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
#: A 1366x768 laptop and a 1920x1080 desktop.
SCREENS = {"laptop": (1366, 768), "desktop": (1920, 1080)}

T0 = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)  # Monday, 09:00 in Berlin
TICK = timedelta(minutes=15)
TICKS = 116  # every 15 minutes, until Tuesday 13:00 UTC
NOW = T0 + TICKS * TICK + timedelta(seconds=30)
#: billing.sync_invoices' runner was down on Tuesday night, 01:00 to 04:00 in Berlin: its
#: slots from 00:15 to 03:00 UTC did not run; the run at 03:15 caught up.
NIGHT = (datetime(2026, 12, 1, 0, 15, tzinfo=UTC), datetime(2026, 12, 1, 3, 0, tzinfo=UTC))
NIGHT_SLOTS = 12
#: The one failure of billing.sync_invoices.
FAILED_SLOT = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
#: reports.hourly_rollup's runner went away after this; it is late.
STOPPED = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
#: A run's owner as a cloud host names itself.
OWNER = "ip-10-20-31-147.eu-central-1.compute.internal:48211"
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/app/venv/lib/python3.12/site-packages/crm/client.py", line 212, in '
    "fetch_contacts_page\n"
    "    response = self.session.get(self.base_url + path, params=params, timeout=30)\n"
    "ConnectionRefusedError: crm.example.com:443: connection refused while fetching "
    "/api/v2/contacts?updated_since=2026-12-01T12:45:00Z&page=17&per_page=500\n"
)


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
    """Four jobs with real runs over a day and a bit: one healthy but for a failure and a
    night its runner was down, one failing, one late (its runner stopped after Tuesday
    10:00 UTC), one healthy with a watermark. The failing job's last run enqueued tasks."""
    durations = itertools.cycle([12, 31, 18, 46, 22, 15, 58, 26, 19, 34])
    with (
        registry.isolated(),
        override_settings(
            FENCEDJOBS={"CLOCK": "django_fencedjobs.clock.fake_clock", "OWNER": OWNER}
        ),
    ):

        @job("*/15 * * * *", name="billing.sync_invoices", timezone="Europe/Berlin")
        def sync_invoices(run):
            fake_clock.advance(timedelta(seconds=next(durations)))
            if run.scheduled_for == FAILED_SLOT:
                raise TimeoutError("invoice API did not answer in 30s")
            run.add_items(40)

        @job("*/15 * * * *", name="crm.import_contacts", timezone="America/New_York")
        def import_contacts(run):
            fake_clock.advance(timedelta(seconds=2))
            raise ConnectionRefusedError(TRACEBACK.splitlines()[-1].split(": ", 1)[1])

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
            slot = T0 + n * TICK
            fake_clock.set(slot)
            down = set()
            if NIGHT[0] <= slot <= NIGHT[1]:
                down.add("billing.sync_invoices")
            if slot > STOPPED:
                down.add("reports.hourly_rollup")
            # One job at a time, each from its slot: handlers move the one fake clock, and
            # side by side each run's times would depend on which of them ran first.
            for name in registry.names():
                if name not in down:
                    fake_clock.set(slot)
                    tick([name])
        fake_clock.set(NOW)
        yield


def add_tasks(run: JobRun) -> None:
    """Three tasks of ``run``, as django.tasks would record them: one failed with a
    traceback, one successful, one still running."""
    slot = run.scheduled_for
    for n, status in enumerate((TaskStatus.FAILED, TaskStatus.SUCCESSFUL, TaskStatus.RUNNING)):
        RunTask.objects.create(
            run=run,
            job=run.job,
            fence=run.fence,
            task_path="crm.tasks.import_contact_page_from_upstream",
            backend="default",
            result_id=f"7c9e6679-7425-40de-944b-e07fc1f90ae{n}",
            status=status,
            enqueued_at=slot + timedelta(seconds=1),
            started_at=slot + timedelta(seconds=2 + n),
            finished_at=None if status == TaskStatus.RUNNING else slot + timedelta(seconds=9),
            error=TRACEBACK if status == TaskStatus.FAILED else "",
        )


#: What does not fit: the page wider than the window, an element past its right edge, a
#: box whose content is wider than the box (a table cell, a scrolling or clipping
#: container). Returns one line per problem.
FITS = """() => {
  const problems = [];
  const width = document.documentElement.clientWidth;  // the window less its scrollbar
  const page = document.scrollingElement.scrollWidth;
  if (page > window.innerWidth || page > width) {
    problems.push(`the page is ${page} px wide in a ${width} px window`);
  }
  const name = (el) => {
    const classes = typeof el.className === 'string' ? el.className.trim() : '';
    const cls = classes ? '.' + classes.split(/\\s+/).join('.') : '';
    const text = (el.innerText || el.textContent || '').trim().replace(/\\s+/g, ' ').slice(0, 40);
    return `${el.tagName.toLowerCase()}${cls} "${text}"`;
  };
  for (const el of document.querySelectorAll('#content *')) {
    const box = el.getBoundingClientRect();
    if (box.width === 0 && box.height === 0) continue;
    const style = getComputedStyle(el);
    if (style.visibility === 'hidden') continue;
    if (box.right > width + 0.5) {
      problems.push(`${name(el)} ends at ${Math.round(box.right)} px`);
      continue;
    }
    if (el instanceof SVGElement) continue;
    const clips = ['hidden', 'clip', 'auto', 'scroll'].includes(style.overflowX);
    const cell = el.tagName === 'TD' || el.tagName === 'TH';
    if ((clips || cell) && el.scrollWidth > el.clientWidth + 1) {
      problems.push(`${name(el)} hides ${el.scrollWidth - el.clientWidth} px of its content`);
    }
  }
  return problems;
}"""


#: The job names (``.fj-name``) narrower than one of their parts: wrapped inside a word,
#: where they may wrap only after a dot or an underscore.
BROKEN_NAMES = """() => [...document.querySelectorAll('.fj-name')].filter(name => {
    const probe = document.createElement('span');
    probe.style.whiteSpace = 'nowrap';
    probe.style.font = getComputedStyle(name).font;
    document.body.appendChild(probe);
    const widest = Math.max(...name.textContent.split(/(?<=[._])/).map(part => {
        probe.textContent = part;
        return probe.getBoundingClientRect().width;
    }));
    probe.remove();
    return name.getBoundingClientRect().width + 0.5 < widest;
}).map(name => name.textContent)"""


def assert_fits(page, what: str) -> None:
    problems = page.evaluate(FITS)
    width = page.viewport_size["width"]
    assert not problems, f"{what} at {width} px: " + "; ".join(problems[:12])


def marks(locator) -> dict[str, int]:
    """How many slot marks of each kind a timeline has."""
    counts: dict[str, int] = {}
    for kind in locator.locator("rect.fj-slot").evaluate_all(
        "marks => marks.map(m => m.dataset.kind)"
    ):
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def log_in(browser, live_server, screen: str = "laptop"):
    width, height = SCREENS[screen]
    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "correct horse")
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/admin/")
    return page


def launch(playwright):
    # Scrollbars drawn, as on a real screen (Playwright hides them by default).
    return playwright.chromium.launch(
        executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, ignore_default_args=["--hide-scrollbars"]
    )


def test_the_admin_shows_badges_and_slot_timelines_and_run_now_makes_a_job_due(
    history, live_server
):
    sync_playwright = require_browser()
    User.objects.create_superuser("admin", "admin@example.com", "correct horse")
    jobs_url = f"{live_server.url}/admin/fencedjobs/joblease/"

    with sync_playwright() as playwright:  # type: ignore[operator]
        browser = launch(playwright)
        try:
            page = log_in(browser, live_server)
            page.goto(jobs_url)
            rows = page.locator("#result_list tbody tr")
            by_name = {
                rows.nth(i).locator("th.field-job .fj-name").inner_text(): rows.nth(i)
                for i in range(rows.count())
            }
            states = {
                name: row.locator("td.field-job_state .fj-badge").inner_text()
                for name, row in by_name.items()
            }
            assert states == {
                "crm.import_contacts": "failing (critical)",
                "reports.hourly_rollup": "late",
                "billing.sync_invoices": "ok",
                "search.reindex": "ok",
            }
            first_two = [rows.nth(i).locator(".fj-name").inner_text() for i in range(2)]
            assert first_two == ["crm.import_contacts", "reports.hourly_rollup"]
            assert page.locator(".fj-badge.fj-late").is_visible()
            late_row = by_name["reports.hourly_rollup"]
            late_reason = late_row.locator("td.field-job_state .fj-reason .fj-full").text_content()
            assert late_reason.startswith("no successful run since 2026-12-01 11:00:00")
            assert late_reason.endswith("Europe/Berlin; expected by 12:35:00")
            # The compact timeline of each job: the late job's last slots did not run.
            compact = late_row.locator("svg.fj-timeline.fj-compact")
            assert compact.is_visible()
            late_marks = marks(compact)
            assert late_marks["absent"] == 2  # 11:00 and 12:00 UTC; 13:00 is due
            assert late_marks["due"] == 1
            assert late_marks["upcoming"] == 1  # 14:00 UTC
            assert compact.locator("rect.fj-slot-absent").first.is_visible()
            assert marks(by_name["crm.import_contacts"].locator("svg.fj-compact")).keys() == {
                "failed",
                "upcoming",
            }

            page.click("text=billing.sync_invoices")
            page.wait_for_url("**/change/")
            timeline = page.locator("svg.fj-timeline:not(.fj-compact)")
            assert timeline.is_visible()
            billing = marks(timeline)
            # The last day: 96 slots, the night's 12 visibly missing (a later run caught
            # up), one failure, and the slot it now waits for.
            assert billing == {
                "succeeded": 96 - NIGHT_SLOTS - 1,
                "coalesced": NIGHT_SLOTS,
                "failed": 1,
                "upcoming": 1,
            }
            night = timeline.locator("rect.fj-slot-coalesced").first
            assert night.is_visible()
            title = night.locator("title").text_content()
            assert title.startswith("2026-12-01 01:15:00 Europe/Berlin")
            assert "caught up by the run of 2026-12-01 04:15:00 Europe/Berlin" in title
            assert "Tue 1 Dec" in timeline.text_content()  # the night is labelled
            assert page.locator("ol.fj-fire-times li").count() == 10
            caption = page.locator(".fj-legend").first.inner_text()
            assert caption.startswith("The last day: 96 expected slots")

            page.goto(jobs_url)
            page.click("text=reports.hourly_rollup")
            page.wait_for_url("**/change/")
            timeline = page.locator("svg.fj-timeline:not(.fj-compact)")
            assert marks(timeline)["absent"] == 2
            assert timeline.locator(".fj-window-late").is_visible()
            assert timeline.locator(".fj-window-awaited").is_visible()

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


def test_every_admin_page_fits_a_laptop_and_a_desktop_screen_with_nothing_cut(history, live_server):
    """The jobs list, a job's page, the runs list and a run's page (with its tasks and a
    long error) at 1366x768 and 1920x1080: no horizontal overflow, no clipped text, long
    reasons shortened with the whole text a click away. Takes the screenshots in docs/img."""
    sync_playwright = require_browser()
    User.objects.create_superuser("admin", "admin@example.com", "correct horse")
    crm_run = JobRun.objects.filter(job="crm.import_contacts").first()
    assert crm_run is not None
    add_tasks(crm_run)
    JobRun.objects.filter(pk=crm_run.pk).update(error=TRACEBACK)
    billing = JobLease.objects.get(name="billing.sync_invoices")
    pages = {
        "jobs": reverse("admin:fencedjobs_joblease_changelist"),
        "job": reverse("admin:fencedjobs_joblease_change", args=[billing.pk]),
        "runs": reverse("admin:fencedjobs_jobrun_changelist"),
        "run": reverse("admin:fencedjobs_jobrun_change", args=[crm_run.pk]),
    }
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    with sync_playwright() as playwright:  # type: ignore[operator]
        browser = launch(playwright)
        try:
            for screen in SCREENS:
                page = log_in(browser, live_server, screen)
                for what, url in pages.items():
                    page.goto(f"{live_server.url}{url}")

                    # The navigation sidebar open, as Django first shows it.
                    page.locator("#nav-sidebar").wait_for(state="visible")
                    assert_fits(page, f"{what} ({url})")
                    if what == "jobs":
                        # A long reason: its first clauses, the whole one click away.
                        reason = page.locator("td.field-job_state .fj-reason").first
                        assert (
                            reason.locator(".fj-short")
                            .inner_text()
                            .startswith("116 consecutive failures (threshold 3)…")
                        )
                        assert not reason.locator(".fj-full").is_visible()
                        reason.locator("summary").click()
                        whole = reason.locator(".fj-full")
                        assert whole.is_visible() and "ConnectionRefusedError" in whole.inner_text()
                        assert_fits(page, "jobs with a whole reason shown")
                        reason.locator("summary").click()
                    if what == "run":
                        # A task's error: its line, its traceback one click away.
                        error = page.locator("table.fj-tasks .fj-more").first
                        error.locator("summary").click()
                        assert "Traceback" in error.locator(".fj-full").inner_text()
                        assert_fits(page, "a run's page with a task's traceback shown")
                        error.locator("summary").click()
                    if screen == "laptop" or what in ("jobs", "runs"):
                        suffix = "" if screen == "laptop" else "-1920"
                        name = {"job": "admin-job-timeline"}.get(what, f"admin-{what}")
                        page.screenshot(
                            path=str(SCREENSHOTS / f"{name}{suffix}.png"),
                            full_page=what in ("jobs", "run"),
                        )
                page.close()
        finally:
            browser.close()


#: Thursday before Berlin's clocks go forward (Sunday 2027-03-28, 02:00 to 03:00).
BEFORE_SPRING = datetime(2027, 3, 25, 12, 0, tzinfo=UTC)


@pytest.fixture
def digests():
    """A job declared with instances (a tenant's digest), and no instance yet."""
    with (
        registry.isolated(),
        override_settings(FENCEDJOBS={"CLOCK": "django_fencedjobs.clock.fake_clock"}),
    ):

        @job(instances=True, name="digests.send", timeout=timedelta(seconds=30))
        def send(run, *, tenant_id: int) -> None:
            pass

        fake_clock.set(BEFORE_SPRING)
        yield


def test_an_instance_is_added_in_its_form_with_a_live_preview_of_its_fire_times(
    digests, live_server
):
    """The add form: choose the job, type a cron and a zone; the preview follows the typing
    (a bad expression shows the check's message), lists 10 times in the zone with Berlin's
    spring gap marked; saved, the instance is in the list with its next run. Takes the
    screenshot docs/img/admin-instance.png."""
    sync_playwright = require_browser()
    User.objects.create_superuser("admin", "admin@example.com", "correct horse")
    add_url = reverse("admin:fencedjobs_jobinstance_add")

    with sync_playwright() as playwright:  # type: ignore[operator]
        browser = launch(playwright)
        try:
            page = log_in(browser, live_server)
            page.goto(f"{live_server.url}{add_url}")
            preview = page.locator(".fj-preview")
            assert "Choose a job" in preview.inner_text()
            page.select_option("#id_job", "digests.send")
            page.fill("#id_key", "tenant-7")
            page.fill("#id_cron", "61 2 * * *")
            error = preview.locator(".fj-preview-error")
            error.wait_for()
            assert "(fencedjobs.E001)" in error.inner_text()

            page.fill("#id_cron", "30 2 * * *")
            page.fill("#id_timezone", "Europe/Berlin")
            page.fill("#id_kwargs", '{"tenant_id": 7}')
            gap = preview.locator("li.fj-dst-gap")
            gap.wait_for()
            times = preview.locator("ol li")
            assert times.count() == 10
            assert all("Europe/Berlin" in times.nth(i).inner_text() for i in range(times.count()))
            assert gap.inner_text().startswith("2027-03-28 03:00:00 Europe/Berlin")
            assert "02:30 does not exist, runs at 03:00" in gap.inner_text()
            assert_fits(page, "the instance form with its preview")
            page.locator("fieldset", has=preview).screenshot(
                path=str(SCREENSHOTS / "admin-instance.png")
            )

            page.click("input[name=_save]")
            page.wait_for_url("**/fencedjobs/jobinstance/")
            row = page.locator("#result_list tbody tr", has_text="tenant-7")
            assert row.locator("th.field-key").inner_text() == "tenant-7"
            assert row.locator("td.field-state").inner_text() == "enabled"
            assert "2027-03-26 02:30:00" in row.locator("td.field-next_run").inner_text()
        finally:
            browser.close()

    lease = JobLease.objects.get(name="digests.send[tenant-7]")
    assert lease.next_run_at == datetime(2027, 3, 26, 1, 30, tzinfo=UTC)
    assert not lease.paused


def test_an_instances_trouble_shows_on_the_jobs_page_and_the_instances_list_at_both_screens(
    live_server,
):
    """A job of 30 instances, one of which fails: the Jobs page counts them by state (the
    job failing while one instance is), its "1 failing" link opens the Instances list
    filtered to that one, which shows its health, last run and last success; an
    instance's page runs it now; every page fits a laptop and a desktop screen with
    nothing cut."""
    sync_playwright = require_browser()
    with (
        registry.isolated(),
        override_settings(FENCEDJOBS={"CLOCK": "django_fencedjobs.clock.fake_clock"}),
    ):

        @job(instances=True, name="digests.send_tenant_digest", timeout=timedelta(seconds=30))
        def send(run, *, tenant_id: int) -> None:
            if tenant_id == 7:
                raise RuntimeError("the tenant's mail server refused the connection")

        fake_clock.set(T0)

        @job("*/15 * * * *", name="reminders.jobs.send_due_reminders")
        def reminders(run) -> None:
            pass

        for tenant in range(30):
            send.instances.upsert(
                f"tenant-{tenant:02d}", cron="*/15 * * * *", kwargs={"tenant_id": tenant}
            )
        tick()
        fake_clock.set(T0 + TICK + timedelta(seconds=5))
        tick()
        User.objects.create_superuser("admin", "admin@example.com", "correct horse")
        jobs_url = f"{live_server.url}{reverse('admin:fencedjobs_joblease_changelist')}"

        with sync_playwright() as playwright:  # type: ignore[operator]
            browser = launch(playwright)
            try:
                for screen in SCREENS:
                    page = log_in(browser, live_server, screen)
                    page.goto(jobs_url)
                    block = page.locator(".fj-instance-jobs")
                    row = block.locator("tbody tr", has_text="digests.send_tenant_digest")
                    assert row.locator(".fj-badge").inner_text() == "failing"
                    assert "30: 1 failing, 29 ok" in " ".join(row.inner_text().split())
                    assert_fits(page, "the jobs page with a job's instances counted")
                    assert page.evaluate(BROKEN_NAMES) == [], "a name broken inside a word"
                    row.get_by_role("link", name="1 failing").click()
                    page.wait_for_url("**/fencedjobs/jobinstance/?**state=failing**")
                    (key,) = page.locator("#result_list th.field-key").all_inner_texts()
                    assert key == "tenant-07"
                    listed = page.locator("#result_list tbody tr").first
                    assert listed.locator("td.field-health").inner_text() == "failing (warning)"
                    last = listed.locator("td.field-last_run").inner_text()
                    assert last.startswith("failed") and "last success: never" in last
                    assert_fits(page, "the instances list filtered to the failing one")
                    page.goto(
                        f"{live_server.url}{reverse('admin:fencedjobs_jobinstance_changelist')}"
                    )
                    assert page.locator("#result_list tbody tr").count() == 30
                    assert_fits(page, "the instances list with their health")
                    # An instance's page runs it now, as a job's does.
                    key = "tenant-03" if screen == "laptop" else "tenant-04"
                    page.get_by_role("link", name=key, exact=True).click()
                    page.wait_for_url("**/change/")
                    assert_fits(page, "an instance's page")
                    page.click("button:has-text('Run now')")
                    page.wait_for_selector(".messagelist li")
                    said = page.locator(".messagelist").inner_text().lower()
                    assert f"digests.send_tenant_digest[{key}]: made due" in said
                    page.close()
            finally:
                browser.close()
        for key in ("tenant-03", "tenant-04"):
            made_due = JobLease.objects.get(name=f"digests.send_tenant_digest[{key}]")
            assert made_due.next_run_at <= clock.now()
