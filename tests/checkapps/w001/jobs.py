"""A jobs module that must trigger fencedjobs.W001 (or nothing, for healthy)."""

from datetime import timedelta

from django_fencedjobs import job

__all__ = ["timedelta"]


@job("0 * * * *", name="checks.top_of_hour")
def top_of_hour(run):
    pass
