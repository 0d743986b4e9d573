"""The admin: the jobs with their health and recent slots, their runs, instances, backfills
and runners (one module each; :mod:`~django_fencedjobs.admin.display` has what they share).

Only instances and calendars are edited here (with the Django permissions on them). Lease
rows are written only through :mod:`django_fencedjobs.lease` (saving a stale copy through a
form could move a fence backwards), and runs are history, deleted only by retention. The
Django *change* permission on jobs allows run now, pause, resume and skip, each recorded in
the admin log; a user with only the *view* permission sees everything and can trigger
nothing.
"""

from __future__ import annotations

from django_fencedjobs.admin.backfills import BackfillAdmin
from django_fencedjobs.admin.calendars import CalendarAdmin
from django_fencedjobs.admin.instances import JobInstanceAdmin
from django_fencedjobs.admin.jobs import JobLeaseAdmin
from django_fencedjobs.admin.runners import RunnerAdmin
from django_fencedjobs.admin.runs import JobRunAdmin

__all__ = [
    "BackfillAdmin",
    "CalendarAdmin",
    "JobInstanceAdmin",
    "JobLeaseAdmin",
    "JobRunAdmin",
    "RunnerAdmin",
]
