"""Handlers that would "succeed" without running: each must trigger fencedjobs.E011."""

from django_fencedjobs import job


@job("*/5 * * * *", name="checks.async_def")
async def async_def(run):
    pass


@job("*/5 * * * *", name="checks.async_generator")
async def async_generator(run):
    yield run


@job("*/5 * * * *", name="checks.generator")
def generator(run):
    yield run


class AsyncCall:
    async def __call__(self, run):
        pass


job("*/5 * * * *", name="checks.async_call")(AsyncCall())
