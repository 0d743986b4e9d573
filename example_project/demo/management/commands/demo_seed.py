"""``manage.py demo_seed``: give the demo's jobs something to do.

Each call adds reminders: a few already due, and one falling due every minute for the
next ``--minutes`` minutes. Events spread over the last hours are added once, when there
are none yet, and only after the rollup's watermark: a window the rollup has already
counted is never changed behind its back. The instances of ``demo.tenant_digest`` in
:data:`DEMO_INSTANCES` are added when missing (:func:`seed_instances`): one changed in
the admin keeps its changes.
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction
from django.utils import timezone

from django_fencedjobs.models import Watermark
from example_project.demo.jobs import tenant_digest
from example_project.demo.models import Event, Reminder

EVENT_KINDS = ["signup", "login", "order", "payment", "refund"]

#: The instances of ``demo.tenant_digest`` the demo starts with, by key: the arguments of
#: ``tenant_digest.instances.upsert``. A schedule in each zone, all firing within a minute.
DEMO_INSTANCES: dict[str, dict[str, Any]] = {
    "paris": {
        "cron": "* * * * *",
        "timezone": "Europe/Paris",
        "kwargs": {"tenant": "Paris bakery"},
    },
    "new-york": {
        "every": timedelta(seconds=30),
        "timezone": "America/New_York",
        "kwargs": {"tenant": "New York deli"},
    },
    "tokyo": {
        "cron": "* * * * *",
        "timezone": "Asia/Tokyo",
        "jitter": timedelta(seconds=40),
        "kwargs": {"tenant": "Tokyo noodle bar"},
    },
}


class Command(BaseCommand):
    help = "Add demo reminders (due now and over the next minutes) and past events."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--due-now", type=int, default=3, help="Reminders already due.")
        parser.add_argument(
            "--minutes", type=int, default=10, help="One reminder due per minute for this long."
        )
        parser.add_argument("--hours", type=int, default=3, help="Hours of past events.")

    def handle(self, *args: Any, due_now: int, minutes: int, hours: int, **options: Any) -> None:
        reminders, events = seed(due_now=due_now, minutes=minutes, hours=hours)
        added = seed_instances()
        self.stdout.write(
            f"seeded {reminders} reminders, {events} events and {len(added)} instances"
        )


def seed(*, due_now: int = 3, minutes: int = 10, hours: int = 3) -> tuple[int, int]:
    now = timezone.now()
    rng = random.Random()
    with transaction.atomic():
        reminders = [
            Reminder(
                text=f"Reminder #{n + 1} of the demo started at {now:%H:%M:%S}, due then",
                due_at=now - timedelta(seconds=due_now - n),
            )
            for n in range(due_now)
        ] + [
            Reminder(
                text=f"Reminder due {m} min after the demo started at {now:%H:%M:%S}",
                due_at=now + timedelta(minutes=m),
            )
            for m in range(1, minutes + 1)
        ]
        Reminder.objects.bulk_create(reminders)
        events: list[Event] = []
        if not Event.objects.exists():
            watermark = (
                Watermark.objects.filter(job="demo.minutely_rollup", key="")
                .values_list("position", flat=True)
                .first()
            )
            start = max(now - timedelta(hours=hours), watermark or now - timedelta(hours=hours))
            span = (now - start).total_seconds()
            if span > 0:
                # A busier hour or two in the middle, so the rollup's counts vary.
                events = [
                    Event(
                        kind=rng.choice(EVENT_KINDS),
                        occurred_at=start + timedelta(seconds=rng.triangular(0, span, span * 0.6)),
                    )
                    for _ in range(max(int(span / 60) * 4, 1))
                ]
                Event.objects.bulk_create(events, batch_size=500)
    return len(reminders), len(events)


def seed_instances() -> list[str]:
    """Add the instances of :data:`DEMO_INSTANCES` that do not exist, each in one transaction
    with its lease row (``upsert``: checked as the system checks check code). Returns the
    keys added: none on a second call, and an instance the user changed in the admin (its
    schedule, zone, arguments, enabled) is left as it is."""
    instances = tenant_digest.instances  # type: ignore[attr-defined]
    existing = set(instances.all().values_list("key", flat=True))
    added = []
    for key, fields in DEMO_INSTANCES.items():
        if key not in existing:
            instances.upsert(key, **fields)
            added.append(key)
    return added
