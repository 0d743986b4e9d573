"""Instances: schedules as data (docs/instances.md).

A job declared with ``@job(instances=True)`` runs as its instances, rows
(:class:`~django_fencedjobs.models.JobInstance`) changed without a deploy. Each is a job of
its own named ``job[key]``, built by :func:`instance_job` and checked by the very code
``@job`` is. Saving one writes its lease row in the same transaction (:func:`write_lease`),
so a change takes effect at the next tick, and no runner re-reads the whole table.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError
from django.db.models import QuerySet
from django.db.models.signals import post_save
from django.dispatch import receiver

from django_fencedjobs import clock, db, lease
from django_fencedjobs.checkids import CheckId
from django_fencedjobs.exceptions import JobDefinitionError, UnknownJob
from django_fencedjobs.models import INSTANCE_KEY, JobInstance, JobLease, validate_instance
from django_fencedjobs.registry import Job, JobOptions, build, registry

__all__ = [
    "Instances",
    "attach",
    "declaring",
    "get_job",
    "instance_job",
    "parse_name",
    "problem",
    "resolve",
    "validate",
    "write_lease",
]

#: The field of a :class:`JobInstance` a check id is about: where the admin's form shows
#: the error (an invalid ``every`` is ``E001`` too: :func:`validate`).
_FIELD_OF: dict[str, str] = {
    CheckId.CRON: "cron",
    CheckId.ZONE: "timezone",
    CheckId.FIXED_OFFSET: "timezone",
    CheckId.TIMEOUT: "timeout",
    CheckId.JITTER: "jitter",
    CheckId.HANDLER_SIGNATURE: "kwargs",
}
_OPTIONS = [name for name in JobOptions.__dataclass_fields__]


def parse_name(name: str) -> tuple[str, str] | None:
    """``("job", "key")`` of an instance's name ``job[key]``; None for another name."""
    if not name.endswith("]") or "[" not in name:
        return None
    job, _, key = name[:-1].rpartition("[")
    return (job, key) if job and key else None


def declaring(name: str) -> Job | None:
    """The job declared as ``name``, or the job declared with ``instances=True`` whose
    instance ``name`` (``job[key]``) would be; None when there is neither. No query."""
    if name in registry:
        return registry.get(name)
    parsed = parse_name(name)
    if parsed is not None and parsed[0] in registry and registry.get(parsed[0]).instances:
        return registry.get(parsed[0])
    return None


def get_job(name: str) -> Job:
    """The job declared as ``name``, or the instance named so (``job[key]``, read from the
    database); :class:`UnknownJob` when there is neither."""
    found = resolve(name)  # None for a declared name
    return found if found is not None else registry.get(name)


def declared(job_name: str) -> Job:
    """The job named ``job_name``, declared with ``instances=True``, or :class:`UnknownJob`."""
    base = registry.get(job_name)
    if not base.instances:
        raise UnknownJob(
            f"job {job_name!r} is not declared with instances=True: it has no instances"
        )
    return base


def instance_job(base: Job, instance: JobInstance) -> Job:
    """The job ``instance`` of ``base`` runs as, named ``base[key]``: ``base``'s options with
    the instance's schedule and arguments; invalid (with the check's id and message) when
    they are."""
    return _instance_job(
        base,
        instance.key,
        instance.cron,
        instance.every,
        instance.timezone,
        instance.jitter,
        json.dumps(instance.kwargs, sort_keys=True, default=str),
        instance.timeout,
        instance.grace,
        tuple(instance.exclude) if isinstance(instance.exclude, list) else instance.exclude,
    )


