"""The benchmarks' job with instances (P10 to P13): its schedules are rows, one per
tenant, each run a small fenced write (the row says which instance ran which slot)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django_fencedjobs import fenced_atomic, job

from .models import Row

#: The job's name; its instances are named ``bench.digest[key]``.
DIGEST = "bench.digest"
#: Another job with instances (P10: a runner of it beside 100,000 of ``bench.digest``).
OTHER = "bench.other"


@job(instances=True, name=DIGEST, timeout=timedelta(minutes=1))
def digest(run: Any, *, tenant: int) -> None:
    with fenced_atomic():
        Row.objects.create(seq=int(run.scheduled_for.timestamp()), note=run.job.key)


@job(instances=True, name=OTHER, timeout=timedelta(minutes=1))
def other(run: Any, *, tenant: int) -> None:
    with fenced_atomic():
        Row.objects.create(seq=int(run.scheduled_for.timestamp()), note=run.job.key)
