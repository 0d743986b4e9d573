"""A jobs module that must trigger fencedjobs.E007 (or nothing, for healthy)."""

from datetime import timedelta

from django_fencedjobs import job

__all__ = ["timedelta"]


@job("*/5 * * * *", name="checks.advisory", exclusion="advisory")
def advisory(run):
    pass
