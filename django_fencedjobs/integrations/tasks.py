"""Scheduled ``django.tasks``, fenced end to end (docs/tasks.md): :func:`schedule_task`
declares a job whose run enqueues one task; :meth:`Run.enqueue
<django_fencedjobs.run.Run.enqueue>` (:func:`enqueue`) enqueues from any handler.

Each task a run enqueues is recorded in the run's fenced transaction (:class:`_Batch`): on a
backend that writes to the lease database (django-tasks-db) with the task itself, exactly
once; on any other as an outbox row handed over after the commit, else by the relay, at
least once, each delivery's fenced writes made at most once (:class:`TaskFence`,
:class:`DuplicateDelivery`). Imported only when a project uses the Tasks framework.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, cast

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections, router, transaction
from django.db.models import DateTimeField, F, Value
from django.db.models.functions import Coalesce
from django.dispatch import receiver
from django.utils.module_loading import import_string

from django_fencedjobs import clock, db, instances, lease, signals
from django_fencedjobs.checkids import CheckId
from django_fencedjobs.conf import get_settings
from django_fencedjobs.exceptions import DuplicateDelivery, FenceLost, JobDefinitionError, NotInRun
from django_fencedjobs.fencing import (
    at_exit,
    fenced_atomic,
    in_fenced_block,
    reset_current_holder,
    set_current_holder,
)
from django_fencedjobs.integrations import relay
from django_fencedjobs.models import (
    FINISHED_TASK,
    NOT_STARTED_TASK,
    UNFINISHED_TASK,
    JobRun,
    RunTask,
    TaskDelivery,
    TaskStatus,
)
from django_fencedjobs.registry import DEFAULT_LEASE_TTL, Job, JobOptions, build, job, registry
from django_fencedjobs.savepoints import Ledger
from django_fencedjobs.text import bounded

if find_spec("django.tasks") is not None:  # Django 6.0+: the framework is built in
    from django.tasks import Task, TaskResult, TaskResultStatus, task_backends
    from django.tasks.signals import task_finished, task_started
else:  # Django 5.2: the django-tasks backport
    from django_tasks import task_backends  # type: ignore[no-redef,assignment,unused-ignore]
    from django_tasks.base import (  # type: ignore[no-redef,assignment,unused-ignore]
        Task,
        TaskResult,
        TaskResultStatus,
    )
    from django_tasks.signals import (  # type: ignore[no-redef,assignment,unused-ignore]
        task_finished,
        task_started,
    )

#: The task classes a run may enqueue, and the signals workers report on. On Django 6 a
#: backend written for the backport (django-tasks-rq) builds the backport's tasks and sends
#: its signals, when the backport is installed beside it: both are accepted, and both heard.
TASK_CLASSES: tuple[type, ...] = (Task,)
_STARTED: list[Any] = [task_started]
_FINISHED: list[Any] = [task_finished]
if find_spec("django.tasks") is not None and find_spec("django_tasks") is not None:
    from django_tasks import signals as _backport_signals
    from django_tasks.base import Task as _BackportTask

    TASK_CLASSES += (_BackportTask,)
    _STARTED.append(_backport_signals.task_started)
    _FINISHED.append(_backport_signals.task_finished)

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

__all__ = ["TaskFence", "enqueue", "schedule_settings", "schedule_task"]

logger = logging.getLogger("django_fencedjobs")


class Run(Protocol):
    """What enqueuing asks of a run (:class:`django_fencedjobs.run.Run` is one). A protocol,
    so this module does not import the handler's API that calls into it."""

    job: Job
    lease_name: str
    fence: int
    record: JobRun

    def enqueue(
        self, task: Task[Any, Any], /, *args: Any, **kwargs: Any
    ) -> TaskResult[Any, Any] | None: ...


#: How long a task's first fenced block waits for its run's record of it when the backend does
#: not write to the lease database: a fast worker may start it before its id is recorded.
RECORD_WAIT = 2.0

#: The backend's statuses as a record's: the same names, but for ``pending`` (not handed over).
_STATUS = {TaskResultStatus[s.name]: s for s in TaskStatus if s != TaskStatus.PENDING}


# -- declaring ------------------------------------------------------------------------------


