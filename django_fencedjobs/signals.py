"""Signals the runner sends, for integrations (Sentry Crons, metrics) and users.

Receivers are called with ``send_robust``: a failing receiver is logged, never breaks a run.

* ``run_started(sender=Job, job, record)``: the lease is taken and the run recorded.
* ``run_finished(sender=Job, job, record)``: the outcome is recorded (also for ``missed``).
* ``tick_finished(sender=Job, now)``: after each pass over the due jobs (housekeeping).
"""

from django.dispatch import Signal

run_started = Signal()
run_finished = Signal()
tick_finished = Signal()
