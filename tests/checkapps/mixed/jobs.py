"""One valid job among bad ones: the bad ones must not stop it, nor the web app."""

from django_fencedjobs import job


@job("* * * * *", name="mixed.good")
def good(run):
    run.add_items(1)


@job("61 * * * *", name="mixed.bad_cron")
def bad_cron(run):
    pass


@job("*/5 * * * *", name="mixed.bad_timeout", timeout=30)
def bad_timeout(run):
    pass


@job("*/5 * * * *", name="mixed.async_handler")
async def async_handler(run):
    pass
