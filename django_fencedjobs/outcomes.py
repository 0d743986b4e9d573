"""How a run ended, and what its record says: the rules that decide a run's outcome and
every message a record carries, in one place, so that a run that ended one way reads the
same whichever recorded it (the runner, the supervisor, a fenced block, a successor).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from django.db import DatabaseError

from django_fencedjobs.exceptions import FenceLost, JobTimeout, RunAborted, RunReplaced
from django_fencedjobs.models import Outcome

if TYPE_CHECKING:
    from django_fencedjobs.registry import Job

#: A run the process was asked to stop (SIGTERM, SIGINT) between batches.
INTERRUPTED = (
    "Stopped on request (SIGTERM/SIGINT) between batches; the next run continues from the "
    "committed state."
)
#: A run still marked running when a successor took its lease: recorded by the successor.
ABANDONED = (
    "The lease expired before this run finished and a later run took over (the process "
    "died, or was paused past its lease)."
)
#: A run whose lease expired and that no later run will take over: its lease row was
#: deleted, or is paused (:func:`django_fencedjobs.lease.end_orphans`).
ABANDONED_ORPHAN = (
    "The lease expired before this run finished (the process died, or was paused past its "
    "lease), and its job or instance was deleted or paused since: no later run takes over."
)


def not_run_again(outcome: str) -> str:
    """Why an attempt was recorded skipped (:attr:`~django_fencedjobs.slots.Slot.redoes`):
    the attempt before it, which ended ``outcome``, had committed its fenced work."""
    ended = (
        "its runner died before recording its end"
        if outcome in (Outcome.RUNNING, Outcome.ABANDONED)
        else f"it ended {outcome}"
    )
    return (
        f"Not run: the attempt before committed its fenced work, then {ended}; running the "
        "slot again would redo that work, and no watermark says where it stopped. Backfill "
        "the slot or run it once again to redo it."
    )


#: A run of an ``overlap="replace"`` job that still held the lease when its next slot's run
#: took it over (by another runner: this one's own stops it first, :func:`replaced`).
REPLACED_BY_CLAIM = (
    "Replaced: the job's next slot came while this run still held the lease (running, "
    "paused or gone), and that slot's run took it over (overlap='replace'); nothing this "
    "run wrote after that was committed."
)


def replaced(job: Job) -> str:
    return (
        "Replaced: the job's next slot came while this run was still going, and its run "
        "took the lease over (overlap='replace'), so no later write of this run can commit."
    )


def timed_out(job: Job) -> str:
    return (
        f"Timed out after {job.run_timeout}; the lease was revoked, so no later write of this "
        "run can commit."
    )


def fence_lost(fence: int) -> str:
    return (
        f"Fence {fence} lost: another run took the lease over (this run was paused or slow "
        "past its lease); nothing this run wrote after that was committed."
    )


def if_superseded(outcome: str, fence: int) -> tuple[str, str]:
    """What a run's end records if a successor took its lease over meanwhile: a timeout
    then was the run paused or slow past its lease, ``fence_lost``. ``("", "")``: as is."""
    if outcome == Outcome.TIMED_OUT:
        return Outcome.FENCE_LOST, fence_lost(fence)
    return "", ""


def missed(late: timedelta, job: Job) -> str:
    return (
        f"Not started: {late} after its slot, past the job's starting_deadline of "
        f"{job.starting_deadline}."
    )


def fence_gone(job: Job, fence: int) -> str:
    """What every fenced block and helper of a stopped run raises, in the handler."""
    return (
        f"job {job.name!r}: fence {fence} is no longer current: another run took the lease "
        "over, this run timed out and was revoked, or it has already been recorded. The run "
        "is over; do not retry in the handler (the next run continues from the committed "
        "state)."
    )


def fence_refused(job: Job, fence: int) -> str:
    """What a fenced block raises when its own check of the fence fails."""
    if job.exclusion == "advisory":
        refused = "another transaction of this job holds its advisory lock"
    else:
        refused = "another run took the lease over, or the run was revoked or has ended"
    return (
        f"job {job.name!r}: fence {fence} is no longer current ({refused}); nothing in this "
        "fenced block was committed"
    )


def end_refused(why: str) -> str:
    """A run whose end could not be recorded as it was (``why``: the exception, on one
    line): it is recorded failed instead, on its own, so that it holds no other run's end."""
    return (
        f"This run's end could not be recorded as it was ({why}); recorded failed instead, "
        "without the items counted outside fenced blocks."
    )


def decide(
    job: Job,
    fence: int,
    exc: BaseException | None,
    *,
    fired: type[RunAborted] | None,
    stopped: bool,
    interrupted: bool,
) -> tuple[str, str]:
    """The outcome of a run and its record's message, from what its handler raised (None:
    it returned or was given up on), what its supervisor delivered (``fired``), whether it
    was stopped (its fence is gone) and whether it stopped between batches on request: only
    that is ``interrupted``; anything else raised (``SystemExit`` too) is a failure, whose
    message the caller gives (the traceback)."""
    if fired is JobTimeout or isinstance(exc, JobTimeout):
        return Outcome.TIMED_OUT, timed_out(job)
    if fired is RunReplaced or isinstance(exc, RunReplaced):
        return Outcome.REPLACED, replaced(job)
    if fired is FenceLost:  # its interrupt carries no account of its own
        return Outcome.FENCE_LOST, fence_lost(fence)
    if isinstance(exc, FenceLost):
        return Outcome.FENCE_LOST, str(exc)
    if stopped and isinstance(exc, DatabaseError):
        # The session was ended under a run that had lost its fence.
        return Outcome.FENCE_LOST, fence_lost(fence)
    if exc is None:
        return (Outcome.INTERRUPTED, INTERRUPTED) if interrupted else (Outcome.SUCCEEDED, "")
    return Outcome.FAILED, ""


__all__ = [
    "ABANDONED",
    "ABANDONED_ORPHAN",
    "INTERRUPTED",
    "REPLACED_BY_CLAIM",
    "decide",
    "end_refused",
    "fence_gone",
    "fence_lost",
    "fence_refused",
    "not_run_again",
    "replaced",
]
