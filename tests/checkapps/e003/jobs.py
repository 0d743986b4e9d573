"""A jobs module that must trigger fencedjobs.E003 (or nothing, for healthy)."""

from datetime import timedelta

from django_fencedjobs import job

__all__ = ["timedelta"]


@job("*/5 * * * *", name="checks.fixed_offset", timezone="UTC+2")
def fixed_offset(run):
    pass
