"""Integrations with other libraries, each imported only where its library is in use:
Sentry Crons (:mod:`.sentry`, inert unless sentry-sdk is initialised), Prometheus metrics
(:mod:`.prometheus`), Django's Tasks framework (:mod:`.tasks`, see :func:`uses_tasks`)."""

from __future__ import annotations


def uses_tasks() -> bool:
    """Whether the project uses Django's Tasks framework: ``TASKS`` set in its settings, the
    backport or the database backend installed, or tasks scheduled in
    ``FENCEDJOBS["TASK_SCHEDULE"]``. Otherwise nothing of the integration
    (:mod:`django_fencedjobs.integrations.tasks`) is imported."""
    from django.apps import apps
    from django.conf import settings

    own = getattr(settings, "FENCEDJOBS", None)
    return bool(
        settings.is_overridden("TASKS")  # type: ignore[misc]  # public, missing from the stubs
        or apps.is_installed("django_tasks")
        or apps.is_installed("django_tasks_db")
        or (isinstance(own, dict) and own.get("TASK_SCHEDULE"))
    )


__all__ = ["uses_tasks"]
