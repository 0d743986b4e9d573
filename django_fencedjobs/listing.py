"""Jobs described in words, for ``runjobs --list`` and the admin."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC

from django_fencedjobs import clock
from django_fencedjobs.registry import Job


def describe_jobs(jobs: Sequence[Job], *, count: int = 3) -> str:
    """Each job, its schedule and zone, and its next ``count`` fire times in its own zone
    and in UTC."""
    if not jobs:
        return "No jobs are registered. Declare them with @job in an installed app's jobs.py."
    now = clock.system_now()
    lines: list[str] = []
    for job in jobs:
        lines.append(job.name)
        if job.schedule is None:
            lines.append(f"  INVALID: {job.schedule_error}")
            continue
        schedule = job.schedule
        lines.append(f"  schedule: {schedule.describe()}")
        lines.append(
            f"  timeout {job.run_timeout}, lease {job.lease_ttl}, max_batches {job.max_batches}, "
            f"grace {job.grace}, exclusion {job.exclusion}"
        )
        when = now
        for _ in range(count):
            when = schedule.next_after(when)
            local = when.astimezone(schedule.tz)
            lines.append(
                f"  next: {local:%Y-%m-%d %H:%M:%S %Z} ({schedule.timezone})"
                f"  =  {when.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
            )
    return "\n".join(lines)
