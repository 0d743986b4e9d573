"""The task ``double_fire.py`` schedules with django-periodic-tasks (module level: the
library imports it by path). Imported only once Django is configured. Never run: only its
enqueues are counted."""

from django_periodic_tasks.compat import task


@task()
def probe() -> None:
    """Nothing: the measurement counts enqueues, not executions."""
