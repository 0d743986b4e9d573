"""An operator's changes of one job's lease row: make it due, pause or resume it, move its
next slot. Each waits at most :data:`~django_fencedjobs.db.LOCK_WAIT` for the row, which a
run keeps locked inside a fenced transaction, and says what it did (:class:`Change`).
:mod:`django_fencedjobs.manual` (``manage.py jobctl``, ``runjobs --now``) and the admin's
actions call them; the runner moves past a slot it cannot record with :func:`skip_slot`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from datetime import datetime

from django.db import DatabaseError
from django.db.models import Case, DateTimeField, F, Value, When

from django_fencedjobs.db import bounded_wait, is_lock_timeout, lease_db
from django_fencedjobs.lease import LeaseRow
from django_fencedjobs.models import JobInstance, JobLease


class Change(enum.Enum):
    """What an operator's change of one lease row did: the admin and ``manage.py jobctl``
    say which. True only for :attr:`DONE`, so ``if make_due(...):`` reads as before."""

    #: The row was changed.
    DONE = "done"
    #: Nothing to change: the row does not match (already due, already paused or resumed,
    #: its slot moved on meanwhile, or no such row).
    UNCHANGED = "unchanged"
    #: The row stayed locked for :data:`~django_fencedjobs.db.LOCK_WAIT`: a run is inside a
    #: fenced transaction on it. Nothing was changed; trying again in a moment usually succeeds.
    BUSY = "busy"

    def __bool__(self) -> bool:
        return self is Change.DONE


#: What to write with a change, in its transaction, once the row was changed (the record
#: of the slots an operator skipped).
Then = Callable[[], object] | None


def _bounded(change: Callable[[], bool], then: Then) -> Change:
    """``change()`` (True when it changed something) and then ``then()``, in one transaction
    whose waits for a row lock are bounded: :attr:`Change.BUSY` when one stayed locked."""
    try:
        with bounded_wait():
            changed = change()
            if changed and then is not None:
                then()
    except DatabaseError as exc:
        if is_lock_timeout(exc):
            return Change.BUSY
        raise
    return Change.DONE if changed else Change.UNCHANGED


def _locked_update(
    name: str, changes: dict[str, object], *, then: Then = None, **conditions: object
) -> Change:
    """An operator's change of the lease row ``name`` where it matches ``conditions``
    (:func:`_bounded`): both it and ``then()`` commit, or neither."""
    rows = JobLease.objects.using(lease_db()).filter(name=name, **conditions)
    return _bounded(lambda: rows.update(**changes) == 1, then)


def make_due(name: str, now: datetime) -> Change:
    """ "Run now": make the job due at ``now``. It still goes through :func:`acquire`.
    :attr:`Change.UNCHANGED` when it is due already."""
    return _locked_update(name, {"next_run_at": now}, next_run_at__gt=now)


def set_paused(name: str, paused: bool) -> Change:
    """Pause or resume the job; :attr:`Change.UNCHANGED` when it already is. A run in
    progress goes on: pausing only keeps :func:`acquire` from starting the next one."""
    return _locked_update(name, {"paused": paused}, paused=not paused)


def set_instance_paused(job: str, key: str, paused: bool, *, then: Then = None) -> Change:
    """Pause or resume the instance ``key`` of ``job``: its own ``paused`` flag, saved, which
    its lease row follows (:func:`django_fencedjobs.instances.write_lease`), so resuming a
    disabled instance leaves it disabled. :attr:`Change.UNCHANGED` when it already is (or
    there is no such instance)."""

    def change() -> bool:
        instance = (
            JobInstance.objects.using(lease_db())
            .select_for_update()
            .filter(job=job, key=key, paused=not paused)
            .first()
        )
        if instance is None:
            return False
        instance.paused = paused
        instance.save(using=lease_db(), update_fields=["paused", "updated_at"])
        return True

    return _bounded(change, then)


def skip_due(name: str, now: datetime, next_run_at: datetime, *, then: Then = None) -> Change:
    """Move the row's next slot to ``next_run_at`` when it is due at ``now`` (an instance
    resumed from now: the slots due while it was paused are skipped); ``then()`` records
    them. :attr:`Change.UNCHANGED` when it is not due."""
    return _locked_update(name, {"next_run_at": next_run_at}, then=then, next_run_at__lte=now)


def resume_from_now(
    name: str, now: datetime, next_run_at: datetime, *, then: Then = None
) -> Change:
    """Resume a paused job from now: if due, its next slot moves to ``next_run_at`` (the
    slots due while it was paused are skipped, ``then()`` records them).
    :attr:`Change.UNCHANGED` when it is not paused."""
    due = Case(
        When(next_run_at__lte=now, then=Value(next_run_at)),
        default=F("next_run_at"),
        output_field=DateTimeField(),
    )
    return _locked_update(name, {"paused": False, "next_run_at": due}, then=then, paused=True)


def skip_slot(seen: LeaseRow, *, next_run_at: datetime, then: Then = None) -> Change:
    """Move the job's next slot from the one in ``seen`` to ``next_run_at`` (a slot whose run
    row exists already, or that an operator skips), dropping a pending retry. Conditional
    on the row as seen (fence and slot): :attr:`Change.UNCHANGED` when a run took the job
    meanwhile, or the slot moved on. ``then()`` records what was skipped."""
    return _locked_update(
        seen.name,
        {"next_run_at": next_run_at, "run_slot": None, "attempt": 1},
        then=then,
        fence=seen.fence,
        next_run_at=seen.next_run_at,
    )
