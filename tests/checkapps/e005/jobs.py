"""A jobs module that must trigger fencedjobs.E005 (or nothing, for healthy)."""

from datetime import timedelta

from django_fencedjobs import job

__all__ = ["timedelta"]


@job(every=timedelta(minutes=10), name="checks.wide_jitter", jitter=timedelta(minutes=10))
def wide_jitter(run):
    pass
