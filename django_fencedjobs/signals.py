"""Signals the runner sends, for integrations (Sentry Crons, metrics) and users.

Receivers are called with ``send_robust``: a failing receiver is logged, never breaks a run.

* ``run_started(sender=Job, job, record)``: the lease is taken and the run recorded.
* ``run_finished(sender=Job, job, record)``: the outcome is recorded (also for ``missed``).
* ``tick_finished(sender=Job, now)``: after each pass over the due jobs.
* ``run_tasks_finished(sender=Job, job, record, failed)``: the last unfinished task a run
  enqueued (:mod:`django_fencedjobs.integrations.tasks`) has finished, in the worker
  process that ran it; ``failed`` is True when any task of the run failed. ``job`` is None
  when the worker's process does not declare the job.
* ``runner_beat(sender=Job, interval)``: a runner's loop recorded its beat (every
  ``interval`` seconds, ``RUNNER_BEAT``).
* ``job_state_changed(sender=Job, transition)``: a job's state changed
  (:class:`~django_fencedjobs.notify.Transition`: ok to late, failing, no_runner or
  invalid, and back), with ``FENCEDJOBS["NOTIFY"]`` on; sent once per message, by the one
  process that recorded it (a runner or ``checkjobs``), after the mail: the same change of
  many instances of one job is one message (``transition.members``).
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger("django_fencedjobs")

run_started = Signal()
run_finished = Signal()
tick_finished = Signal()
run_tasks_finished = Signal()
runner_beat = Signal()
job_state_changed = Signal()


def send(signal: Signal, **kwargs: Any) -> None:
    """Send ``signal``; a receiver that raises is logged and the run goes on."""
    from django_fencedjobs.registry import Job

    for receiver, result in signal.send_robust(sender=Job, **kwargs):
        if isinstance(result, Exception):
            logger.error(
                "signal receiver %r failed: %s",
                receiver,
                result,
                exc_info=result,
                extra={"event": "receiver_failed"},
            )
