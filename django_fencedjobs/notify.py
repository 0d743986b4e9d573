"""Someone is told: a job's change of state, mailed once and signalled once.

Opt-in (``FENCEDJOBS["NOTIFY"]``). Each runner loop (:func:`evaluate_all`) and each
``checkjobs`` evaluates the jobs, so a change is told even when no runner is alive. Once,
whatever the number of observers: each job's :func:`condition` is a
:class:`~django_fencedjobs.models.JobNotice` row, changed by a compare-and-set on the state
and severity read, and only the process whose statement changed it tells (a mail, then the
``job_state_changed`` signal). It is recorded before it is sent: a refused mail is logged,
not sent again. See docs/alerting.md.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from django.conf import settings as django_settings
from django.core.mail import get_connection, mail_admins, send_mail
from django.db import connections

from django_fencedjobs import clock, instances, signals
from django_fencedjobs.conf import get_settings
from django_fencedjobs.db import lease_db
from django_fencedjobs.health import (
    UNJUDGED,
    InstanceSummary,
    JobFacts,
    JobHealth,
    Severity,
    State,
    instance_summaries,
)
from django_fencedjobs.models import JobNotice

logger = logging.getLogger("django_fencedjobs")

__all__ = ["Transition", "condition", "evaluate", "evaluate_all"]

#: The states someone is told about; every other reads ``ok``.
TOLD = frozenset({State.LATE, State.FAILING, State.NO_RUNNER, State.INVALID})
#: The condition of a job that needs nobody.
OK = ("ok", Severity.HEALTHY.value)
#: The name of the condition of all of a job's instances together: ``job[*]``.
ALL_INSTANCES = "[*]"
#: How many instances' keys a message about many names; the others are counted.
KEYS_NAMED = 10
#: A runner evaluates the jobs every this many beats.
BEATS_PER_EVALUATION = 3
#: Seconds a mail may wait on the mail server when ``EMAIL_TIMEOUT`` is not set.
MAIL_TIMEOUT = 10


def condition(health: JobHealth) -> tuple[str, str]:
    """(state, severity) as notifications see it: the state when someone is told about it,
    else ``ok``."""
    if health.state in TOLD:
        return health.state.value, health.severity.value
    return OK


def _label(value: tuple[str, str]) -> str:
    state, severity = value
    return f"{state} ({severity})" if state == State.FAILING else state


@dataclass(frozen=True)
class Transition:
    """A job's change of condition, recorded by this process; or, told in one message, the
    same change of many instances of one job (:attr:`members`), this one first."""

    name: str
    previous: tuple[str, str]
    current: tuple[str, str]
    health: JobHealth
    recorded_by: str
    #: The names of the instances this message tells the change of (empty: ``name`` only).
    members: tuple[str, ...] = ()
    #: Their job (declared with ``instances=True``), when :attr:`members` is not empty.
    parent: str = ""

    @property
    def back_to_ok(self) -> bool:
        return self.current == OK

    @property
    def who(self) -> str:
        if self.members:
            return f"{len(self.members)} instances of {self.parent}"
        if self.name.endswith(ALL_INSTANCES):
            return f"the instances of {self.name.removesuffix(ALL_INSTANCES)}"
        return self.name

    @property
    def subject(self) -> str:
        return f"{self.who}: {_label(self.previous)} -> {_label(self.current)}"

    def body(self) -> str:
        h = self.health
        many = bool(self.members) or self.name.endswith(ALL_INSTANCES)
        verb, was = ("are", "they were") if many else ("is", "it was")
        state = _label(self.current)
        if self.back_to_ok:
            state = "ok again" + ("" if many else f" ({h.state.value})")
        lines = [f"{self.who} {verb} {state}; {was} {_label(self.previous)}.", ""]
        if self.members:
            keys = [instances.parse_name(name) or ("", name) for name in self.members]
            named = ", ".join(key for _, key in keys[:KEYS_NAMED])
            more = len(keys) - KEYS_NAMED
            lines += [f"Instances: {named}" + (f", and {more} more" if more > 0 else ""), ""]
            lines += [f"The first, {self.name}:", ""]
        lines += [
            f"Why: {h.reason}",
            "",
            f"Checked at: {h.at(h.checked_at)}",
            f"Recorded by: {self.recorded_by}",
            f"Schedule: {h.schedule or '-'}",
            f"Last success: {h.at(h.last_success_at) if h.last_success_at else 'never'}",
            f"Next run: {h.at(h.next_run_at) if h.next_run_at else '-'}",
            f"Runners: {', '.join(h.runners) or 'none live'}",
        ]
        if h.recent_runs:
            lines.append(f"Recent runs: {h.recent_failures} of {h.recent_runs} failed")
        lines += [
            "",
            "Sent once for this change; the next message comes when the job's state changes "
            "again. `manage.py checkjobs` and the admin show every job's state.",
        ]
        return "\n".join(lines)


def evaluate(
    healths: Sequence[JobHealth],
    *,
    now: datetime | None = None,
    background: bool = False,
    summaries: Sequence[InstanceSummary] | None = None,
) -> list[Transition]:
    """Record the changes of condition among ``healths`` (and of each job's instances
    together, from ``summaries``: :func:`~django_fencedjobs.health.instance_summaries` of
    ``healths``, read here when not given) that this process is the first to see, and tell
    them (from a thread of their own with ``background``: a runner's loop). Nothing when
    ``NOTIFY`` is off. Returns the transitions this process recorded."""
    settings = get_settings()
    if not settings.NOTIFY:
        return []
    now = now or (healths[0].checked_at if healths else clock.now())
    if summaries is None:
        summaries = instance_summaries(healths, now=now)
    # A job whose instances were counted, not all judged (more may not be ok than health
    # judges one by one): told once for all of them, by job[*], not instance by instance.
    counted = {summary.job for summary in summaries if summary.counted is not None}
    judged = [
        *(h for h in healths if h.job is None or h.job.parent not in counted),
        *(_of_all(summary, now) for summary in summaries if summary.total),
    ]
    if not judged:
        return []
    recorded = _record(judged, now, settings.owner)
    told = _messages(recorded)
    if told and background:
        threading.Thread(
            target=_tell_all, args=(told,), name="fencedjobs-notify", daemon=True
        ).start()
    elif told:
        _tell_all(told, close=False)
    return recorded


def _of_all(summary: InstanceSummary, now: datetime) -> JobHealth:
    """One condition for all of a job's instances (``job[*]``): ``no_runner`` while no live
    runner serves them; the worst of their states while they are counted, not judged; else
    ok. A dead runner or a bad deploy is one message, not one per instance."""
    enabled = summary.total - summary.disabled
    if summary.no_runner:
        state, severity = State.NO_RUNNER, Severity.CRITICAL
        reason = f"{enabled} enabled instance(s): {summary.no_runner}"
    elif summary.counted is not None and summary.worst != UNJUDGED:
        state, severity = State(summary.worst), summary.severity
        counts = ", ".join(f"{count} {name}" for name, count in summary.states.items())
        reason = (
            f"{summary.states[state]} of {enabled} enabled instance(s) {state.value}, counted "
            f"by their lease rows ({counts}, {summary.ok} ok)"
        )
    else:
        state, severity = State.OK, Severity.HEALTHY
        reason = f"a live runner serves the {enabled} enabled instance(s)"
    return JobFacts(name=summary.job + ALL_INSTANCES, checked_at=now).judged(
        state, severity, reason
    )


def _messages(transitions: Sequence[Transition]) -> list[Transition]:
    """What to tell of ``transitions``: a job's on its own; the same change of several
    instances of one job in one message. An instance's change to ``no_runner`` (and back to
    ok from it) is told once for all its job's instances, by ``job[*]``."""
    told: list[Transition] = []
    groups: dict[tuple[str, tuple[str, str], tuple[str, str]], list[Transition]] = {}
    for transition in transitions:
        job = transition.health.job
        parent = job.parent if job is not None else None
        if parent is None:
            told.append(transition)
            continue
        if transition.current[0] == State.NO_RUNNER or (
            transition.previous[0] == State.NO_RUNNER and transition.back_to_ok
        ):
            continue
        groups.setdefault((parent, transition.previous, transition.current), []).append(transition)
    for (parent, _, _), members in groups.items():
        if len(members) == 1:
            told.append(members[0])
        else:
            names = tuple(sorted(m.name for m in members))
            first = next(m for m in members if m.name == names[0])
            told.append(replace(first, members=names, parent=parent))
    return told


