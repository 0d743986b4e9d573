"""DST: how many times each scheduler fires a daily job at a wall time the clock skips or
repeats, in America/New_York on the 2026 spring-forward and fall-back days, each driven
through its own next-fire-time code on a simulated clock: ``30 2 * * *`` (02:30 does not
exist on 8 March) and ``30 1 * * *`` (01:30 happens twice on 1 November). Run by
``bench/peers/run.py`` inside the peers' throwaway virtualenv (``python dst.py``); it needs
the peers installed and this repository on ``sys.path``.

Every scheduler gets the same clock: one tick per second from 00:00 local time the day
before the transition to 00:00 local time the day after it (three local days), and, at
each tick, the decision its own polling loop makes with that instant as "now":

=========================  ===============================================================
scheduler                  the code that decides, called as its loop calls it
=========================  ===============================================================
django-fencedjobs          ``Schedule.next_after``, as a claim plans a slot with it: due when
                           ``now >= next_run_at``; after the run, ``next_after(now)``
django-crontask            the APScheduler ``CronTrigger`` that ``crontask.cron()`` builds
                           (zone: Django's ``TIME_ZONE``); due when ``next <= now``; then
                           ``trigger.get_next_fire_time(next, now)``, as APScheduler's
                           ``Job._get_run_times`` walks it
django-scheduled-tasks     ``CrontabSchedule.get_next_scheduled_time`` of a schedule that
                           ``cron_task()`` registered, through
                           ``TaskScheduler._process_task`` (its own function, with the
                           run-log row replaced by an object in memory and the enqueue
                           counted)
django-periodic-tasks      ``cron.compute_next_run_at(expr, zone, base_time=now)``, as
                           ``Scheduler.tick``/``_process_task`` call it (with
                           ``base_time=None``, meaning the wall clock, replaced by the
                           simulated now)
django-celery-beat         the ``TzAwareCrontab`` of a ``CrontabSchedule`` row (its
                           ``.schedule``): ``is_due(last_run_at)`` with ``nowfun`` on the
                           simulated clock; after a fire ``last_run_at = now``, as
                           ``ModelEntry.__next__`` sets it
=========================  ===============================================================

A one-second tick is the finest any of them polls at (django-scheduled-tasks' default is
1 s, django-periodic-tasks' 15 s; APScheduler and celery beat sleep until the next fire
time they computed, and check again then), so a scheduler that would fire at some
instant fires here within a second of it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from importlib.metadata import version
from pathlib import Path
from zoneinfo import ZoneInfo

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

#: The wall time the spring gap skips, and the one the fall's repeated hour repeats.
CRONS = ["30 2 * * *", "30 1 * * *"]
ZONE = "America/New_York"
TZ = ZoneInfo(ZONE)
#: The 2026 transitions in New York: 02:00 EST becomes 03:00 EDT; 02:00 EDT becomes 01:00 EST.
DAYS = {"spring": date(2026, 3, 8), "fall": date(2026, 11, 1)}
TICK = timedelta(seconds=1)


def configure_django() -> None:
    import django
    from django.conf import settings

    settings.configure(
        # django-crontask reads the schedule's zone from Django's TIME_ZONE.
        TIME_ZONE=ZONE,
        USE_TZ=True,
        INSTALLED_APPS=[
            "django.contrib.contenttypes",
            "django_celery_beat",
            "django_periodic_tasks",
            "django_scheduled_tasks",
        ],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        TASKS={"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()


def ticks(day: date) -> Iterator[datetime]:
    """Every second from 00:00 local the day before ``day`` to 00:00 local the day after."""
    now = datetime.combine(day - timedelta(days=1), time(0), TZ).astimezone(UTC)
    end = datetime.combine(day + timedelta(days=2), time(0), TZ).astimezone(UTC)
    while now < end:
        yield now
        now += TICK


def probe() -> None:
    """The task each Tasks-based peer schedules (never run: only its enqueues are counted)."""


# -- one simulated loop per scheduler; each returns the instants it enqueued at ---------------


def fencedjobs(cron: str, day: date) -> list[datetime]:
    from django_fencedjobs.schedule import Schedule

    schedule = Schedule(cron, timezone=ZONE)
    fired: list[datetime] = []
    clock = ticks(day)
    next_run_at = schedule.next_after(next(clock))
    for now in clock:
        if now >= next_run_at:  # lease.LeaseRow.is_due
            fired.append(now)
            next_run_at = schedule.next_after(now)  # as a claim plans it (slots.plan)
    return fired


def crontask(cron: str, day: date) -> list[datetime]:
    import crontask as ct
    from django.tasks import task

    ct.cron(cron, sentry_monitor_config=None)(task(probe))
    job = ct.scheduler._pending_jobs[-1][0]  # the job cron() added, not started
    trigger = job.trigger
    fired: list[datetime] = []
    clock = ticks(day)
    nxt = trigger.get_next_fire_time(None, next(clock))
    for now in clock:
        while nxt is not None and nxt <= now:  # Job._get_run_times, then the scheduler
            fired.append(now)
            nxt = trigger.get_next_fire_time(nxt, now)
    return fired


def scheduled_tasks(cron: str, day: date) -> list[datetime]:
    from django.tasks import task
    from django_scheduled_tasks import base

    store = base.TaskScheduler()
    base.cron_task(cron_schedule=cron, timezone_str=ZONE, schedule_store=store)(task(probe))
    (schedule,) = store.schedules
    fired: list[datetime] = []

    @dataclass
    class RunLog:  # the ScheduledTaskRunLog row, in memory
        enabled: bool = True
        next_scheduled_run_time: datetime | None = None

    log = RunLog()

    class Store:
        @staticmethod
        def create_or_update_run_log(_schedule: object, **fields: object) -> None:
            log.next_scheduled_run_time = fields["next_scheduled_run_time"]  # type: ignore[assignment]

    now_box: list[datetime] = []
    store._enqueue_task = lambda _s: fired.append(now_box[0])  # type: ignore[method-assign]
    store._get_task_id = lambda _r: None  # type: ignore[method-assign]
    models = sys.modules["django_scheduled_tasks.models"]
    real = models.ScheduledTaskRunLog
    models.ScheduledTaskRunLog = Store  # type: ignore[attr-defined]
    try:
        for now in ticks(day):
            now_box[:] = [now]
            store._process_task(schedule, log if log.next_scheduled_run_time else None, now)
    finally:
        models.ScheduledTaskRunLog = real  # type: ignore[attr-defined]
    return fired


def periodic_tasks(cron: str, day: date) -> list[datetime]:
    from django_periodic_tasks.cron import compute_next_run_at

    fired: list[datetime] = []
    clock = ticks(day)
    next_run_at = compute_next_run_at(cron, ZONE, base_time=next(clock))  # sync
    for now in clock:
        if next_run_at <= now:  # tick(): next_run_at__lte=now
            fired.append(now)
            next_run_at = compute_next_run_at(cron, ZONE, base_time=now)  # _process_task
    return fired


def celery_beat(cron: str, day: date) -> list[datetime]:
    from django_celery_beat.models import CrontabSchedule

    minute, hour, day_of_month, month_of_year, day_of_week = cron.split()
    row = CrontabSchedule(
        minute=minute,
        hour=hour,
        day_of_week=day_of_week,
        day_of_month=day_of_month,
        month_of_year=month_of_year,
        timezone=TZ,
    )
    schedule = row.schedule
    clock = ticks(day)
    now = next(clock)
    schedule.nowfun = lambda: now.astimezone(TZ)
    last_run_at = now  # ModelEntry: a new entry's last_run_at is "now"
    fired: list[datetime] = []
    for now in clock:  # schedule.nowfun reads it
        due, _next_check = schedule.is_due(last_run_at)
        if due:
            fired.append(now)
            last_run_at = now  # ModelEntry.__next__
    return fired


SCHEDULERS: list[tuple[str, str, Callable[[str, date], list[datetime]]]] = [
    ("django-fencedjobs", "django-fencedjobs", fencedjobs),
    ("django-crontask", "django-crontask", crontask),
    ("django-scheduled-tasks", "django-scheduled-tasks", scheduled_tasks),
    ("django-periodic-tasks", "django-periodic-tasks", periodic_tasks),
    ("django-celery-beat", "django-celery-beat", celery_beat),
]


# -- report ----------------------------------------------------------------------------------


def wall(instant: datetime) -> str:
    local = instant.astimezone(TZ)
    return f"{local:%H:%M:%S} {local.tzname()}"


def describe(fired: list[datetime], day: date) -> str:
    """What fired on ``day`` (local date), in words: each fire's local time, or a range."""
    on_day = [f for f in fired if f.astimezone(TZ).date() == day]
    if not on_day:
        return "never"
    if len(on_day) <= 3:
        return ", ".join(wall(f) for f in on_day)
    return f"{len(on_day):,} fires, {wall(on_day[0])} to {wall(on_day[-1])}"


