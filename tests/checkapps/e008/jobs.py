"""A jobs module that must trigger fencedjobs.E008 (or nothing, for healthy)."""

from datetime import timedelta

from django_fencedjobs import job

__all__ = ["timedelta"]


@job("*/5 * * * *", name="checks.twice")
def first(run):
    pass


@job("*/10 * * * *", name="checks.twice")
def second(run):
    pass
