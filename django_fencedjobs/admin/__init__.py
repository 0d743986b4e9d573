"""The admin: every job with its health and its recent slots, a job's slot timeline, the run
history, and the three things an operator may do (run now, pause, resume).

The jobs and runs are not editable (instances are, below): the lease rows are written only through
:mod:`django_fencedjobs.lease` (saving a stale copy of a row through a form could move its
fence backwards), and runs are history (deleted only by retention). The Django *change*
permission on jobs is what allows "run now", "pause" and "resume"; a user with only the
*view* permission sees everything and can trigger nothing. Each action is recorded in the
admin log. States and reasons come from :mod:`django_fencedjobs.health`.

- :mod:`~django_fencedjobs.admin.jobs`: the jobs pages and the operations;
- :mod:`~django_fencedjobs.admin.runs`: the run history, with the tasks each run enqueued;
- :mod:`~django_fencedjobs.admin.instances`: the instances of the jobs declared with
  ``instances=True``, the one thing users edit here (add, change, delete: the Django
  permissions on instances), with a preview of their next fire times;
- :mod:`~django_fencedjobs.admin.runners`: the runners, and when each was last seen;
- :mod:`~django_fencedjobs.admin.timeline`: the slot timeline, drawn by
  ``templates/admin/fencedjobs/joblease/timeline.html``;
- :mod:`~django_fencedjobs.admin.paginator`: a paginator that does not count a large table;
- :mod:`~django_fencedjobs.admin.display`: badges and instants, shared by both pages.
"""

from __future__ import annotations

from django_fencedjobs.admin.backfills import BackfillAdmin
from django_fencedjobs.admin.instances import JobInstanceAdmin
from django_fencedjobs.admin.jobs import JobLeaseAdmin
from django_fencedjobs.admin.runners import RunnerAdmin
from django_fencedjobs.admin.runs import JobRunAdmin

__all__ = ["BackfillAdmin", "JobInstanceAdmin", "JobLeaseAdmin", "JobRunAdmin", "RunnerAdmin"]
