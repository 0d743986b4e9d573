"""The app's tables.

* :class:`JobLease`: one row per job. It holds the fenced lease (``fence``, ``owner``,
  ``lease_until``) and the job's schedule state (``next_run_at``, ``last_success_at``,
  ``consecutive_failures``, ``paused``). Every statement that changes the lease lives in
  :mod:`django_fencedjobs.lease`.
* :class:`JobRun`: one row per run, unique on ``(job, scheduled_for)``.
* :class:`Watermark`: how far a job has got, per job and optional key, advanced in the
  same transaction as the work it covers.
* :class:`RunTask`: one row per ``django.tasks`` task a run enqueued
  (:mod:`django_fencedjobs.integrations.tasks`), written in the run's fenced transaction,
  with the task's outcome as its backend's workers report it.
* :class:`Runner`: one row per ``runjobs`` loop, and per host and job set of ``--once``
  passes, with its last beat (:mod:`django_fencedjobs.runners`).
* :class:`JobNotice`: each job's last notified state (:mod:`django_fencedjobs.notify`).
* :class:`JobInstance`: an instance of a job declared with ``instances=True``: its key,
  schedule and keyword arguments, edited without a deploy
  (:mod:`django_fencedjobs.instances`). Its lease row is a :class:`JobLease` named
  ``job[key]``, linked by :attr:`JobLease.instance`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models, router, transaction
from django.dispatch import Signal
from django.utils.translation import gettext_lazy as _

#: ``lease_until`` of a job nobody holds: any "now" is later.
LEASE_FREE = datetime(1970, 1, 1, tzinfo=UTC)


#: An instance's key: letters, digits and ``_ . : @ / + -``, so that ``job[key]`` reads
#: unambiguously in a log line, a command line and a URL.
INSTANCE_KEY = RegexValidator(
    r"^[A-Za-z0-9_.:@/+-]+\Z",
    _("A key is letters, digits and _ . : @ / + - (no spaces or brackets)."),
    code="invalid_key",
)


class RunKind(models.TextChoices):
    """Why a run exists: its job's schedule (a retry of a scheduled slot included), an
    operator's backfill of a past slot, or a one-off at an instant."""

    SCHEDULED = "scheduled", _("scheduled")
    BACKFILL = "backfill", _("backfill")
    ONCE = "once", _("one-off")


def validate_timeout(value: timedelta | None) -> None:
    """An instance's own timeout: longer than zero (None: the job's)."""
    if value is not None and value <= timedelta(0):
        raise ValidationError(_("A timeout must be longer than zero."), code="timeout_range")


def validate_grace(value: timedelta | None) -> None:
    """An instance's own grace: zero or more (None: the job's)."""
    if value is not None and value < timedelta(0):
        raise ValidationError(_("A grace cannot be negative."), code="grace_range")


#: Sent by :meth:`JobInstance.clean`; :mod:`django_fencedjobs.instances` receives it and
#: raises ``ValidationError`` for an invalid instance.
validate_instance = Signal()


