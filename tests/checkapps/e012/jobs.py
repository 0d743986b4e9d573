"""Handlers that cannot take the Run as their one positional argument trigger
fencedjobs.E012; the ones named checks.fine_* are valid and must not."""

import functools

from django_fencedjobs import job


@job("*/5 * * * *", name="checks.no_argument")
def no_argument():
    pass


@job("*/5 * * * *", name="checks.two_arguments")
def two_arguments(run, other):
    pass


@job("*/5 * * * *", name="checks.keyword_only")
def keyword_only(*, run):
    pass


job("*/5 * * * *", name="checks.not_callable")(42)


def with_options(run, *, batch=10):
    pass


job("*/5 * * * *", name="checks.fine_partial")(functools.partial(with_options, batch=5))


class Handler:
    def __call__(self, run):
        pass


job("*/5 * * * *", name="checks.fine_callable_object")(Handler())


@job("*/5 * * * *", name="checks.fine_defaults")
def fine_defaults(run, extra=None, *args, **kwargs):
    pass
