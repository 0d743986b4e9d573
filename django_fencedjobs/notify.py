"""Someone is told: a job's change of state, mailed once and signalled once.

Opt-in: ``FENCEDJOBS["NOTIFY"] = True``. Whoever judges the jobs evaluates them: each runner
loop every third beat (15 s by default: :func:`evaluate_all`, one of the runner's chores,
:mod:`django_fencedjobs.chores`), and ``checkjobs`` each time it runs, so a change is told
even when no runner is alive.

What is told is the job's **condition**: its state and severity when the state is one that
needs someone (``late``, ``failing``, ``no_runner``, ``invalid``), else ``ok`` (``ok``,
``running``, ``never_run``, ``paused``, ``capped``, ``removed``). A change of condition is a
:class:`Transition`: ok to late, late to failing, failing (warning) to failing (critical),
and back to ok.

Once, whatever the number of observers: each job's condition is kept in a
:class:`~django_fencedjobs.models.JobNotice` row, and a change is recorded with a
compare-and-set on it (``UPDATE ... WHERE job = %s AND state = <the state read> AND
severity = <the severity read>``). One process's statement changes the row; every other
one, which read the same old state, changes none and tells nobody. Only the process that
recorded the change sends it: a mail (``NOTIFY_EMAIL``: ``"ADMINS"``, through
``mail_admins``, or a list of addresses) and the ``job_state_changed`` signal, for any
other channel. A job without a row is ``ok`` (its row is created so): turning notifications
on while a job is late tells it.

The change is recorded before it is sent: a mail the server refuses is logged (an error,
with the transition) and not sent again; the next change is. The wait on the mail server
is bounded (``EMAIL_TIMEOUT``, else :data:`MAIL_TIMEOUT`), and a runner tells from a
thread of its own, so a slow mail server never holds up its loop or its beats.
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
    JobHealth,
    Severity,
    State,
    instance_summaries,
)
from django_fencedjobs.instants import format_instant
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
    if value == OK:
        return "ok"
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
        if self.back_to_ok:
            again = "" if many else f" ({h.state.value})"
            head = f"{self.who} {verb} ok again{again}; {was} {_label(self.previous)}."
        else:
            head = f"{self.who} {verb} {_label(self.current)}; {was} {_label(self.previous)}."
        lines = [head, ""]
        if self.members:
            keys = [instances.parse_name(name) or ("", name) for name in self.members]
            named = ", ".join(key for _, key in keys[:KEYS_NAMED])
            more = len(keys) - KEYS_NAMED
            lines += [f"Instances: {named}" + (f", and {more} more" if more > 0 else ""), ""]
            lines += [f"The first, {self.name}:", ""]
        lines += [f"Why: {h.reason}", ""]
        facts = [
            ("Checked at", format_instant(h.checked_at, h.tz)),
            ("Recorded by", self.recorded_by),
            ("Schedule", h.schedule or "-"),
            (
                "Last success",
                format_instant(h.last_success_at, h.tz) if h.last_success_at else "never",
            ),
            ("Next run", format_instant(h.next_run_at, h.tz) if h.next_run_at else "-"),
            ("Runners", ", ".join(h.runners) or "none live"),
        ]
        if h.recent_runs:
            facts.append(("Recent runs", f"{h.recent_failures} of {h.recent_runs} failed"))
        lines += [f"{label}: {value}" for label, value in facts]
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
    them (mail, then ``job_state_changed``), the same change of many instances of one job in
    one message. Nothing when ``NOTIFY`` is off. Returns the transitions this process
    recorded.

    With ``background`` (a runner's loop), they are told from a thread of their own, so
    that a slow mail server never holds up the loop and its beats."""
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
        *_all_instances(summaries, now),
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


def _all_instances(summaries: Sequence[InstanceSummary], now: datetime) -> list[JobHealth]:
    """Per job with instances, one condition for all of them (``job[*]``): ``no_runner``
    while no live runner serves the job's enabled instances; the worst of their states while
    more may not be ok than health judges one by one (counted by their lease rows); else
    ok. A dead runner or a bad deploy is one message for all the instances it touched, not
    one per instance."""
    return [_of_all(summary, now) for summary in summaries if summary.total]


def _of_all(summary: InstanceSummary, now: datetime) -> JobHealth:
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
    return JobHealth(
        name=summary.job + ALL_INSTANCES,
        checked_at=now,
        state=state,
        severity=severity,
        reason=reason,
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
    known = {
        row["job"]: (row["state"], row["severity"])
        for row in notices.filter(job__in=[h.name for h in healths]).values(
            "job", "state", "severity"
        )
    }
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


def _recipients() -> list[str] | None:
    """None: ``mail_admins``; else the addresses (maybe none)."""
    email = get_settings().NOTIFY_EMAIL
    return None if email == "ADMINS" else list(email)


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
    recipients = _recipients()
    try:
        # A bounded wait on the mail server, whatever EMAIL_TIMEOUT says (None: forever).
        connection = get_connection(timeout=django_settings.EMAIL_TIMEOUT or MAIL_TIMEOUT)
        if recipients is None:
            mail_admins(transition.subject, transition.body(), connection=connection)
        elif recipients:
            prefix = str(django_settings.EMAIL_SUBJECT_PREFIX)
            send_mail(
                prefix + transition.subject,
                transition.body(),
                str(django_settings.SERVER_EMAIL),
                recipients,
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
