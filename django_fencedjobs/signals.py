"""Signals the runner sends (``sender=Job``), for integrations (Sentry Crons, metrics) and
users: their arguments and when each is sent are in docs/api.md, "Signals". Receivers are
called with ``send_robust``: a failing receiver is logged, never breaks a run.
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
