"""Calendars in the admin: each with its excluded dates and windows inline, the public
holidays it takes from its country listed for this year, and the jobs that name it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django import forms
from django.contrib import admin
from django.utils import timezone
from django.utils.html import format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from django_fencedjobs import calendars
from django_fencedjobs.models import Calendar, CalendarExclusion
from django_fencedjobs.registry import registry

if TYPE_CHECKING:
    _Inline = admin.TabularInline[CalendarExclusion, Calendar]
    _ModelAdmin = admin.ModelAdmin[Calendar]
else:
    _Inline = admin.TabularInline
    _ModelAdmin = admin.ModelAdmin


class ExclusionForm(forms.ModelForm):  # type: ignore[type-arg]
    """Compact inputs (the browser's own date and time pickers), so that a row of the
    inline table fits a laptop's screen."""

    class Meta:
        model = CalendarExclusion
        fields = ("label", "on_date", "month", "day", "weekday", "starts", "ends")
        widgets = {
            "label": forms.TextInput(attrs={"size": 24}),
            "on_date": forms.DateInput(attrs={"type": "date"}, format="%Y-%m-%d"),
            "month": forms.NumberInput(attrs={"min": 1, "max": 12, "style": "width: 4em"}),
            "day": forms.NumberInput(attrs={"min": 1, "max": 31, "style": "width: 4em"}),
            "starts": forms.TimeInput(attrs={"type": "time"}, format="%H:%M"),
            "ends": forms.TimeInput(attrs={"type": "time"}, format="%H:%M"),
        }


class ExclusionInline(_Inline):
    model = CalendarExclusion
    form = ExclusionForm
    extra = 1


@admin.register(Calendar)
class CalendarAdmin(_ModelAdmin):
    list_display = ("name", "timezone", "holidays_country", "holidays_subdivision", "note")
    search_fields = ("name", "note")
    inlines = (ExclusionInline,)
    fieldsets = (
        (None, {"fields": ("name", "timezone", "note")}),
        (_("Public holidays"), {"fields": ("holidays_country", "holidays_subdivision")}),
        (_("Seen from here"), {"fields": ("holidays_this_year", "named_by")}),
    )
    readonly_fields = ("holidays_this_year", "named_by")

    @admin.display(description=_("holidays this year"))
    def holidays_this_year(self, calendar: Calendar) -> SafeString | str:
        if not calendar.pk or not calendar.holidays_country or calendar.problem():
            return "-"
        year = timezone.now().year
        found = calendars.public_holidays(
            calendar.holidays_country, calendar.holidays_subdivision, year
        )
        return format_html_join(
            "", "<div>{} {}</div>", ((day.isoformat(), name) for day, name in sorted(found.items()))
        )

    @admin.display(description=_("named by the jobs"))
    def named_by(self, calendar: Calendar) -> str:
        names = [job.name for job in registry.all() if calendar.name in job.exclude]
        return ", ".join(names) or "-"
