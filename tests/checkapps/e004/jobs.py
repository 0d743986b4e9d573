"""A jobs module that must trigger fencedjobs.E004 (or nothing, for healthy)."""

from datetime import timedelta

from django_fencedjobs import job

__all__ = ["timedelta"]


@job("*/5 * * * *", name="checks.long_timeout", timeout=timedelta(minutes=5))
def long_timeout(run):
    pass