def schedule_task(
    task: Task[Any, Any],
    cron: str | None = None,
    *,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> Job:
    """Enqueue ``task`` at every slot of a schedule: a job whose run enqueues it once::

        schedule_task(send_digest, "0 7 * * *", timezone="Europe/Paris", args=["daily"])

    ``cron``, ``every``, ``timezone``, ``jitter`` and every other option of
    :func:`~django_fencedjobs.job` apply (``timeout`` and ``grace`` also bound how long the
    task may take to finish before the job reads late). ``name`` defaults to the task's
    module path. Returns the :class:`~django_fencedjobs.Job`.
    """
    if not isinstance(task, TASK_CLASSES):
        raise TypeError(
            f"schedule_task(): expected a django.tasks Task (a function decorated with "
            f"@task), got {task!r}"
        )
    call_args, call_kwargs = list(args), dict(kwargs or {})

    def enqueue_task(run: Run) -> None:
        run.enqueue(task, *call_args, **call_kwargs)

    enqueue_task.__name__ = enqueue_task.__qualname__ = task.name
    enqueue_task.__module__ = task.func.__module__
    declared: Job = job(cron, name=name or task.module_path, **options)(enqueue_task).job  # type: ignore[attr-defined]
    return declared


#: What an entry of ``FENCEDJOBS["TASK_SCHEDULE"]`` may hold: :func:`schedule_task`'s
#: arguments, but for the task (its key) and ``instances`` (one entry is one job).
ENTRY_OPTIONS = frozenset(
    {"cron", "args", "kwargs", "name"}
    | {option.name for option in dataclasses.fields(JobOptions)} - {"instances", "instance_series"}
)


def schedule_settings() -> list[Job]:
    """Declare a job for each entry of ``FENCEDJOBS["TASK_SCHEDULE"]`` (docs/tasks.md), by
    :func:`schedule_task`, as a ``jobs.py`` would: a cron string, or a dict of its arguments.
    Nothing is raised for a bad entry: its job is registered invalid, as a bad ``@job`` is
    (E017 for a path that names no task, E013 for an unknown option). Called by the app's
    ``ready()`` once the ``jobs`` modules are imported."""
    try:
        entries = get_settings().TASK_SCHEDULE
    except ImproperlyConfigured:
        return []  # the system checks report it (E010, E014)
    return [_schedule_entry(path, entry) for path, entry in entries.items()]


def _schedule_entry(path: str, entry: str | Mapping[str, Any]) -> Job:
    options = {"cron": entry} if isinstance(entry, str) else dict(entry)
    name = options.pop("name", path)
    shown = name if isinstance(name, str) and name else path
    where = f"job {shown!r}: FENCEDJOBS['TASK_SCHEDULE'][{path!r}]"
    invalid = functools.partial(_invalid, path, shown)
    if unknown := sorted(str(key) for key in set(options) - ENTRY_OPTIONS):
        known = ", ".join(sorted(ENTRY_OPTIONS))
        return invalid(
            CheckId.ARGUMENT, f"{where} has unknown option(s) {', '.join(unknown)}; known: {known}"
        )
    args, kwargs = options.pop("args", ()), options.pop("kwargs", None)
    if not isinstance(args, list | tuple) or not isinstance(kwargs, dict | None):
        wrong = f"args must be a list and kwargs a dict, got {args!r} and {kwargs!r}"
        return invalid(CheckId.ARGUMENT, f"{where}: {wrong}")
    try:
        task = import_string(path)
    except ImportError as exc:
        return invalid(CheckId.TASK_PATH, f"{where} names no task: {exc}")
    if not isinstance(task, TASK_CLASSES):
        return invalid(
            CheckId.TASK_PATH,
            f"{where} names {type(task).__name__} {task!r}, not a django.tasks task (a "
            "function decorated with @task)",
        )
    declared = cast("Task[Any, Any]", task)
    cron = options.pop("cron", None)
    return schedule_task(declared, cron, args=args, kwargs=kwargs, name=name, **options)


def _invalid(path: str, name: str, check_id: CheckId, message: str) -> Job:
    """Register the job of a ``TASK_SCHEDULE`` entry that cannot be declared: invalid,
    reported with ``check_id`` by the system checks, ``runjobs``, ``checkjobs`` and the
    admin, never run."""
    error = JobDefinitionError(message)

    def enqueue_task(run: Run) -> None:
        raise error

    module, _, enqueue_task.__name__ = path.rpartition(".")
    enqueue_task.__qualname__, enqueue_task.__module__ = enqueue_task.__name__, module
    declared = build(enqueue_task, name, {}, problem=(check_id, error))
    registry.register(declared)
    return declared


# -- enqueueing from a run --------------------------------------------------------------------


def enqueue(
    run: Run, task: Task[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> TaskResult[Any, Any] | None:
    """Enqueue ``task`` for ``run``, once (:meth:`Run.enqueue`'s work): the backend's result
    when it was enqueued in the run's transaction (a backend that writes to the lease
    database), None when it is handed over after the commit (the result does not exist yet).
    """
    if not isinstance(task, TASK_CLASSES):
        raise TypeError(
            f"job {run.job.name!r}: run.enqueue() expects a django.tasks Task (a function "
            f"decorated with @task), got {task!r}"
        )
    alias = db.lease_db()
    if not in_fenced_block(alias):
        with fenced_atomic():
            return enqueue(run, task, args, kwargs)
    batch = at_exit(alias, "django_fencedjobs.tasks", lambda: _Batch(run, alias))
    if batch.in_transaction(task):
        # A write of this transaction, like any other: it commits with the run's work or
        # rolls back with it (a lost fence, an error, the savepoint it was made in).
        result = task.enqueue(*args, **kwargs)
        batch.tasks.note(result)
        return result
    task.get_backend().validate_task(task)  # refused now rather than after the commit
    batch.tasks.note((task, args, kwargs))
    return None


HandOver = tuple[Task[Any, Any], tuple[Any, ...], dict[str, Any]]


class _Batch:
    """The tasks a run enqueued in one fenced block: their records are inserted together when
    the block ends, in its transaction (one statement); those of a backend that does not write
    to the lease database are handed over after the commit. An enqueue belongs to the
    innermost transaction or savepoint open when it was made: one that rolls back takes its
    enqueues with it (no record, no hand-over: :class:`~django_fencedjobs.savepoints.Ledger`)."""

    def __init__(self, run: Run, alias: str) -> None:
        self.run, self.alias = run, alias
        #: Each task: its result (enqueued in this transaction) or what to hand over.
        self.tasks: Ledger[TaskResult[Any, Any] | HandOver] = Ledger(alias)
        self._writes_here: dict[str, bool] = {}

    def in_transaction(self, task: Task[Any, Any]) -> bool:
        if task.backend not in self._writes_here:
            self._writes_here[task.backend] = writes_to(task, self.alias)
        return self._writes_here[task.backend]

    def __call__(self) -> None:
        kept = self.tasks.kept()
        enqueued = [entry for entry in kept if not isinstance(entry, tuple)]
        hand_over = [entry for entry in kept if isinstance(entry, tuple)]
        run, rows = self.run, RunTask.objects.using(self.alias)
        if enqueued:
            db.insert_columns(RunTask, self.alias, _enqueued_columns(run, enqueued))
        if hand_over:
            # The outbox: each task's call is recorded with it, for this process to hand
            # over right after the commit, or the relay if that fails or never happens.
            relay_after = clock.now() + get_settings().TASK_HANDOVER_GRACE
            pending = rows.bulk_create(
                [
                    RunTask(
                        run_id=run.record.pk,
                        job=run.lease_name,
                        fence=run.fence,
                        task_path=task.module_path,
                        backend=task.backend,
                        queue_name=task.queue_name,
                        status=TaskStatus.PENDING,
                        call={"args": list(args), "kwargs": kwargs},
                        handover_after=relay_after,
                    )
                    for task, args, kwargs in hand_over
                ]
            )
            tasks = [
                (record, task) for record, (task, _, _) in zip(pending, hand_over, strict=True)
            ]
            transaction.on_commit(functools.partial(_hand_over, tasks), using=self.alias)


def _queue_in(backend: str, alias: str) -> bool:
    """Whether the task backend named ``backend`` writes its queue to database ``alias``.
    Never when django-tasks-db is not an installed app: its backend needs its app, and its
    models do not even import without it (installed beside RQ, say)."""
    if not apps.is_installed("django_tasks_db"):
        return False
    from django_tasks_db.backend import DatabaseBackend
    from django_tasks_db.models import DBTaskResult

    return (
        isinstance(task_backends[backend], DatabaseBackend)
        and router.db_for_write(DBTaskResult) == alias
    )


def _enqueued_columns(run: Run, results: list[TaskResult[Any, Any]]) -> dict[str, list[Any]]:
    """The records of tasks enqueued in a run's transaction, column by column: one
    ``INSERT`` for them all (:func:`db.insert_columns <django_fencedjobs.db.insert_columns>`)."""
    now, count = clock.now(), len(results)
    return {
        "run_id": [run.record.pk] * count,
        "job": [run.lease_name] * count,
        "fence": [run.fence] * count,
        "task_path": [result.task.module_path for result in results],
        "backend": [result.backend for result in results],
        "queue_name": [result.task.queue_name for result in results],
        "result_id": [str(result.id) for result in results],
        "status": [_STATUS.get(result.status, TaskStatus.READY).value for result in results],
        "enqueued_at": [result.enqueued_at or now for result in results],
        "started_at": [result.started_at for result in results],
        "finished_at": [result.finished_at for result in results],
        "error": [_error_of(result) for result in results],
    }


def writes_to(task: Task[Any, Any], alias: str) -> bool:
    """Whether ``task``'s backend writes its queue to database ``alias`` (django-tasks-db's
    ``DatabaseBackend`` routed there): then enqueueing is a write of the run's transaction."""
    return _queue_in(task.backend, alias)


def _hand_over(tasks: list[tuple[RunTask, Task[Any, Any]]]) -> None:
    """Right after the commit of a run's fenced block: hand its tasks over
    (:func:`hand_over`). What the database refuses now is left to the relay: the records
    are committed, ``pending``."""
    try:
        hand_over(tasks)
    except DatabaseError:
        logger.warning("could not hand %d task(s) over; the relay will", len(tasks), exc_info=True)


def hand_over(tasks: Sequence[tuple[RunTask, Task[Any, Any]]]) -> int:
    """Hand ``tasks`` (each with its committed ``pending`` record) to their backends; how many
    they took: the run's own hand-over after its commit and the relay's. Each hand-over is
    claimed first, all in one statement (:func:`relay.claim`): one another process is handing
    over is left to it. django-tasks-rq's go in one pipeline per backend and queue
    (:mod:`~django_fencedjobs.integrations.rq`), any other backend's one by one."""
    from django_fencedjobs.integrations import rq

    taken = 0
    # The batches, one per backend and queue: one pipeline each, taken or refused alone.
    batches: dict[tuple[str, str], list[tuple[RunTask, Task[Any, Any]]]] = {}
    batched: dict[Task[Any, Any], bool] = {}
    claimed = {record.pk for record in relay.claim([record for record, _ in tasks])}
    for record, task in tasks:
        if record.pk not in claimed:
            continue  # another process has this hand-over
        if task not in batched:
            batched[task] = rq.takes(task)
        if batched[task]:
            batches.setdefault((task.backend, task.queue_name), []).append((record, task))
        else:
            taken += _hand_over_one(record, task)
    for batch in batches.values():
        records = [record for record, _ in batch]
        # One prefix per batch: ids unique across batches, processes and projects
        # sharing one Redis, each record's own within the batch.
        prefix = f"fj{uuid.uuid4().hex}-"
        relay.will_deliver(records, prefix)
        try:
            rq.hand_over(batch, prefix)
        except Exception as exc:
            relay.refused(records, exc)
        else:
            relay.delivered(records, prefix)
            taken += len(batch)
    return taken


def _hand_over_one(record: RunTask, task: Task[Any, Any]) -> int:
    """Hand one task over by its backend's ``enqueue`` (its hand-over claimed): 1 if the
    backend took it."""
    call = record.call or {}
    fence = TaskFence(record.job, record.fence)
    fence.pk = record.pk
    token = _handing_over.set(fence)
    try:
        result = task.enqueue(*call.get("args", ()), **call.get("kwargs", {}))
    except Exception as exc:
        relay.refused([record], exc)
        return 0
    finally:
        _handing_over.reset(token)
    TaskDelivery.objects.using(db.lease_db()).create(
        task_id=record.pk,
        backend=record.backend,
        result_id=str(result.id),
        delivered_at=clock.now(),
    )
    record_delivery(record, task, result)
    return 1


def record_delivery(record: RunTask, task: Task[Any, Any], result: TaskResult[Any, Any]) -> None:
    """Record that the backend took ``record``'s task as ``result`` (its id, its status),
    and what a worker did with it before this, read back from the backend."""
    rows = RunTask.objects.using(db.lease_db())
    # The id first: from now on a worker's reports find the record...
    record.result_id = str(result.id)
    rows.filter(pk=record.pk).update(
        result_id=record.result_id, enqueued_at=result.enqueued_at or clock.now(), error=""
    )
    if result.status not in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED) and getattr(
        task.get_backend(), "supports_get_result", False
    ):
        try:
            # ... and what a worker did before that is read back from the backend.
            result = task.get_result(result.id)
        except Exception:  # the backend's own account is a bonus, not a requirement
            logger.debug("could not read task %s back", result.id, exc_info=True)
    status = _STATUS.get(result.status, TaskStatus.READY)
    # Forward only: a worker's report that landed meanwhile is never overwritten.
    moved = rows.filter(pk=record.pk, status__in=_BEHIND[status]).update(
        status=status,
        started_at=result.started_at,
        finished_at=result.finished_at,
        error=_error_of(result),
    )
    if moved and status in FINISHED_TASK:
        _after_task(result)


def relay_pending(now: datetime | None = None) -> int:
    """The relay's look: hand over the tasks due for it (:func:`relay.pending`), each to the
    backend and queue it was enqueued on; how many were taken. A task whose path no longer
    imports, or whose backend is gone, is recorded failed."""
    tasks: list[tuple[RunTask, Task[Any, Any]]] = []
    found: dict[tuple[str, str, str], Task[Any, Any]] = {}
    for record in relay.pending(now or clock.now()):
        where = (record.task_path, record.backend, record.queue_name)
        try:
            if where not in found:
                # Where it was enqueued, not where the task is declared to go by default.
                found[where] = import_string(record.task_path).using(
                    backend=record.backend, queue_name=record.queue_name or None
                )
        except Exception as exc:  # gone from the code, or its backend from TASKS: for good
            record.handovers = relay.MAX_HANDOVERS
            relay.refused([record], exc)
            continue
        tasks.append((record, found[where]))
    return hand_over(tasks)


#: A task's statuses in the order they come; a record moves only forward (but for a
#: success reported over a failure, by a later execution: :func:`_task_finished`).
_BEHIND = {
    TaskStatus.PENDING: frozenset(),
    TaskStatus.READY: frozenset({TaskStatus.PENDING}),
    TaskStatus.RUNNING: NOT_STARTED_TASK,
    TaskStatus.SUCCESSFUL: UNFINISHED_TASK,
    TaskStatus.FAILED: UNFINISHED_TASK,
}


def _error_of(result: TaskResult[Any, Any]) -> str:
    if result.status != TaskResultStatus.FAILED or not result.errors:
        return ""
    return bounded(str(result.errors[-1].traceback), get_settings().ERROR_MAX_CHARS)


# -- the fence, inside the task -----------------------------------------------------------------


class TaskFence:
    """What ``fenced_atomic`` checks inside a task a run enqueued: the run's job and fence,
    looked up by the task's id on the first fenced block (:func:`lease.lock_task_fence`)."""

    def __init__(
        self,
        job: str | None = None,
        fence: int | None = None,
        *,
        backend: str = "",
        result_id: str = "",
    ) -> None:
        self.job, self.fence = job, fence
        self.backend, self.result_id = backend, result_id
        #: The task's record, once found; this execution (one per delivery); whether its
        #: claim on the record committed; whether another execution had it (a duplicate).
        self.pk: int | None = None
        self.executor = uuid.uuid4().hex
        self.claimed = False
        self.duplicate = False

    def __repr__(self) -> str:
        return f"<TaskFence {self.job} fence={self.fence} task={self.result_id}>"

    def _resolve(self) -> tuple[str, int]:
        if self.job is not None and self.fence is not None:
            return self.job, self.fence
        # A task of a backend that writes to the lease database was recorded in the same
        # transaction as itself: if its record is not there, there is none to wait for.
        in_lease_db = _queue_in(self.backend, db.lease_db())
        deadline = time.monotonic() + (0 if in_lease_db else RECORD_WAIT)
        while True:
            found = _find(self.backend, self.result_id)
            if found is not None:
                self.pk, self.job, self.fence = found
                return self.job, self.fence
            if time.monotonic() >= deadline:
                raise NotInRun(
                    f"fenced_atomic() in task {self.result_id!r}: no job's run enqueued this "
                    "task (enqueue it with run.enqueue() to fence its writes)"
                )
            time.sleep(0.05)

    def stopped_error(self) -> None:
        """A task is never stopped from beside it: only its fence check can fail."""

    def save_progress(self, connection: BaseDatabaseWrapper) -> None:
        """A task has no progress of its run's to record: its run's row is the run's."""

    def check_fence(self, connection: BaseDatabaseWrapper) -> None:
        name, fence = self._resolve()
        declared = instances.declaring(name)
        ttl = declared.lease_ttl if declared is not None else DEFAULT_LEASE_TTL
        if not lease.lock_task_fence(connection, name, fence, ttl=ttl):
            if (
                self.pk is not None
                and not self.claimed
                and self._claimed_by_another(connection, self.pk)
            ):
                # A redelivery of a task that wrote already: a duplicate, whatever the
                # fence says now (a later run took the lease since).
                self._duplicate()
            raise FenceLost(
                f"job {name!r}: a later run has been granted the lease since the run (fence "
                f"{fence}) that enqueued task {self.result_id or '(this task)'}; nothing in "
                "this fenced block was committed"
            )
        if self.pk is not None and not self.claimed:
            self._claim(connection, self.pk)

    def _claim(self, connection: BaseDatabaseWrapper, pk: int) -> None:
        """Claim the task's record for this execution, in the block's transaction: the
        first execution whose fenced block commits owns the task's writes; any other
        delivery of it raises :class:`DuplicateDelivery` here, before writing."""
        claimed = (
            RunTask.objects.using(connection.alias)
            .filter(pk=pk, executor__in=("", self.executor))
            .update(executor=self.executor)
        )
        if not claimed:
            self._duplicate()
        transaction.on_commit(lambda: setattr(self, "claimed", True), using=connection.alias)

    def _claimed_by_another(self, connection: BaseDatabaseWrapper, pk: int) -> bool:
        """Whether another execution of the task has committed its fenced writes."""
        rows = RunTask.objects.using(connection.alias).filter(pk=pk)
        return rows.exclude(executor__in=("", self.executor)).exists()

    def _duplicate(self) -> NoReturn:
        self.duplicate = True
        raise DuplicateDelivery(
            f"task {self.result_id}: another delivery of this task has committed its "
            "fenced writes already; this delivery writes nothing (recorded as a duplicate)"
        )


#: The fence of the run handing a task over in this thread (:func:`_hand_over_one`): a backend
#: that runs it inside ``enqueue()`` (``ImmediateBackend``) starts it before its id is recorded.
_handing_over: contextvars.ContextVar[TaskFence | None] = contextvars.ContextVar(
    "fencedjobs_handing_over", default=None
)

_open = threading.local()


def _find(backend: str, result_id: str) -> tuple[int, str, int] | None:
    """The record (pk, job, fence) of the task the backend knows as ``result_id``: by its
    latest delivery's id, else by any delivery's."""
    rows = RunTask.objects.using(db.lease_db()).values_list("pk", "job", "fence")
    delivered = TaskDelivery.objects.using(db.lease_db()).filter(
        backend=backend, result_id=result_id
    )
    return (
        rows.filter(backend=backend, result_id=result_id).first()
        or rows.filter(pk__in=delivered.values("task_id")).first()
    )


@receiver(_STARTED, dispatch_uid="django_fencedjobs.task_started")
def _task_started(sender: type, task_result: TaskResult[Any, Any], **kwargs: Any) -> None:
    """A worker starts a task: give it its run's fence, and record that it started."""
    fence = _handing_over.get() or TaskFence(
        backend=task_result.backend, result_id=str(task_result.id)
    )
    stack = getattr(_open, "tokens", None)
    if stack is None:
        stack = _open.tokens = []
    stack.append((set_current_holder(fence), fence))
    _report(
        task_result,
        status=TaskStatus.RUNNING,
        started_at=task_result.started_at or clock.now(),
        only=NOT_STARTED_TASK,
    )


@receiver(_FINISHED, dispatch_uid="django_fencedjobs.task_finished")
def _task_finished(sender: type, task_result: TaskResult[Any, Any], **kwargs: Any) -> None:
    stack = getattr(_open, "tokens", None)
    fence: TaskFence | None = None
    if stack:
        token, fence = stack.pop()
        reset_current_holder(token)
    if fence is not None and fence.duplicate and fence.pk is not None:
        # Its record is the delivery's that wrote: this one only counts as a duplicate.
        _count_duplicate(fence.pk, task_result)
        return
    status = _STATUS.get(task_result.status, TaskStatus.FAILED)
    finished_at = task_result.finished_at or clock.now()
    # Forward only, but for one move: a success after a recorded failure is a later
    # execution's (an operator's requeue, the backend's own retry), and what the task did.
    only = (
        UNFINISHED_TASK | {TaskStatus.FAILED}
        if status == TaskStatus.SUCCESSFUL
        else UNFINISHED_TASK
    )
    if _report(
        task_result,
        status=status,
        # Its start may have been reported before the hand-over recorded the task's id (a
        # worker that is quicker than the runner): that report found no record to update.
        started_at=Coalesce(
            F("started_at"),
            Value(task_result.started_at or finished_at, output_field=DateTimeField()),
        ),
        finished_at=finished_at,
        error=_error_of(task_result),
        only=only,
    ):
        _after_task(task_result)


def _count_duplicate(pk: int, task_result: TaskResult[Any, Any]) -> None:
    try:
        RunTask.objects.using(db.lease_db()).filter(pk=pk).update(duplicates=F("duplicates") + 1)
    except DatabaseError:
        logger.warning("could not count task %s as a duplicate", task_result.id, exc_info=True)
    logger.warning(
        "task %s was delivered again after another delivery wrote; it wrote nothing",
        task_result.id,
        extra={"event": "task_duplicate", "task": str(task_result.id)},
    )


def _after_task(task_result: TaskResult[Any, Any]) -> None:
    """Send ``run_tasks_finished`` when the task just reported was its run's last."""
    alias = db.lease_db()
    try:
        # By any delivery's id: a batch's records get theirs after its workers may start.
        found = _find(task_result.backend, str(task_result.id))
        if found is None:
            raise RunTask.DoesNotExist(task_result.id)
        record = RunTask.objects.using(alias).select_related("run").get(pk=found[0]).run
        tasks = RunTask.objects.using(alias).filter(run=record)
        if tasks.filter(status__in=UNFINISHED_TASK).exists():
            return
        failed = tasks.filter(status=TaskStatus.FAILED).exists()
    except (DatabaseError, RunTask.DoesNotExist):
        logger.warning("could not read the tasks of task %s's run", task_result.id, exc_info=True)
        return
    job = registry.get(record.job) if record.job in registry else instances.resolve(record.job)
    signals.send(signals.run_tasks_finished, job=job, record=record, failed=failed)


def _report(task_result: TaskResult[Any, Any], *, only: Iterable[str], **fields: Any) -> bool:
    """Record a worker's report on the task's record, if a run enqueued it; True when one
    was updated. A report that cannot be written is logged, never raised into the worker."""
    alias = db.lease_db()
    try:
        rows = RunTask.objects.using(alias).filter(status__in=only)
        updated: int = rows.filter(
            backend=task_result.backend, result_id=str(task_result.id)
        ).update(**fields)
        if not updated:
            # A worker may report before its hand-over recorded the id on the task's
            # record: its delivery has it already.
            delivered = TaskDelivery.objects.using(alias).filter(
                backend=task_result.backend, result_id=str(task_result.id)
            )
            updated = rows.filter(pk__in=delivered.values("task_id")).update(**fields)
        return updated > 0
    except DatabaseError:
        logger.warning(
            "could not record that task %s is %s", task_result.id, fields["status"], exc_info=True
        )
        connections[alias].close_if_unusable_or_obsolete()
        return False
