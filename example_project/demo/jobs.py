"""The demo's jobs: one of each kind django-fencedjobs is built for.

* ``demo.send_due_reminders``: per-item work. Every 30 seconds, claim the reminders that
  are due and not sent, in batches; each batch is marked sent in the same fenced
  transaction that claimed it, so a reminder is marked sent once, by one run.
* ``demo.minutely_rollup``: watermark work. Every minute, count the events of each whole
  minute since the watermark into ``Rollup`` and advance the watermark in the same
  transaction: a missed minute is caught up by the next run, a double tick adds nothing.
* ``demo.weekday_report_berlin``: a local-time job, weekdays at 09:00 in Europe/Berlin
  (07:00 or 08:00 UTC, depending on daylight saving time), with a stable jitter.
* ``demo.flaky_upstream``: an unreliable upstream. Every 30 seconds; every third run fails.
  Its first failure makes it failing (the last run failed), its next success ok again; from
  its second failure its failure rate keeps it failing, as a warning. Each change of its
  state is mailed once (in the demo, printed by the console mail backend).
* ``demo.write_digest``: a scheduled ``django.tasks`` task, in one line. Every 30 seconds
  a run enqueues the task ``write_digest`` (``tasks.py``) once, in its fenced transaction;
  the demo's ``db_worker`` process runs it and writes a ``Digest`` row.
* ``demo.tenant_digest``: schedules as data. Declared once with ``instances=True`` and no
  schedule; its *instances* (rows, one per tenant, created by ``manage.py demo`` and edited
  in the admin's Instances page) each have a schedule, a zone and the handler's keyword
  argument ``tenant``. Each instance is a job of its own, ``demo.tenant_digest[key]``:
  its lease and fence, its runs, its health.

``manage.py demo`` asks for one run of each right away ("run now", and of each enabled
instance; a job whose slot is seconds away just runs at that slot), so every job has a
recorded run within the demo's first seconds; after that each runs on its schedule.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from django_fencedjobs import Run, fenced_atomic, job
from django_fencedjobs.integrations.tasks import schedule_task
from django_fencedjobs.models import JobRun, Outcome
from example_project.demo.models import Event, Reminder, Report, Rollup, TenantDigest
from example_project.demo.tasks import write_digest

logger = logging.getLogger("example_project.demo")

BERLIN = ZoneInfo("Europe/Berlin")
#: On its very first run (no watermark yet) the rollup starts this far back.
ROLLUP_BACKFILL = timedelta(hours=3)


@job(every=timedelta(seconds=30), name="demo.send_due_reminders", timeout=timedelta(seconds=20))
def send_due_reminders(run: Run) -> None:
    due = Reminder.objects.filter(sent_at=None, due_at__lte=run.now).order_by("due_at", "id")
    for batch in run.batches(due, size=5):
        # This body runs inside the batch's fenced transaction: if the fence is lost,
        # nothing below commits and the reminders stay unsent for the next run.
        for reminder in batch:
            # A real job would hand the message to an outbox table here, in the same
            # transaction, rather than call an external service that cannot roll back.
            logger.info(
                "reminder sent: %s",
                reminder.text,
                extra={"event": "reminder_sent", "reminder": reminder.pk, "fence": run.fence},
            )
            reminder.sent_at = run.now
            reminder.sent_by_fence = run.fence
        Reminder.objects.bulk_update(batch, ["sent_at", "sent_by_fence"])
        Event.objects.bulk_create(Event(kind="reminder_sent", occurred_at=run.now) for _ in batch)
        run.add_items(len(batch))


@job("* * * * *", name="demo.minutely_rollup", max_batches=240, timeout=timedelta(seconds=45))
def minutely_rollup(run: Run) -> None:
    first_start = _floor_minute(run.now - ROLLUP_BACKFILL)  # only used without a watermark
    for window in run.windows(step=timedelta(minutes=1), start=first_start):
        with fenced_atomic():
            count = Event.objects.filter(
                occurred_at__gte=window.start, occurred_at__lt=window.end
            ).count()
            Rollup.objects.update_or_create(
                window_start=window.start,
                defaults={"window_end": window.end, "count": count, "fence": run.fence},
            )
            run.advance_watermark(window.end)
            run.add_items(count)


@job(
    "0 9 * * 1-5",
    name="demo.weekday_report_berlin",
    timezone="Europe/Berlin",
    jitter=timedelta(minutes=5),
    timeout=timedelta(minutes=10),
)
def weekday_report_berlin(run: Run) -> None:
    day = run.scheduled_for.astimezone(BERLIN).date()
    since = run.now - timedelta(days=1)
    with fenced_atomic():
        # One report per local date, whichever run writes it (a retry rewrites it).
        Report.objects.update_or_create(
            day=day,
            defaults={
                "created_at": run.now,
                "reminders_sent": Reminder.objects.filter(
                    sent_at__gte=since, sent_at__lte=run.now
                ).count(),
                "events": Event.objects.filter(
                    occurred_at__gte=since, occurred_at__lt=run.now
                ).count(),
                "fence": run.fence,
            },
        )
        run.add_items(1)


@job(every=timedelta(seconds=30), name="demo.flaky_upstream", timeout=timedelta(seconds=10))
def flaky_upstream(run: Run) -> None:
    finished = JobRun.objects.filter(
        job=run.job.name, outcome__in=[Outcome.SUCCEEDED, Outcome.FAILED]
    ).count()
    if finished % 3 == 2:
        raise RuntimeError("upstream said 503 Service Unavailable")
    run.add_items(1)


# The run enqueues the task; the worker runs it. The job reads late when a task has not
# finished within the run's timeout plus its grace after its slot, 50 s here (no worker
# took it, or its worker died).
schedule_task(
    write_digest,
    every=timedelta(seconds=30),
    name="demo.write_digest",
    timeout=timedelta(seconds=20),
    grace=timedelta(seconds=30),
)


@job(instances=True, name="demo.tenant_digest", timeout=timedelta(seconds=20))
def tenant_digest(run: Run, *, tenant: str) -> None:
    # run.job is the instance's job, demo.tenant_digest[key], in every kind of run
    # (scheduled, retry, backfill, one-off): its schedule is the instance's, in the
    # instance's zone; ``tenant`` is the instance's argument.
    zone = run.job.valid_schedule.tz
    with fenced_atomic():
        # One row per instance and slot, whichever run writes it (a retry rewrites it).
        TenantDigest.objects.update_or_create(
            instance=run.job.name,
            slot=run.scheduled_for,
            defaults={
                "tenant": tenant,
                "local_time": f"{run.scheduled_for.astimezone(zone):%Y-%m-%d %H:%M:%S %Z}",
                "events_last_hour": Event.objects.filter(
                    occurred_at__gte=run.now - timedelta(hours=1), occurred_at__lt=run.now
                ).count(),
                "written_at": run.now,
                "fence": run.fence,
            },
        )
        run.add_items(1)


def _floor_minute(value: datetime) -> datetime:
    return value.astimezone(UTC).replace(second=0, microsecond=0)
