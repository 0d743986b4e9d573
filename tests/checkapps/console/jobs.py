"""Jobs whose runs `runjobs` reports on the terminal: one that succeeds, one that fails,
one that overruns its timeout, and one in a zone other than UTC. Their first slots are
far away: a test makes them due (or runs them with `runjobs --now`)."""

import time
from datetime import timedelta

from django_fencedjobs import job


@job("7 3 1 1 *", name="console.fine")
def fine(run):
    run.add_items(2)


@job("7 3 1 1 *", name="console.flaky")
def flaky(run):
    raise RuntimeError("upstream said no")


@job("7 3 1 1 *", name="console.slow", timeout=timedelta(seconds=1))
def slow(run):
    for _ in range(600):
        time.sleep(0.05)


@job("7 3 1 1 *", name="console.berlin", timezone="Europe/Berlin")
def berlin(run):
    pass
