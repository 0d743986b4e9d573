"""A jobs module that must trigger fencedjobs.HEALTHY (or nothing, for healthy)."""

from datetime import timedelta

from django_fencedjobs import job

__all__ = ["timedelta"]


@job("7 * * * *", name="checks.healthy", timezone="Europe/Berlin")
def healthy(run):
    pass