class JobInstance(models.Model):
    """One instance of a job declared with ``@job(instances=True)``: a schedule of its own
    (``cron`` or ``every``, in ``timezone``, with ``jitter``) and the keyword arguments its
    handler is called with. Saving it (the admin, :meth:`Instances.upsert
    <django_fencedjobs.instances.Instances.upsert>`, ``save()``) writes its lease row in the
    same transaction: the change takes effect at the next tick."""

    job = models.CharField(_("job"), max_length=200)
    key = models.CharField(_("key"), max_length=100, validators=[INSTANCE_KEY])
    cron = models.CharField(
        _("cron"), max_length=200, blank=True, help_text=_("Five fields, e.g. 0 8 * * 1-5.")
    )
    every = models.DurationField(
        _("every"), null=True, blank=True, help_text=_("An interval instead of cron.")
    )
    timezone = models.CharField(_("timezone"), max_length=64, default="UTC")
    jitter = models.DurationField(_("jitter"), default=timedelta(0))
    enabled = models.BooleanField(_("enabled"), default=True)
    #: Paused by an operator (``manage.py jobctl pause``): no run starts until resumed. Apart
    #: from ``enabled``, so that resuming every instance of a job leaves the disabled ones
    #: disabled. Its lease row is paused while either says so (or the instance is invalid).
    paused = models.BooleanField(_("paused"), default=False, db_default=False)
    kwargs = models.JSONField(
        _("arguments"), default=dict, blank=True, help_text=_("The handler's keyword arguments.")
    )
    #: The instance's own timeout and grace; None: the job's (``@job(timeout=..., grace=...)``).
    timeout = models.DurationField(
        _("timeout"),
        null=True,
        blank=True,
        validators=[validate_timeout],
        help_text=_("Shorter than the schedule's shortest interval. Empty: the job's."),
    )
    grace = models.DurationField(
        _("grace"),
        null=True,
        blank=True,
        validators=[validate_grace],
        help_text=_("Slack past the timeout before a missing run is late. Empty: the job's."),
    )
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        verbose_name = _("instance")
        verbose_name_plural = _("instances")
        ordering = ["job", "key"]
        constraints = [
            models.UniqueConstraint(fields=["job", "key"], name="fencedjobs_instance_key"),
        ]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: Any, **kwargs: Any) -> None:
        # One transaction with what post_save writes: the instance's lease row
        # (django_fencedjobs.instances).
        using = kwargs.get("using") or router.db_for_write(JobInstance, instance=self)
        with transaction.atomic(using=using):
            super().save(*args, **kwargs)

    def clean(self) -> None:
        # The checks of the system checks, by django_fencedjobs.instances: it raises
        # ValidationError with their ids and messages.
        validate_instance.send(sender=JobInstance, instance=self)

    @property
    def name(self) -> str:
        """The instance's job name, ``job[key]``: its lease, runs, watermarks and health."""
        return f"{self.job}[{self.key}]"


