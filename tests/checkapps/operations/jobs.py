"""Jobs that `manage.py jobctl` pauses, resumes and skips, and one that `runjobs --now`
runs long enough for a signal to stop it between two windows."""

import os
import time
from datetime import timedelta
from pathlib import Path

from django_fencedjobs import fenced_atomic, job


@job("0 3 * * *", name="ops.nightly", timezone="Europe/Berlin")
def nightly(run):
    run.add_items(1)


@job("*/5 * * * *", name="ops.frequent")
def frequent(run):
    pass


@job("7 3 1 1 *", name="ops.windowed", timeout=timedelta(minutes=10), max_batches=1000)
def windowed(run):
    """600 one-minute windows, a fifth of a second each; says when the first is committed
    by creating the file $FENCEDJOBS_TEST_MARKER."""
    marker = Path(os.environ["FENCEDJOBS_TEST_MARKER"])
    for window in run.windows(timedelta(minutes=1), start=run.now - timedelta(hours=10)):
        with fenced_atomic():
            run.advance_watermark(window.end)
            run.add_items(1)
        marker.touch()
        time.sleep(0.2)
