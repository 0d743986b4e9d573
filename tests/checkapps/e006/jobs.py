"""A jobs module that must trigger fencedjobs.E006 (or nothing, for healthy)."""

from datetime import timedelta

from django_fencedjobs import job

__all__ = ["timedelta"]


@job("*/5 * * * *", name="checks.zero_ttl", lease_ttl=timedelta(0))
def zero_ttl(run):
    pass
