from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_migrate
from django.utils.module_loading import autodiscover_modules


class FencedJobsConfig(AppConfig):
    name = "django_fencedjobs"
    label = "fencedjobs"
    verbose_name = "Scheduled jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Register on import: the system checks (fencedjobs.E001...), run retention
        # (tick_finished) and Sentry Crons check-ins (run_started/run_finished; inert
        # unless sentry-sdk is initialised).
        from django_fencedjobs import checks, retention  # noqa: F401
        from django_fencedjobs.integrations import sentry  # noqa: F401

        # Tasks a run enqueued report to the run from the workers (django.tasks signals).
        if uses_tasks():
            from django_fencedjobs.integrations import tasks  # noqa: F401

        # Every installed app's ``jobs`` module declares its jobs with @job.
        autodiscover_modules("jobs")

        # `migrate` with a job's code is the job's first sighting: its lease row, created
        # then, is the baseline from which a job that never ran becomes late.
        from django_fencedjobs import baseline

        post_migrate.connect(
            baseline.record_on_migrate, sender=self, dispatch_uid="django_fencedjobs.baseline"
        )


def uses_tasks() -> bool:
    """Whether the project uses Django's Tasks framework: ``TASKS`` set in its settings, or
    the backport or the database backend installed. Otherwise nothing of the integration
    (:mod:`django_fencedjobs.integrations.tasks`) is imported."""
    from django.apps import apps
    from django.conf import settings

    return (
        settings.is_overridden("TASKS")  # type: ignore[misc]  # public, missing from the stubs
        or apps.is_installed("django_tasks")
        or apps.is_installed("django_tasks_db")
    )
