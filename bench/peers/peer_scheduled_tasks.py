"""The task ``double_fire.py`` schedules with django-scheduled-tasks (module level, as the
library requires). Imported only once Django is configured. Never run: only its enqueues
are counted."""

from django.tasks import task


@task()
def probe() -> None:
    """Nothing: the measurement counts enqueues, not executions."""