@functools.lru_cache(maxsize=4096)
def _instance_job(
    base: Job,
    key: str,
    cron: str,
    every: timedelta | None,
    timezone: str,
    jitter: timedelta,
    kwargs_json: str,
    timeout: timedelta | None = None,
    grace: timedelta | None = None,
    exclude: Any = (),
) -> Job:
    # Cached by the whole definition: a runner builds the job of every instance it runs,
    # and parsing a cron expression and checking the handler is not free.
    name = f"{base.name}[{key}]"
    kwargs = json.loads(kwargs_json)
    if base.schedule_error is not None:
        problem = (base.check_id or CheckId.ARGUMENT, base.schedule_error)
        return build(base.func, name, {}, problem=problem, parent=base.name, key=key)
    fields = {option: getattr(base, option) for option in _OPTIONS}
    fields.update(cron=cron or None, every=every, timezone=timezone, jitter=jitter, instances=False)
    # The instance's own timeout and grace, over the job's.
    fields.update({k: v for k, v in (("timeout", timeout), ("grace", grace)) if v is not None})
    # Its calendars: the job's and its own.
    fields["exclude"] = (*base.exclude, *exclude) if isinstance(exclude, tuple) else exclude
    wrong: list[str | None] = []
    if not isinstance(kwargs, dict):
        wrong.append(f"arguments must be a JSON object, got {kwargs_json}")
        kwargs = {}
    try:
        INSTANCE_KEY(key)
    except ValidationError:
        wrong.append(f"key must be letters, digits and _ . : @ / + -, got {key!r}")
    if len(name) > 200:
        wrong.append(f"name must be 1 to 200 characters, got {len(name)}")
    built = build(base.func, name, fields, wrong=wrong, kwargs=kwargs, parent=base.name, key=key)
    if built.check_id is not CheckId.TIMEOUT:
        return built
    # Say where the fix is: the timeout is the job's, from code, or the instance's own.
    if timeout is None:
        where = (
            f"the timeout is the job's, declared in code (@job(timeout=...) of {base.name}): "
            "give this instance a shorter timeout of its own, or a longer interval"
        )
    else:
        where = "the timeout is this instance's own: shorten it, or give a longer interval"
    problem = (CheckId.TIMEOUT, JobDefinitionError(f"{built.schedule_error} Fix: {where}."))
    return build(base.func, name, fields, problem=problem, kwargs=kwargs, parent=base.name, key=key)


def problem(instance: JobInstance) -> tuple[CheckId | None, str] | None:
    """What is wrong with ``instance``, as the system checks say it: ``(check id, message)``,
    ``(None, message)`` when its job is not declared with instances; None when valid."""
    try:
        base = declared(instance.job)
    except UnknownJob as exc:
        return None, str(exc)
    job = instance_job(base, instance)
    if job.schedule_error is None:
        return None
    return job.check_id, str(job.schedule_error)


@receiver(validate_instance, sender=JobInstance)
def _validate(instance: JobInstance, **kwargs: Any) -> None:
    validate(instance)


def validate(instance: JobInstance) -> None:
    """Raise ``ValidationError`` for an invalid instance, on the field the problem is about,
    with the system check's message and its id as the error's code (``full_clean()``)."""
    zero = timedelta(0)
    if (instance.timeout is not None and instance.timeout <= zero) or (
        instance.grace is not None and instance.grace < zero
    ):
        return  # the field's own validator says so, on the field
    try:
        job = instance_job(declared(instance.job), instance)
    except UnknownJob as exc:
        raise ValidationError({"job": ValidationError(str(exc), code="unknown_job")}) from None
    if job.check_id is None:
        _validate_calendars(instance, job)
        return
    error = ValidationError(f"{job.schedule_error} ({job.check_id})", code=str(job.check_id))
    every = getattr(job.schedule_error, "argument", None) == "every"
    field = "every" if job.check_id == CheckId.CRON and every else _FIELD_OF.get(job.check_id)
    raise ValidationError({field: error} if field else error)


def _validate_calendars(instance: JobInstance, job: Job) -> None:
    """The calendars an instance names exist and leave it a slot in the year ahead."""
    if not job.exclude or job.schedule is None:
        return
    from django_fencedjobs import calendars

    found = calendars.schedule_problem(job, clock.now())
    if found is not None:
        check_id, message = found
        error = ValidationError(f"{message} ({check_id})", code=str(check_id))
        raise ValidationError({"exclude": error})


@receiver(post_save, sender=JobInstance)
def _saved(instance: JobInstance, raw: bool = False, **kwargs: Any) -> None:
    if not raw:  # loaddata: the fixture has the lease rows
        write_lease(instance)


def write_lease(instance: JobInstance) -> None:
    """Write the lease row of ``instance``, just saved, in the transaction that saved it
    (``JobInstance.save()`` sends ``post_save`` inside its own).

    Created for a new instance; its next fire time recomputed when the schedule changed
    (its fingerprint); paused while the instance is disabled, paused by an operator or
    invalid: one rule, here, so that enabling an instance never resumes one an operator
    paused, and resuming one never runs a disabled one. Waits for the row at most
    :data:`~django_fencedjobs.db.LOCK_WAIT` (a run's fenced transaction holds it): then
    ``DatabaseError``, and the save rolls back with it.
    """
    with db.bounded_wait():
        _write_lease(instance, clock.now())