class JobLease(models.Model):
    name = models.CharField(_("job"), max_length=200, unique=True)
    fence = models.BigIntegerField(
        _("fence"),
        default=0,
        help_text=_("Incremented by every acquisition and revocation; never decreases."),
    )
    owner = models.CharField(_("owner"), max_length=200, blank=True)
    lease_until = models.DateTimeField(_("lease until"), default=LEASE_FREE)
    next_run_at = models.DateTimeField(_("next run at"))
    last_success_at = models.DateTimeField(_("last success at"), null=True, blank=True)
    consecutive_failures = models.PositiveIntegerField(_("consecutive failures"), default=0)
    #: How many of the job's judged slots ago (its runs' ends that rate it, as
    #: ``consecutive_failures`` counts them) its latest failure was, and the failure before
    #: that: 1 when the latest judged slot failed; None when there was none. Written by
    #: the same statements as ``consecutive_failures``, so that health finds the instances
    #: whose failure rate may warn (two failures within ``FAILURE_RATE_RUNS``) on their
    #: rows alone, however long their history.
    last_failure_age = models.PositiveIntegerField(_("last failure age"), null=True, blank=True)
    previous_failure_age = models.PositiveIntegerField(
        _("previous failure age"), null=True, blank=True
    )
    paused = models.BooleanField(_("paused"), default=False)
    schedule_fingerprint = models.CharField(_("schedule fingerprint"), max_length=64, blank=True)
    #: The instance this row is the lease of; None for a job declared with a schedule. An
    #: instance deleted takes its lease row with it (a run of it then loses its fence).
    instance = models.OneToOneField(
        JobInstance,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="lease",
        verbose_name=_("instance"),
    )
    #: The job an instance's row belongs to (its ``JobInstance.job``), kept on the row so
    #: that the tick reads one job's due instances by one index; "" for a job declared with
    #: a schedule.
    parent = models.CharField(_("instance of"), max_length=200, blank=True, default="")
    #: An instance's dead man's switch, stored so that health finds the late ones by an
    #: index among any number of instances: the deadline of the first slot after its last
    #: success (never succeeded: after it was created), :meth:`Job.late_after
    #: <django_fencedjobs.registry.Job.late_after>`. Written when the instance is saved and
    #: at each success; None for a job declared with a schedule (health computes its own).
    late_after = models.DateTimeField(_("late after"), null=True, blank=True)
    #: When set, the next acquisition runs for this slot, as attempt ``attempt``, instead
    #: of the schedule's: a retry of a failed run (:mod:`django_fencedjobs.retries`; a
    #: later slot due by then supersedes it), a backfill's slot or a one-off's instant
    #: (``kind``; :mod:`django_fencedjobs.oneshots`).
    run_slot = models.DateTimeField(_("run slot"), null=True, blank=True)
    attempt = models.PositiveIntegerField(_("attempt"), default=1, db_default=1)
    #: ``scheduled`` for a job's or an instance's row; ``backfill`` or ``once`` for a row
    #: that runs one slot of job ``parent`` (``run_slot``) and is then done (paused).
    kind = models.CharField(
        _("kind"),
        max_length=16,
        choices=RunKind.choices,
        default=RunKind.SCHEDULED,
        # Also the database's: rows written by an older release during a rolling deploy.
        db_default=RunKind.SCHEDULED,
    )
    #: A one-off's keyword arguments for the handler (None: the job's or instance's own).
    kwargs = models.JSONField(_("arguments"), null=True, blank=True)
    backfill = models.ForeignKey(
        "Backfill",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="rows",
        verbose_name=_("backfill"),
    )
    #: A backfill slot's or one-off's row: the fence of the run whose fenced work last
    #: committed, written in that work's own transaction. Still equal to the row's fence
    #: when the row is due again, it says that the run committed and never recorded its
    #: end (its runner died): the slot is not run again unless that run's work is tracked
    #: by a watermark a next attempt resumes from (:func:`django_fencedjobs.runner.claim_oneshots`).
    committed_fence = models.BigIntegerField(_("committed fence"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"))
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        verbose_name = _("job")
        verbose_name_plural = _("jobs")
        ordering = ["name"]
        # No index on next_run_at alone: jobs declared with a schedule are read by name,
        # and every acquisition moves next_run_at (an index on it is one more entry to
        # write per run, for no read).
        indexes = [
            # The tick's claim of a job's due instances: the earliest first, by this index
            # alone, however many instances it and other jobs have (paused rows, disabled
            # ones, are not in it).
            models.Index(
                fields=["parent", "next_run_at"],
                condition=models.Q(instance__isnull=False, paused=False),
                name="fencedjobs_instance_due",
            ),
            # The tick's claim of a job's due backfill slots and one-offs, as above.
            models.Index(
                fields=["parent", "next_run_at"],
                condition=models.Q(paused=False) & ~models.Q(kind=RunKind.SCHEDULED),
                name="fencedjobs_oneshot_due",
            ),
            # Health's read of the instances that may be late, by their stored deadline.
            models.Index(
                fields=["late_after"],
                condition=models.Q(instance__isnull=False),
                name="fencedjobs_instance_late",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class Outcome(models.TextChoices):
    RUNNING = "running", _("running")
    SUCCEEDED = "succeeded", _("succeeded")
    FAILED = "failed", _("failed")
    TIMED_OUT = "timed_out", _("timed out")
    FENCE_LOST = "fence_lost", _("fence lost")
    MISSED = "missed", _("missed")
    #: Not run: an operator skipped the slot (``jobctl skip``, ``resume --from-now``, the
    #: admin); the record's ``owner`` names who.
    SKIPPED = "skipped", _("skipped")
    ABANDONED = "abandoned", _("abandoned")
    INTERRUPTED = "interrupted", _("interrupted")


#: A run's failure: what counts towards ``consecutive_failures`` and the failed runs of the
#: failure rate. Its handler raised or overran its timeout; a run that was missed,
#: interrupted, abandoned or lost its fence says nothing against the job's own code.
FAILURE_OUTCOMES = frozenset({Outcome.FAILED, Outcome.TIMED_OUT})
#: The runs the failure rate is read over: those that ran to an end, succeeding or failing.
RATED_OUTCOMES = frozenset({Outcome.SUCCEEDED, *FAILURE_OUTCOMES})
#: A record whose run may still be recorded as ended: running, or abandoned by a successor
#: while its process was paused (the run's own account, when it comes, is the better one).
ENDABLE_OUTCOMES = frozenset({Outcome.RUNNING, Outcome.ABANDONED})


class JobRun(models.Model):
    job = models.CharField(_("job"), max_length=200)
    scheduled_for = models.DateTimeField(_("scheduled for"))
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    outcome = models.CharField(
        _("outcome"), max_length=16, choices=Outcome.choices, default=Outcome.RUNNING
    )
    capped = models.BooleanField(
        _("capped"), default=False, help_text=_("Stopped at max_batches with work left.")
    )
    items = models.BigIntegerField(_("items"), default=0)
    batches = models.IntegerField(_("batches"), default=0)
    fence = models.BigIntegerField(_("fence"), default=0)
    owner = models.CharField(_("owner"), max_length=200, blank=True)
    missed_slots = models.IntegerField(
        _("missed slots"),
        default=0,
        help_text=_("Earlier due slots coalesced into this run, or skipped by its catch-up."),
    )
    #: 1 for a slot's first run; each retry, and each backfill run of a slot that has
    #: runs, is the next attempt. A slot is judged by its last attempt.
    attempt = models.PositiveIntegerField(_("attempt"), default=1, db_default=1)
    kind = models.CharField(
        _("kind"),
        max_length=16,
        choices=RunKind.choices,
        default=RunKind.SCHEDULED,
        # Also the database's: rows written by an older release during a rolling deploy.
        db_default=RunKind.SCHEDULED,
    )
    #: The start of the run's data interval, which ends at ``scheduled_for``: the slot
    #: before (before the first coalesced one, for a run covering missed slots).
    interval_start = models.DateTimeField(_("interval start"), null=True, blank=True)
    watermark_before = models.CharField(_("watermark before"), max_length=64, blank=True)
    watermark_after = models.CharField(_("watermark after"), max_length=64, blank=True)
    error = models.TextField(_("error"), blank=True)

    class Meta:
        verbose_name = _("run")
        verbose_name_plural = _("runs")
        ordering = ["-scheduled_for", "-id"]
        constraints = [
            # Each attempt at a slot is recorded once: a second run of the same attempt
            # (two runners, a run now landing on a recorded slot) cannot exist.
            models.UniqueConstraint(
                fields=["job", "scheduled_for", "attempt"], name="fencedjobs_run_once"
            ),
        ]
        indexes = [
            models.Index(fields=["-scheduled_for", "-id"], name="fencedjobs_run_recent"),
            models.Index(fields=["job", "-scheduled_for"], name="fencedjobs_run_job_recent"),
            models.Index(fields=["outcome", "-scheduled_for"], name="fencedjobs_run_outcome"),
            # Health's read of the jobs whose last run may have stopped at max_batches: the
            # few capped runs, not every run of a day.
            models.Index(
                fields=["-scheduled_for"],
                condition=models.Q(capped=True),
                name="fencedjobs_run_capped",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job} @ {self.scheduled_for:%Y-%m-%d %H:%M:%S} UTC ({self.outcome})"

    @property
    def duration(self) -> float | None:
        """Seconds from start to finish: the one definition of how long a run took (the
        admin, health and the metrics read it). None while it runs, for a run that never
        started (missed), and for an abandoned one: its process died at a time nobody
        recorded, and ``finished_at`` is when a later run noticed."""
        if self.started_at is None or self.finished_at is None:
            return None
        if self.outcome == Outcome.ABANDONED:
            return None
        return (self.finished_at - self.started_at).total_seconds()


class BackfillSelection(models.TextChoices):
    MISSING = "missing", _("missing: slots with no run")
    FAILED = "failed", _("failed: slots whose last attempt did not succeed")
    ALL = "all", _("all slots")


class Backfill(models.Model):
    """An operator's request to run every selected slot of a job in ``[start, end)``: each
    slot is a lease row of kind ``backfill`` (:mod:`django_fencedjobs.backfills`), run by
    the runners at most ``concurrency`` at once, in ``order``."""

    job = models.CharField(_("job"), max_length=200)
    start = models.DateTimeField(_("from"))
    end = models.DateTimeField(_("to"), help_text=_("Exclusive."))
    selection = models.CharField(_("slots"), max_length=16, choices=BackfillSelection.choices)
    newest_first = models.BooleanField(_("newest first"), default=False)
    concurrency = models.PositiveIntegerField(_("at once"), default=1)
    slots = models.PositiveIntegerField(_("slots"), default=0)
    requested_by = models.CharField(_("requested by"), max_length=200, blank=True)
    #: By the app's clock, as the runs it makes are.
    created_at = models.DateTimeField(_("created at"))

    class Meta:
        verbose_name = _("backfill")
        verbose_name_plural = _("backfills")
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.job} {self.start:%Y-%m-%d %H:%M} to {self.end:%Y-%m-%d %H:%M} UTC"


class Watermark(models.Model):
    job = models.CharField(_("job"), max_length=200)
    key = models.CharField(_("key"), max_length=200, blank=True, default="")
    position = models.DateTimeField(_("position"), null=True, blank=True)
    cursor = models.BigIntegerField(_("cursor"), null=True, blank=True)
    fence = models.BigIntegerField(_("fence of last writer"), default=0)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        verbose_name = _("watermark")
        verbose_name_plural = _("watermarks")
        constraints = [
            models.UniqueConstraint(fields=["job", "key"], name="fencedjobs_watermark_unique"),
        ]

    def __str__(self) -> str:
        label = f"{self.job}[{self.key}]" if self.key else self.job
        return f"{label} = {self.value}"

    @property
    def value(self) -> datetime | int | None:
        return self.position if self.position is not None else self.cursor


class TaskStatus(models.TextChoices):
    #: Recorded in the run's committed transaction, to be handed to a backend that does not
    #: write to the lease database right after that commit; still this status means the
    #: hand-over never happened (the runner stopped in between): the task is lost, and the
    #: job reads late.
    PENDING = "pending", _("not dispatched")
    READY = "ready", _("enqueued")
    RUNNING = "running", _("running")
    SUCCESSFUL = "successful", _("successful")
    FAILED = "failed", _("failed")


#: A task not started yet: recorded, or handed to its backend and waiting for a worker.
NOT_STARTED_TASK = frozenset({TaskStatus.PENDING, TaskStatus.READY})
#: A task that has not finished: its run's slot waits for it (health reads the job late
#: past the slot's deadline).
UNFINISHED_TASK = frozenset({*NOT_STARTED_TASK, TaskStatus.RUNNING})
#: A task that has finished: its status is its outcome, and no report changes it any more.
FINISHED_TASK = frozenset({TaskStatus.SUCCESSFUL, TaskStatus.FAILED})


class RunTask(models.Model):
    run = models.ForeignKey(
        JobRun, on_delete=models.CASCADE, related_name="tasks", verbose_name=_("run")
    )
    #: The run's job and fence, copied: a task's fence check and the job's health read them
    #: without joining the run.
    job = models.CharField(_("job"), max_length=200)
    fence = models.BigIntegerField(_("fence"))
    task_path = models.CharField(_("task"), max_length=300)
    backend = models.CharField(_("backend"), max_length=100)
    result_id = models.CharField(
        _("result id"), max_length=200, blank=True, help_text=_("The backend's id of the task.")
    )
    status = models.CharField(
        _("status"), max_length=16, choices=TaskStatus.choices, default=TaskStatus.PENDING
    )
    enqueued_at = models.DateTimeField(_("enqueued at"), null=True, blank=True)
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    error = models.TextField(_("error"), blank=True)
    #: The queue the task was enqueued on (the task's ``queue_name``).
    queue_name = models.CharField(_("queue"), max_length=100, blank=True, default="", db_default="")
    #: A task handed over after its run's commit: what to hand over (``{"args": [...],
    #: "kwargs": {...}}``), how many times it was tried, when the relay may try next and
    #: why the last try failed (:mod:`django_fencedjobs.integrations.relay`).
    call = models.JSONField(_("call"), null=True, blank=True)
    handovers = models.PositiveIntegerField(_("hand-overs"), default=0, db_default=0)
    handover_after = models.DateTimeField(_("next hand-over"), null=True, blank=True)
    #: The task's execution whose fenced writes committed first: any other delivery of the
    #: task (a relay retry, a broker's redelivery) writes nothing, and is counted here.
    executor = models.CharField(_("executor"), max_length=64, blank=True, default="", db_default="")
    duplicates = models.PositiveIntegerField(_("duplicate deliveries"), default=0, db_default=0)

    class Meta:
        verbose_name = _("task")
        verbose_name_plural = _("tasks")
        ordering = ["run", "id"]
        indexes = [
            # A worker finds the task it starts by the backend's id.
            models.Index(fields=["backend", "result_id"], name="fencedjobs_task_result"),
            # Health reads each job's oldest unfinished task (few rows of these statuses)...
            models.Index(fields=["status", "job"], name="fencedjobs_task_status"),
            # ... and its latest finished one (later runs have higher fences).
            models.Index(fields=["job", "-fence"], name="fencedjobs_task_job_recent"),
            # The relay's read of the tasks still to hand over.
            models.Index(
                fields=["handover_after"],
                condition=models.Q(status=TaskStatus.PENDING),
                name="fencedjobs_task_pending",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_path} ({self.status})"


class TaskDelivery(models.Model):
    """One hand-over of a :class:`RunTask` to its backend, by the id the backend gave it: a
    worker starting a task finds its record by this id, whichever delivery it got."""

    #: The :class:`RunTask`'s id: not a foreign key, so that deleting old runs deletes
    #: their task records in one statement each (retention deletes the deliveries too).
    task_id = models.BigIntegerField(_("task"), db_index=True)
    backend = models.CharField(_("backend"), max_length=100)
    result_id = models.CharField(_("result id"), max_length=200)
    delivered_at = models.DateTimeField(_("delivered at"))

    class Meta:
        verbose_name = _("task delivery")
        verbose_name_plural = _("task deliveries")
        constraints = [
            models.UniqueConstraint(
                fields=["backend", "result_id"], name="fencedjobs_delivery_result"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.backend}:{self.result_id}"


class RunnerMode(models.TextChoices):
    #: ``runjobs``: a loop, seen by its beat.
    LOOP = "loop", _("loop")
    #: ``runjobs --once`` (cron): one row per host and set of jobs, its last pass.
    ONCE = "once", _("--once")


class Runner(models.Model):
    """A ``runjobs`` process (``loop``) or the ``runjobs --once`` passes of one host for one
    set of jobs (``once``): who runs which jobs, and when each was last seen
    (:mod:`django_fencedjobs.runners`)."""

    #: A loop's own random key; ``once:<host>:<digest of its jobs>`` for passes.
    key = models.CharField(_("key"), max_length=200, unique=True)
    mode = models.CharField(_("mode"), max_length=8, choices=RunnerMode.choices)
    owner = models.CharField(_("owner"), max_length=200)
    host = models.CharField(_("host"), max_length=255)
    pid = models.IntegerField(_("pid"))
    version = models.CharField(_("version"), max_length=40, blank=True)
    workers = models.IntegerField(_("workers"))
    #: The names of the jobs it runs, one per line.
    jobs = models.TextField(_("jobs"), blank=True)
    started_at = models.DateTimeField(_("started at"))
    #: A loop's latest beat; for passes, the start of the latest.
    last_beat_at = models.DateTimeField(_("last seen"))
    stopped_at = models.DateTimeField(_("stopped at"), null=True, blank=True)

    class Meta:
        verbose_name = _("runner")
        verbose_name_plural = _("runners")
        ordering = ["-last_beat_at"]
        indexes = [models.Index(fields=["last_beat_at"], name="fencedjobs_runner_seen")]

    def __str__(self) -> str:
        return f"{self.owner} ({self.mode})"

    @property
    def job_names(self) -> list[str]:
        return [name for name in self.jobs.splitlines() if name]


class JobNotice(models.Model):
    """A job's last recorded state for notifications (:mod:`django_fencedjobs.notify`): a
    change is recorded here by a compare-and-set, and only the process that recorded it
    tells anyone."""

    job = models.CharField(_("job"), max_length=200, unique=True)
    #: ``ok``, or the state notified: ``late``, ``failing``, ``no_runner``, ``invalid``.
    state = models.CharField(_("state"), max_length=16)
    severity = models.CharField(_("severity"), max_length=8)
    reason = models.TextField(_("reason"), blank=True)
    changed_at = models.DateTimeField(_("changed at"))
    #: The process that recorded the change (a runner's owner label, or checkjobs').
    changed_by = models.CharField(_("changed by"), max_length=200, blank=True)

    class Meta:
        verbose_name = _("job notice")
        verbose_name_plural = _("job notices")

    def __str__(self) -> str:
        return f"{self.job}: {self.state} ({self.severity})"
