"""One nightly job at minute 0 without jitter, in Europe/Berlin: not a stampede, so no
fencedjobs.W001."""

from django_fencedjobs import job


@job("0 3 * * *", name="checks.nightly_cleanup", timezone="Europe/Berlin")
def nightly_cleanup(run):
    pass
