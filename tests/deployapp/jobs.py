"""The job the deployment-recipe tests watch.

It fires once a year, so it only runs when a test moves its slot into the past: a
minute boundary during a test cannot make it run a second time.
"""

from __future__ import annotations

import os
import time

from django_fencedjobs import Run, fenced_atomic, job
from tests.testapp.models import Write

PROBE = "deploy.probe"


@job("7 3 1 1 *", name=PROBE)
def probe(run: Run) -> None:
    with fenced_atomic():
        Write.objects.create(job=PROBE, fence=run.fence, seq=os.getpid())
    # Keep the lease a while, so that a second, overlapping pass really overlaps.
    time.sleep(float(os.environ.get("FENCEDJOBS_PROBE_SLEEP", "0")))
