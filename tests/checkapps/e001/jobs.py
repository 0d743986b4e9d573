"""A jobs module that must trigger fencedjobs.E001 (or nothing, for healthy)."""

from datetime import timedelta

from django_fencedjobs import job

__all__ = ["timedelta"]


@job("61 * * * *", name="checks.bad_cron")
def bad_cron(run):
    pass
