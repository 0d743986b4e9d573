"""Jobs whose handlers do not stop when told, for the tests of how a runner stops: at its
limit of handlers given up on (tests/test_faults_abandoned_handlers.py) and on a second
SIGINT or SIGTERM (tests/test_faults_second_signal.py). Their slots are an hour apart: a
test makes them due.

The handlers that block wait on a gate: a shared ``flock`` on the file named by
``FENCEDJOBS_TEST_GATE``, which the test holds exclusively until it lets them through. The
wait is in C, where no interrupt reaches a thread (as a socket read without a timeout), so
the supervisor gives such a handler up after its timeout plus the grace; once let through,
it meets the interrupt and its thread returns. Each writes ``<job> <fence>`` to
``<gate>.blocking`` just before it waits.
"""

import fcntl
import os
import time
from datetime import timedelta

from django_fencedjobs import fenced_atomic, job
from tests.testapp.models import Write

HOURLY = timedelta(hours=1)
#: The most any handler here waits, whatever happens to the test.
MAX_WAIT = 120.0


def wait_at_the_gate(run):
    gate = os.environ["FENCEDJOBS_TEST_GATE"]
    with open(gate, "rb") as held:
        with open(f"{gate}.blocking", "a") as log:
            log.write(f"{run.job.name} {run.fence}\n")
        fcntl.flock(held, fcntl.LOCK_SH)


@job(
    every=HOURLY, name="stuck.blocked", timeout=timedelta(seconds=1), lease_ttl=timedelta(seconds=3)
)
def blocked(run):
    """Blocked outside any transaction: given up on at its timeout plus the grace."""
    wait_at_the_gate(run)


@job(every=HOURLY, name="stuck.in_transaction", lease_ttl=timedelta(seconds=3))
def in_transaction(run):
    """Blocked inside its fenced transaction, after a write there, until its timeout (30
    minutes)."""
    with fenced_atomic():
        Write.objects.create(job=run.job.name, fence=run.fence, seq=1)
        wait_at_the_gate(run)


@job(every=HOURLY, name="stuck.steady", timeout=timedelta(minutes=10))
def steady(run):
    """A healthy run that goes on until the runner stops."""
    deadline = time.monotonic() + MAX_WAIT
    while not run.stopping and time.monotonic() < deadline:
        time.sleep(0.05)


@job(every=HOURLY, name="stuck.later")
def later(run):
    """A quick job."""
