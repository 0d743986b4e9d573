"""django-fencedjobs: scheduled jobs for Django that cannot fail quietly.

The public API::

    from django_fencedjobs import job, fenced_atomic, FenceLost, Schedule, Run
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "DuplicateDelivery",
    "FenceLost",
    "FencedJobsError",
    "Job",
    "JobDefinitionError",
    "JobTimeout",
    "NotInRun",
    "Run",
    "RunAborted",
    "Schedule",
    "ScheduleError",
    "UnknownJob",
    "WatermarkError",
    "Window",
    "fenced_atomic",
    "job",
]

from django_fencedjobs.exceptions import (
    DuplicateDelivery,
    FencedJobsError,
    FenceLost,
    JobDefinitionError,
    JobTimeout,
    NotInRun,
    RunAborted,
    ScheduleError,
    UnknownJob,
    WatermarkError,
)
from django_fencedjobs.schedule import Schedule

if TYPE_CHECKING:
    from django_fencedjobs.fencing import fenced_atomic
    from django_fencedjobs.registry import Job, job
    from django_fencedjobs.run import Run, Window

# These touch Django's ORM, which cannot be imported before settings are configured;
# importing them lazily keeps `from django_fencedjobs import Schedule` usable anywhere.
_LAZY = {
    "fenced_atomic": "django_fencedjobs.fencing",
    "job": "django_fencedjobs.registry",
    "Job": "django_fencedjobs.registry",
    "Run": "django_fencedjobs.run",
    "Window": "django_fencedjobs.run",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'django_fencedjobs' has no attribute {name!r}")