def _tell_all(transitions: Sequence[Transition], *, close: bool = True) -> None:
    try:
        for transition in transitions:
            _tell(transition)
    finally:
        if close:
            connections.close_all()  # this thread's, opened by a receiver


def _record(healths: Sequence[JobHealth], now: datetime, owner: str) -> list[Transition]:
    notices = JobNotice.objects.using(lease_db())
    rows = notices.filter(job__in=[h.name for h in healths]).values_list("job", "state", "severity")
    known = {job: (state, severity) for job, state, severity in rows}
    missing = [h.name for h in healths if h.name not in known]
    if missing:
        # A job without a row is ok: racing creators are harmless (the name is unique).
        notices.bulk_create(
            [JobNotice(job=name, state=OK[0], severity=OK[1], changed_at=now) for name in missing],
            ignore_conflicts=True,
        )
    recorded = []
    for health in healths:
        previous = known.get(health.name, OK)
        current = condition(health)
        if current == previous:
            continue
        changed = notices.filter(job=health.name, state=previous[0], severity=previous[1]).update(
            state=current[0],
            severity=current[1],
            reason=health.reason,
            changed_at=now,
            changed_by=owner,
        )
        if changed:  # ours: every other observer's statement finds the new state
            recorded.append(Transition(health.name, previous, current, health, owner))
    return recorded


def _tell(transition: Transition) -> None:
    logger.log(
        logging.INFO if transition.back_to_ok else logging.WARNING,
        "job state changed: %s",
        transition.subject,
        extra={
            "event": "job_state_changed",
            "job": transition.name,
            "state": transition.current[0],
            "severity": transition.current[1],
            "previous_state": transition.previous[0],
        },
    )
    email = get_settings().NOTIFY_EMAIL  # "ADMINS", or the addresses (maybe none)
    try:
        # A bounded wait on the mail server, whatever EMAIL_TIMEOUT says (None: forever).
        connection = get_connection(timeout=django_settings.EMAIL_TIMEOUT or MAIL_TIMEOUT)
        if email == "ADMINS":
            mail_admins(transition.subject, transition.body(), connection=connection)
        elif email:
            send_mail(
                str(django_settings.EMAIL_SUBJECT_PREFIX) + transition.subject,
                transition.body(),
                str(django_settings.SERVER_EMAIL),
                list(email),
                connection=connection,
            )
    except Exception:
        logger.exception(
            "could not mail the change of %s (%s); it is recorded, and not sent again",
            transition.name,
            transition.subject,
            extra={"event": "notification_failed", "job": transition.name},
        )
    signals.send(signals.job_state_changed, transition=transition)


def evaluate_all(now: datetime | None = None) -> None:
    """A runner's chore, every :data:`BEATS_PER_EVALUATION` beats while ``NOTIFY`` is on:
    judge every job and tell its changes, from a thread of their own."""
    from django_fencedjobs import health

    evaluate(health.all_health(), background=True)
