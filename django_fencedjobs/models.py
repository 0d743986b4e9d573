"""The app's tables. A :class:`JobLease` (one per job, or instance: ``job[key]``) holds the
fenced lease and the schedule state; every statement that changes it is in
:mod:`django_fencedjobs.lease`.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models, router, transaction
from django.dispatch import Signal
from django.utils.translation import gettext_lazy as _

_WEEKDAYS = (
    _("Monday"),
    _("Tuesday"),
    _("Wednesday"),
    _("Thursday"),
    _("Friday"),
    _("Saturday"),
    _("Sunday"),
)

#: ``lease_until`` of a job nobody holds: any "now" is later.
LEASE_FREE = datetime(1970, 1, 1, tzinfo=UTC)

#: An instance's key: so that ``job[key]`` reads unambiguously in a log, a shell, a URL.
INSTANCE_KEY = RegexValidator(
    r"^[A-Za-z0-9_.:@/+-]+\Z",
    _("A key is letters, digits and _ . : @ / + - (no spaces or brackets)."),
    code="invalid_key",
)


class RunKind(models.TextChoices):
    """Why a run exists: its schedule (a retry included), a backfill, or a one-off."""

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


def validate_calendar_names(value: Any) -> None:
    """A list of calendar names (whether they exist is the instance's check)."""
    if not isinstance(value, list) or not all(isinstance(name, str) and name for name in value):
        raise ValidationError(_("A list of calendar names."), code="calendar_names")


#: Sent by :meth:`JobInstance.clean`: :func:`django_fencedjobs.instances.validate` receives it.
validate_instance = Signal()


class JobInstance(models.Model):
    """One instance of a job declared with ``@job(instances=True)``: its own schedule and
    handler arguments. Saving it writes its lease row in the same transaction."""

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
    #: Paused by an operator (``jobctl pause``). Apart from ``enabled``, so that resuming
    #: every instance leaves the disabled ones disabled; the lease row is paused while
    #: either says so (or the instance is invalid).
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
    #: The calendars whose dates and windows its slots avoid, by name, besides the job's.
    exclude = models.JSONField(
        _("calendars to avoid"),
        default=list,
        blank=True,
        validators=[validate_calendar_names],
        help_text=_('Names of calendars, e.g. ["de-holidays"], besides the job\'s own.'),
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
        # One transaction with the lease row post_save writes (django_fencedjobs.instances).
        using = kwargs.get("using") or router.db_for_write(JobInstance, instance=self)
        with transaction.atomic(using=using):
            super().save(*args, **kwargs)

    def clean(self) -> None:
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
    #: How many judged slots ago the latest failure was, and the one before (1: the latest
    #: slot failed; None: none). Written with ``consecutive_failures``, so that health finds
    #: the instances whose failure rate may warn on their rows alone.
    last_failure_age = models.PositiveIntegerField(_("last failure age"), null=True, blank=True)
    previous_failure_age = models.PositiveIntegerField(
        _("previous failure age"), null=True, blank=True
    )
    paused = models.BooleanField(_("paused"), default=False)
    schedule_fingerprint = models.CharField(_("schedule fingerprint"), max_length=64, blank=True)
    #: The instance this row is the lease of (None: a declared job). Deleting the instance
    #: deletes the row (a run of it then loses its fence).
    instance = models.OneToOneField(
        JobInstance,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="lease",
        verbose_name=_("instance"),
    )
    #: The job an instance's (or one-shot) row belongs to, so that the tick reads one job's
    #: due instances by one index; "" for a declared job.
    parent = models.CharField(_("instance of"), max_length=200, blank=True, default="")
    #: An instance's dead man's switch, stored so that health finds the late ones by an
    #: index: the deadline of the first slot after its last success (or its creation),
    #: written on save and at each success; None for a declared job.
    late_after = models.DateTimeField(_("late after"), null=True, blank=True)
    #: When set, the next acquisition runs this slot, as attempt ``attempt``: a retry (a later
    #: slot due by then supersedes it), a backfill's slot or a one-off's instant.
    run_slot = models.DateTimeField(_("run slot"), null=True, blank=True)
    attempt = models.PositiveIntegerField(_("attempt"), default=1, db_default=1)
    #: ``scheduled`` for a job's or an instance's row; ``backfill`` or ``once`` for a row
    #: that runs one slot of job ``parent`` (``run_slot``) and is then done (paused).
    kind = models.CharField(
        _("kind"),
        max_length=16,
        choices=RunKind.choices,
        default=RunKind.SCHEDULED,
        db_default=RunKind.SCHEDULED,  # for rows an older release writes mid-deploy
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
    #: The fence of the run whose fenced work last committed (written by the fence check,
    #: in the fenced transaction): a slot due again is not run when that would redo the work
    #: (``retries.redoes``).
    committed_fence = models.BigIntegerField(_("committed fence"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"))
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        verbose_name = _("job")
        verbose_name_plural = _("jobs")
        ordering = ["name"]
        # No index on next_run_at alone: declared jobs are read by name, and it would be
        # one more entry to write per run, for no read.
        indexes = [
            # The tick's claim of a job's due instances, earliest first, by this index alone
            # (paused rows are not in it).
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
    #: An operator skipped the slot (``owner`` names who), or it was not run on purpose:
    #: the error says why.
    SKIPPED = "skipped", _("skipped")
    #: The slot falls in a date or window a calendar of the job excludes: not run, on purpose.
    EXCLUDED = "excluded", _("excluded")
    ABANDONED = "abandoned", _("abandoned")
    #: ``overlap="replace"``: the next slot came while it was still going, and took over.
    REPLACED = "replaced", _("replaced")
    INTERRUPTED = "interrupted", _("interrupted")


#: A run's failure, for ``consecutive_failures`` and the failure rate: its handler raised or
#: overran its timeout (other ends say nothing against the job's code).
FAILURE_OUTCOMES = frozenset({Outcome.FAILED, Outcome.TIMED_OUT})
#: The runs the failure rate is read over: those that ran to an end, succeeding or failing.
RATED_OUTCOMES = frozenset({Outcome.SUCCEEDED, *FAILURE_OUTCOMES})
#: A record whose run may still be recorded as ended: running, or abandoned while its
#: process was paused (the run's own account, when it comes, is the better one).
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
    #: 1 for a slot's first run; a retry or backfill is the next. A slot is judged by its last.
    attempt = models.PositiveIntegerField(_("attempt"), default=1, db_default=1)
    kind = models.CharField(
        _("kind"),
        max_length=16,
        choices=RunKind.choices,
        default=RunKind.SCHEDULED,
        db_default=RunKind.SCHEDULED,  # for rows an older release writes mid-deploy
    )
    #: The start of the run's data interval, which ends at ``scheduled_for``: the slot before
    #: (before the first coalesced one).
    interval_start = models.DateTimeField(_("interval start"), null=True, blank=True)
    watermark_before = models.CharField(_("watermark before"), max_length=64, blank=True)
    watermark_after = models.CharField(_("watermark after"), max_length=64, blank=True)
    error = models.TextField(_("error"), blank=True)

    class Meta:
        verbose_name = _("run")
        verbose_name_plural = _("runs")
        ordering = ["-scheduled_for", "-id"]
        constraints = [
            # Each attempt at a slot is recorded once, whoever races to record it.
            models.UniqueConstraint(
                fields=["job", "scheduled_for", "attempt"], name="fencedjobs_run_once"
            ),
        ]
        indexes = [
            models.Index(fields=["-scheduled_for", "-id"], name="fencedjobs_run_recent"),
            models.Index(fields=["job", "-scheduled_for"], name="fencedjobs_run_job_recent"),
            models.Index(fields=["outcome", "-scheduled_for"], name="fencedjobs_run_outcome"),
            # Health's read of the few capped runs, not every run of a day.
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
        """Seconds from start to finish (the one definition). None while it runs, for a
        missed run, and for an abandoned one: its ``finished_at`` is when a later run
        noticed, not when its process died."""
        if self.started_at is None or self.finished_at is None or self.outcome == Outcome.ABANDONED:
            return None
        return (self.finished_at - self.started_at).total_seconds()


class BackfillSelection(models.TextChoices):
    MISSING = "missing", _("missing: slots with no run")
    FAILED = "failed", _("failed: slots whose last attempt did not succeed")
    ALL = "all", _("all slots")


class Backfill(models.Model):
    """An operator's request to run the selected slots of a job in ``[start, end)``, each a
    lease row of kind ``backfill`` (:mod:`django_fencedjobs.backfills`)."""

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
    #: Recorded in the run's transaction, not handed to its backend yet (the relay's outbox).
    PENDING = "pending", _("not dispatched")
    READY = "ready", _("enqueued")
    RUNNING = "running", _("running")
    SUCCESSFUL = "successful", _("successful")
    FAILED = "failed", _("failed")


#: A task not started yet: recorded, or handed to its backend and waiting for a worker.
NOT_STARTED_TASK = frozenset({TaskStatus.PENDING, TaskStatus.READY})
#: A task that has not finished: its run's slot waits for it (health: late past deadline).
UNFINISHED_TASK = frozenset({*NOT_STARTED_TASK, TaskStatus.RUNNING})
#: A task that has finished: its status is its outcome, and no report changes it any more.
FINISHED_TASK = frozenset({TaskStatus.SUCCESSFUL, TaskStatus.FAILED})


class RunTask(models.Model):
    run = models.ForeignKey(
        JobRun, on_delete=models.CASCADE, related_name="tasks", verbose_name=_("run")
    )
    #: The run's job and fence, copied: read without joining the run.
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
    #: A task handed over after its run's commit: its ``{"args", "kwargs"}``, its hand-overs
    #: and the next one's time (:mod:`django_fencedjobs.integrations.relay`).
    call = models.JSONField(_("call"), null=True, blank=True)
    handovers = models.PositiveIntegerField(_("hand-overs"), default=0, db_default=0)
    handover_after = models.DateTimeField(_("next hand-over"), null=True, blank=True)
    #: The execution whose fenced writes committed first; any other delivery writes nothing,
    #: and is counted in ``duplicates``.
    executor = models.CharField(_("executor"), max_length=64, blank=True, default="", db_default="")
    duplicates = models.PositiveIntegerField(_("duplicate deliveries"), default=0, db_default=0)

    class Meta:
        verbose_name = _("task")
        verbose_name_plural = _("tasks")
        ordering = ["run", "id"]
        indexes = [
            # A worker finds the task it starts by the backend's id.
            models.Index(fields=["backend", "result_id"], name="fencedjobs_task_result"),
            # Health reads each job's oldest unfinished task, and its latest finished one.
            models.Index(fields=["status", "job"], name="fencedjobs_task_status"),
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
    """One hand-over of a :class:`RunTask`, by the backend's id: a worker finds the task's
    record by it, whichever delivery it got."""

    #: Not a foreign key, so that retention deletes task records in one statement each.
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
    """A ``runjobs`` loop, or one host's ``--once`` passes for one set of jobs: who runs
    which jobs, last seen when (:mod:`django_fencedjobs.runners`)."""

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
    """A job's last notified state (:mod:`django_fencedjobs.notify`), changed by a
    compare-and-set: only the process that changed it tells anyone."""

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


class Calendar(models.Model):
    """A named set of dates and windows that the jobs naming it do not run in
    (``@job(exclude=[name])``, an instance's ``exclude``): its :class:`CalendarExclusion`
    rows, and the public holidays of a country when it names one (docs/schedules.md)."""

    name = models.SlugField(_("name"), max_length=100, unique=True)
    timezone = models.CharField(
        _("timezone"),
        max_length=64,
        default="UTC",
        help_text=_("The zone its dates and windows are read in, e.g. Europe/Berlin."),
    )
    holidays_country = models.CharField(
        _("holidays of country"),
        max_length=8,
        blank=True,
        help_text=_("An ISO 3166 code, e.g. DE: its public holidays are excluded too."),
    )
    holidays_subdivision = models.CharField(
        _("and of its region"),
        max_length=16,
        blank=True,
        help_text=_("A subdivision code, e.g. BY for Bavaria. Empty: the country's only."),
    )
    note = models.CharField(_("note"), max_length=200, blank=True)

    class Meta:
        verbose_name = _("calendar")
        verbose_name_plural = _("calendars")
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if problem := self.problem():
            raise ValidationError(problem, code="calendar")

    def problem(self) -> str | None:
        """What is wrong with it (its zone, its country, the ``holidays`` package), or None:
        for :meth:`clean` and the system check."""
        from django_fencedjobs.exceptions import ScheduleError
        from django_fencedjobs.schedule import resolve_zone

        try:
            resolve_zone(self.timezone)
        except ScheduleError as exc:
            return str(exc)
        if not self.holidays_country:
            return "A region needs its country." if self.holidays_subdivision else None
        try:
            import holidays
        except ImportError:
            return (
                "The holidays of a country need the holidays package: "
                "pip install 'django-fencedjobs[holidays]'."
            )
        try:
            holidays.country_holidays(
                self.holidays_country, subdiv=self.holidays_subdivision or None
            )
        except NotImplementedError as exc:
            return f"The holidays package does not know this country or region: {exc}"
        return None


class CalendarExclusion(models.Model):
    """One excluded stretch of a :class:`Calendar`, read in its zone: every field given
    must match. A date, or a date every year (``month`` and ``day``), or a weekday; with a
    window of the day (``starts`` to ``ends``, past midnight when ``ends`` is not later),
    or the whole day; a window alone is every day."""

    calendar = models.ForeignKey(
        Calendar, on_delete=models.CASCADE, related_name="exclusions", verbose_name=_("calendar")
    )
    label = models.CharField(_("label"), max_length=100, blank=True)
    on_date = models.DateField(_("date"), null=True, blank=True)
    month = models.PositiveSmallIntegerField(_("every year: month"), null=True, blank=True)
    day = models.PositiveSmallIntegerField(_("day"), null=True, blank=True)
    weekday = models.PositiveSmallIntegerField(
        _("weekday"),
        null=True,
        blank=True,
        choices=[(i, day) for i, day in enumerate(_WEEKDAYS)],
    )
    starts = models.TimeField(_("from"), null=True, blank=True)
    ends = models.TimeField(_("until"), null=True, blank=True)

    class Meta:
        verbose_name = _("excluded date or window")
        verbose_name_plural = _("excluded dates and windows")
        ordering = ["calendar", "on_date", "month", "day", "weekday", "starts"]

    def __str__(self) -> str:
        return self.label or f"{self.calendar} #{self.pk}"

    def clean(self) -> None:
        if (self.month is None) != (self.day is None):
            problem = "A date every year needs both its month and its day."
        elif self.month is not None and not _is_date(self.month, self.day):
            problem = f"{self.month}/{self.day} is no date."
        elif (self.starts is None) != (self.ends is None):
            problem = "A window needs both its start and its end."
        elif self.starts is not None and self.starts == self.ends:
            problem = "A window ends when it starts: give it a length, or leave both empty."
        elif all(v is None for v in (self.on_date, self.month, self.weekday, self.starts)):
            problem = "Give a date, a date every year, a weekday or a window: it excludes nothing."
        else:
            return
        raise ValidationError(problem, code="calendar_exclusion")


def _is_date(month: int, day: int | None) -> bool:
    try:
        date(2024, month, day or 0)  # a leap year: 29 February is a date
    except ValueError:
        return False
    return True