def project_version() -> str:
    sys_path_version = __import__("django_fencedjobs").__version__
    return f"{sys_path_version} (this checkout)"


def measure() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for label, dist, simulate in SCHEDULERS:
        release = project_version() if dist == "django-fencedjobs" else version(dist)
        for cron in CRONS:
            row: dict[str, object] = {"scheduler": label, "version": release, "cron": cron}
            for season, day in DAYS.items():
                fired = simulate(cron, day)
                row[season] = {
                    "fires_per_local_day": {
                        d.isoformat(): sum(1 for f in fired if f.astimezone(TZ).date() == d)
                        for d in (day - timedelta(days=1), day, day + timedelta(days=1))
                    },
                    "on_the_day": describe(fired, day),
                    "fired_at_utc": [f.isoformat() for f in fired],
                }
            rows.append(row)
    return rows


def main() -> None:
    configure_django()
    rows = measure()
    if "--json" in sys.argv:
        print(json.dumps(rows, indent=2))
        return
    import django

    print(
        f"{ZONE}, one tick per second, 00:00 the day before to 00:00 the day after each 2026 "
        f"transition (Python {sys.version.split()[0]}, Django {django.get_version()})"
    )
    spring, fall = (d.isoformat() for d in DAYS.values())
    for cron in CRONS:
        print(
            f"\n| `{cron}` | version | spring {spring}: fires | at (local) "
            f"| fall {fall}: fires | at (local) | days before and after |"
        )
        print("| --- | --- | ---: | --- | ---: | --- | --- |")
        for row in rows:
            if row["cron"] != cron:
                continue
            s, f = row["spring"], row["fall"]
            assert isinstance(s, dict) and isinstance(f, dict)
            around = [
                n
                for part in (s, f)
                for d, n in part["fires_per_local_day"].items()
                if d not in (spring, fall)
            ]
            print(
                f"| {row['scheduler']} | {row['version']} "
                f"| {s['fires_per_local_day'][spring]:,} | {s['on_the_day']} "
                f"| {f['fires_per_local_day'][fall]:,} | {f['on_the_day']} "
                f"| {', '.join(str(n) for n in around)} |"
            )


if __name__ == "__main__":
    main()
