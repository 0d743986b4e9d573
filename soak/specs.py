"""The soak's jobs as numbers: names, schedules, leases, timeouts, steps. Django-free, so
that the checker's logic can be tested without the jobs' app installed; the jobs themselves
are in :mod:`soak.soakapp.jobs`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

WINDOWS = "soak.windows"
WINDOWS_KEYED = "soak.windows_keyed"
ITEMS = "soak.items"
SLOW = "soak.slow"
FAILING = "soak.failing"
#: A declared job with ``retries=``: its handler fails on some attempts; the target of the
#: plan's operator skips, one-offs and (with :data:`WINDOWS`) backfills.
RETRYING = "soak.retrying"
#: A job declared with ``instances=True``: the plan creates, edits, disables, enables,
#: deletes and re-creates its instances (``soak.inst[<key>]``).
INSTANCES = "soak.inst"


@dataclass(frozen=True)
class Spec:
    name: str
    every: timedelta
    lease_ttl: timedelta
    timeout: timedelta
    max_batches: int
    retries: int = 0
    #: Outcomes that count as the job making progress, for the liveness bound. For the job
    #: that fails on purpose a recorded failure is progress too.
    progress: tuple[str, ...] = ("succeeded",)


def _s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


SPECS = {
    spec.name: spec
    for spec in (
        Spec(WINDOWS, every=_s(3), lease_ttl=_s(2), timeout=_s(2.5), max_batches=40),
        Spec(WINDOWS_KEYED, every=_s(5), lease_ttl=_s(3), timeout=_s(4), max_batches=20),
        Spec(ITEMS, every=_s(2), lease_ttl=_s(1), timeout=_s(1.5), max_batches=12),
        Spec(SLOW, every=_s(4), lease_ttl=_s(1), timeout=_s(3), max_batches=10),
        Spec(
            FAILING,
            every=_s(3),
            lease_ttl=_s(1),
            timeout=_s(2),
            max_batches=10,
            progress=("succeeded", "failed"),
        ),
        Spec(
            RETRYING,
            every=_s(4),
            lease_ttl=_s(1),
            timeout=_s(2),
            max_batches=10,
            retries=2,
            progress=("succeeded", "failed"),
        ),
    )
}

#: ``soak.retrying``: each attempt after a failure waits this long (then twice that...).
RETRY_BACKOFF = _s(0.3)
#: ``soak.retrying`` avoids this calendar (``defer_excluded=True``): a window over the first
#: :data:`QUIET_SECONDS` of every minute of the soak, so that its slot at :00 is excluded
#: (the window ends after the next slot) and the one at :04 is deferred to :06.
QUIET = "soak-quiet"
QUIET_SECONDS = 6
#: The declared job of the instances (not in :data:`SPECS`: it has no schedule, its
#: instances have theirs), its lease and timeout; and the keys the plan draws from (few,
#: so that a key deleted is soon created again).
INSTANCE_SPEC = Spec(INSTANCES, every=_s(0), lease_ttl=_s(1), timeout=_s(2), max_batches=10)
INSTANCE_KEYS = ("k0", "k1", "k2", "k3")
#: The kinds of run an operator asks for: not the schedule's, not in A1's slot accounting.
OPERATOR_KINDS = ("backfill", "once", "manual")

#: The windows jobs: their step and watermark key.
WINDOW_STEPS = {WINDOWS: (_s(1), ""), WINDOWS_KEYED: (_s(2), "k")}
