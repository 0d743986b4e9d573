from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import AppConfig
from django.db.backends.signals import connection_created
from django.db.models.signals import post_migrate
from django.utils.module_loading import autodiscover_modules

if TYPE_CHECKING:
    from django_fencedjobs.chores import Chore


class FencedJobsConfig(AppConfig):
    name = "django_fencedjobs"
    label = "fencedjobs"
    verbose_name = "Scheduled jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Register on import: the system checks (fencedjobs.E001...), Sentry Crons check-ins
        # (run_started/run_finished; inert unless sentry-sdk is initialised) and the
        # instances' model signals (their lease rows written on save).
        from django_fencedjobs import checks, instances  # noqa: F401
        from django_fencedjobs.integrations import sentry, uses_tasks  # noqa: F401
        from django_fencedjobs.registry import registry

        # Each job declared with instances=True gets its `.instances` as it is declared.
        if instances.attach not in registry.on_register:
            registry.on_register.append(instances.attach)

        # Every installed app's ``jobs`` module declares its jobs with @job.
        autodiscover_modules("jobs")
        # ...and FENCEDJOBS["TASK_SCHEDULE"] a job per task it names, as schedule_task does;
        # the import connects the receivers of the workers' reports (django.tasks signals).
        if uses_tasks():
            from django_fencedjobs.integrations.tasks import schedule_settings

            schedule_settings()

        # `migrate` with a job's code is the job's first sighting: its lease row, created
        # then, is the baseline from which a job that never ran becomes late.
        from django_fencedjobs import baseline, db

        # SQLite: a failed statement's cursor is closed in its own thread, never freed
        # by another thread's garbage collection while that one holds the write lock.
        connection_created.connect(
            db.install_sqlite_wrapper, dispatch_uid="django_fencedjobs.sqlite_cursors"
        )

        post_migrate.connect(
            baseline.record_on_migrate, sender=self, dispatch_uid="django_fencedjobs.baseline"
        )

    def runner_chores(self, *, loop: bool) -> list[Chore]:
        """What a runner does beside its runs (:mod:`django_fencedjobs.chores`): retention,
        the task relay when the project uses ``django.tasks``, and in a loop the
        notifications (while ``NOTIFY`` is on). ``runjobs`` gives them to its dispatcher;
        the dispatcher adds its own (the orphan sweep)."""
        from django_fencedjobs import notify, retention
        from django_fencedjobs.chores import Chore
        from django_fencedjobs.conf import get_settings
        from django_fencedjobs.integrations import relay, uses_tasks

        purging = retention.Retention()
        chores = [Chore("retention", purging.every, purging.turn)]
        if uses_tasks():
            from django_fencedjobs.integrations.tasks import relay_pending

            chores.append(Chore("task relay", lambda: relay.RELAY_EVERY, relay_pending))
        if loop:
            chores.append(
                Chore(
                    "notifications",
                    lambda: (
                        notify.BEATS_PER_EVALUATION * get_settings().RUNNER_BEAT.total_seconds()
                    ),
                    notify.evaluate_all,
                    enabled=lambda: get_settings().NOTIFY,
                )
            )
        return chores
