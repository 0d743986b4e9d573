"""What the demo's jobs work on. Each row a job writes records the fence of the run that
wrote it, so the admin shows which run did what."""

from __future__ import annotations

from django.db import models


class Reminder(models.Model):
    """Sent by ``demo.send_due_reminders`` once ``due_at`` has passed; sent once."""

    text = models.CharField(max_length=200)
    due_at = models.DateTimeField(db_index=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    sent_by_fence = models.BigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["due_at", "id"]
        indexes = [models.Index(fields=["sent_at", "due_at"], name="demo_reminder_pending")]

    def __str__(self) -> str:
        return self.text


class Event(models.Model):
    """Something that happened: counted per minute by ``demo.minutely_rollup``."""

    kind = models.CharField(max_length=50)
    occurred_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["-occurred_at", "-id"]

    def __str__(self) -> str:
        return f"{self.kind} at {self.occurred_at:%Y-%m-%d %H:%M:%S}"


class Rollup(models.Model):
    """Events per window ``[window_start, window_end)``; one row per window."""

    window_start = models.DateTimeField(unique=True)
    window_end = models.DateTimeField()
    count = models.PositiveIntegerField()
    fence = models.BigIntegerField(help_text="Fence of the run that wrote this window.")

    class Meta:
        ordering = ["-window_start"]

    def __str__(self) -> str:
        return f"{self.window_start:%Y-%m-%d %H:%M} UTC: {self.count}"


class Report(models.Model):
    """The weekday 09:00 (Europe/Berlin) report; one per local date."""

    day = models.DateField(unique=True, help_text="The local date in Europe/Berlin.")
    created_at = models.DateTimeField()
    reminders_sent = models.PositiveIntegerField()
    events = models.PositiveIntegerField()
    fence = models.BigIntegerField(help_text="Fence of the run that wrote this report.")

    class Meta:
        ordering = ["-day"]

    def __str__(self) -> str:
        return f"report for {self.day}"


class Digest(models.Model):
    """Written by the task ``demo.write_digest`` that the job of the same name enqueues every
    30 seconds: a ``db_worker`` process runs it, not the scheduler."""

    written_at = models.DateTimeField()
    reminders_sent = models.PositiveIntegerField()
    reminders_pending = models.PositiveIntegerField()
    worker_pid = models.PositiveIntegerField(
        help_text="Process id of the db_worker that ran the task."
    )
    fence = models.BigIntegerField(help_text="Fence of the run that enqueued the task.")

    class Meta:
        ordering = ["-written_at", "-id"]

    def __str__(self) -> str:
        return f"digest at {self.written_at:%Y-%m-%d %H:%M:%S}"


class TenantDigest(models.Model):
    """Written by the instances of ``demo.tenant_digest``: one job declared in code, one
    instance per tenant (a row of ``JobInstance``), each with its own schedule, zone and
    arguments. One row per instance and slot."""

    instance = models.CharField(
        max_length=200, help_text="The instance that wrote it: demo.tenant_digest[key]."
    )
    tenant = models.CharField(max_length=100, help_text="The instance's argument tenant=.")
    slot = models.DateTimeField(help_text="The slot of the run that wrote it.")
    local_time = models.CharField(
        max_length=60, help_text="The slot in the instance's zone, as the tenant reads it."
    )
    events_last_hour = models.PositiveIntegerField()
    written_at = models.DateTimeField()
    fence = models.BigIntegerField(help_text="Fence of the instance's run that wrote it.")

    class Meta:
        ordering = ["-slot", "instance"]
        constraints = [
            models.UniqueConstraint(fields=["instance", "slot"], name="demo_tenantdigest_slot")
        ]

    def __str__(self) -> str:
        return f"{self.tenant}'s digest at {self.local_time}"