def _write_lease(instance: JobInstance, now: datetime) -> None:
    alias = db.lease_db()
    try:
        job: Job | None = instance_job(declared(instance.job), instance)
    except UnknownJob:
        job = None
    schedule = job.schedule if job is not None else None
    changes: dict[str, Any] = {
        "paused": schedule is None or not instance.enabled or instance.paused,
        "name": instance.name,
        "parent": instance.job,
    }
    fingerprint = schedule.fingerprint() if schedule is not None else ""
    row = JobLease.objects.using(alias).select_for_update().filter(instance=instance).first()
    if row is None or (schedule is not None and fingerprint != row.schedule_fingerprint):
        # New, or a new schedule: its next fire time, and the deadline it awaits, from now
        # (no slot of an old schedule is awaited any more).
        next_run_at = schedule.next_after(now) if schedule is not None else now
        changes.update(
            schedule_fingerprint=fingerprint,
            next_run_at=next_run_at,
            late_after=job.late_after(next_run_at) if job and schedule else None,
        )
    if row is None:
        new = JobLease(instance=instance, created_at=now, **changes)
        lease.create([new], ignore_conflicts=False)
        return
    JobLease.objects.using(alias).filter(pk=row.pk).update(**changes)


def resolve(name: str) -> Job | None:
    """The job an instance's name ``job[key]`` runs as; None when ``name`` is not an
    instance's, or no such instance exists."""
    parsed = parse_name(name)
    if parsed is None or name in registry or (base := declaring(name)) is None:
        return None
    instance = JobInstance.objects.using(db.lease_db()).filter(job=parsed[0], key=parsed[1]).first()
    return instance_job(base, instance) if instance is not None else None


def attach(job: Job) -> None:
    """Give the function of a job declared with ``instances=True`` its :class:`Instances`
    (called for every job the registry registers)."""
    if job.instances:
        with contextlib.suppress(AttributeError, TypeError):
            job.func.instances = Instances(job.name)  # type: ignore[attr-defined]


class Instances:
    """The instances of one job declared with ``instances=True``, from code: the job's
    function has it as ``.instances`` (``send_digest.instances.upsert("tenant-42", ...)``)."""

    def __init__(self, job_name: str) -> None:
        self.job_name = job_name

    def __repr__(self) -> str:
        return f"<Instances of {self.job_name!r}>"

    def all(self) -> QuerySet[JobInstance]:
        return JobInstance.objects.using(db.lease_db()).filter(job=self.job_name)

    def get(self, key: str) -> JobInstance:
        return self.all().get(key=key)

    def upsert(
        self,
        key: str,
        *,
        cron: str | None = None,
        every: timedelta | None = None,
        timezone: str = "UTC",
        jitter: timedelta = timedelta(0),
        enabled: bool = True,
        kwargs: dict[str, Any] | None = None,
        timeout: timedelta | None = None,
        grace: timedelta | None = None,
        exclude: Sequence[str] = (),
    ) -> JobInstance:
        """Create the instance ``key``, or change it to exactly these values (``timeout``
        and ``grace`` None: the job's; ``exclude``: calendars besides the job's), in one
        transaction with its lease row; an operator's
        pause stays as it is. An invalid instance raises ``ValidationError`` with the system
        check's message, and nothing is written. Two processes creating the same new key at
        once both succeed: the second changes what the first made."""
        values = {
            "cron": cron or "",
            "every": every,
            "timezone": timezone,
            "jitter": jitter,
            "enabled": enabled,
            "kwargs": kwargs if kwargs is not None else {},
            "timeout": timeout,
            "grace": grace,
            "exclude": list(exclude),
        }
        try:
            return self._write(key, values)
        except IntegrityError:
            # Created by another process since it was looked for: change that one.
            return self._write(key, values)

    def _write(self, key: str, values: dict[str, Any]) -> JobInstance:
        instance = self.all().filter(key=key).first() or JobInstance(job=self.job_name, key=key)
        for field, value in values.items():
            setattr(instance, field, value)
        instance.full_clean(validate_unique=False, validate_constraints=False)
        instance.save()
        return instance

    def set_enabled(self, keys: Iterable[str], enabled: bool) -> int:
        """Enable or disable these instances; how many there were."""
        found = list(self.all().filter(key__in=list(keys)))
        for instance in found:
            instance.enabled = enabled
            instance.save(update_fields=["enabled", "updated_at"])
        return len(found)

    def delete(self, key: str) -> bool:
        """Delete the instance ``key`` and its lease row; its runs are kept. A run of it in
        progress loses its fence at its next fenced block. False when there was none."""
        with db.bounded_wait():
            deleted, _ = self.all().filter(key=key).delete()
        return bool(deleted)
