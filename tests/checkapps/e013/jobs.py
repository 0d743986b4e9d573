"""Bad @job arguments: each must trigger a check error naming the job and the argument,
never an exception while the module is imported."""

from datetime import timedelta

from django_fencedjobs import job


@job("*/5 * * * *", name="checks.int_timeout", timeout=30)
def int_timeout(run):
    pass


@job("*/5 * * * *", name="checks.zero_batches", max_batches=0)
def zero_batches(run):
    pass


@job("*/5 * * * *", name="checks.mutex", exclusion="mutex")
def mutex(run):
    pass


@job("*/5 * * * *", name="checks.negative_grace", grace=timedelta(minutes=-1))
def negative_grace(run):
    pass


@job("*/5 * * * *", name="checks.float_threshold", failure_threshold=2.5)
def float_threshold(run):
    pass


@job("*/5 * * * *", name="checks.seconds_deadline", starting_deadline=60)
def seconds_deadline(run):
    pass
