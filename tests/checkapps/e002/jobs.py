"""A jobs module that must trigger fencedjobs.E002 (or nothing, for healthy)."""

from datetime import timedelta

from django_fencedjobs import job

__all__ = ["timedelta"]


@job("*/5 * * * *", name="checks.bad_zone", timezone="Mars/Olympus_Mons")
def bad_zone(run):
    pass
