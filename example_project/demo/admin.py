from django.contrib import admin

from example_project.demo.models import Digest, Event, Reminder, Report, Rollup, TenantDigest


@admin.register(Reminder)
class ReminderAdmin(admin.ModelAdmin):
    list_display = ["text", "due_at", "sent_at", "sent_by_fence"]
    list_filter = [("sent_at", admin.EmptyFieldListFilter)]
    date_hierarchy = "due_at"


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ["kind", "occurred_at"]
    list_filter = ["kind"]
    date_hierarchy = "occurred_at"


@admin.register(Rollup)
class RollupAdmin(admin.ModelAdmin):
    list_display = ["window_start", "window_end", "count", "fence"]
    date_hierarchy = "window_start"


@admin.register(Report)
class ReportAdmin(admin.ModelAdmin):
    list_display = ["day", "created_at", "reminders_sent", "events", "fence"]


@admin.register(Digest)
class DigestAdmin(admin.ModelAdmin):
    list_display = ["written_at", "reminders_sent", "reminders_pending", "worker_pid", "fence"]
    date_hierarchy = "written_at"


@admin.register(TenantDigest)
class TenantDigestAdmin(admin.ModelAdmin):
    list_display = ["slot", "instance", "tenant", "local_time", "events_last_hour", "fence"]
    list_filter = ["instance"]
    date_hierarchy = "slot"
