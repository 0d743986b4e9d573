"""Moving from django-celery-beat: `manage.py importbeat` maps real `PeriodicTask` rows (with
their crontab, interval, solar and clocked schedules, migrated into the test database) to
instances, a dry run unless --commit, one line per row and why it cannot be imported.

The rows and the command live in processes of their own, on tests.beat_settings (the suite's
settings do not install django-celery-beat: see there); each starts with `migrate
django_celery_beat`, writes its rows and runs the command as manage.py does. The crontab
translation is checked in this process against celery's own fire times.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

pytest.importorskip("django_celery_beat", reason="django-celery-beat is not installed")

from django.core.exceptions import ValidationError

from django_fencedjobs import beat
from django_fencedjobs.instances import Instances
from django_fencedjobs.models import JobInstance, JobLease
from django_fencedjobs.schedule import Schedule
from tests.conftest import REPO_ROOT

FAR = (datetime.now(UTC) + timedelta(days=400)).replace(microsecond=0).isoformat()
PAST = "2020-01-01T00:00:00+00:00"
DIGEST = "app.tasks.send_digest"


def _declare_jobs() -> None:
    """The project's jobs, the same in this process and in the command's."""
    from django_fencedjobs import job

    @job(instances=True, timeout=timedelta(minutes=5), name="send_digest")
    def send_digest(run: Any, *, tenant_id: int, greeting: str = "hello") -> None: ...

    @job(instances=True, timeout=timedelta(minutes=5), name="app.tasks.cleanup")
    def cleanup(run: Any) -> None: ...

    @job("0 3 * * *", name="app.tasks.nightly")
    def nightly(run: Any) -> None: ...


# -- the process that writes the rows and runs the command ------------------------------------


def child() -> None:
    """Run in a process of its own (``python -c``, tests.beat_settings): migrate
    django-celery-beat, replace its rows with ``$BEAT_ROWS`` (when set), declare the jobs,
    then ``importbeat`` with this process's arguments, exiting as manage.py does."""
    from django.core.management import ManagementUtility, call_command

    zero = ["zero"] if os.environ.get("BEAT_UNMIGRATE") else []
    call_command("migrate", "django_celery_beat", *zero, verbosity=0)
    if "BEAT_ROWS" in os.environ:
        _write_rows(json.loads(os.environ["BEAT_ROWS"]))
    _declare_jobs()
    ManagementUtility(["manage.py", "importbeat", *sys.argv[1:]]).execute()


def _write_rows(rows: list[dict[str, Any]]) -> None:
    from django_celery_beat import models as m

    for model in (m.PeriodicTask, m.CrontabSchedule, m.IntervalSchedule):
        model.objects.all().delete()
    m.SolarSchedule.objects.all().delete()
    m.ClockedSchedule.objects.all().delete()
    for spec in rows:
        spec = dict(spec)
        if "crontab" in spec:
            spec["crontab"] = m.CrontabSchedule.objects.create(**spec["crontab"])
        if "interval" in spec:
            spec["interval"] = m.IntervalSchedule.objects.create(**spec["interval"])
        if "solar" in spec:
            spec["solar"] = m.SolarSchedule.objects.create(**spec["solar"])
        if "clocked" in spec:
            at = datetime.fromisoformat(spec["clocked"])
            spec["clocked"] = m.ClockedSchedule.objects.create(clocked_time=at)
        for field in ("args", "kwargs"):
            if field in spec:
                spec[field] = json.dumps(spec[field])
        for field in ("start_time", "expires"):
            if field in spec:
                spec[field] = datetime.fromisoformat(spec[field])
        m.PeriodicTask.objects.create(**spec)


def importbeat(
    env: dict[str, str],
    *args: str,
    rows: list[dict[str, Any]] | None = None,
    settings: str = "tests.beat_settings",
    unmigrate: bool = False,
) -> subprocess.CompletedProcess[str]:
    env = {**env, "DJANGO_SETTINGS_MODULE": settings}
    if rows is not None:
        env["BEAT_ROWS"] = json.dumps(rows)
    if unmigrate:
        env["BEAT_UNMIGRATE"] = "1"
    code = "import django; django.setup(); from tests.test_importbeat import child; child()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return result.stdout.splitlines()


def crontab(minute: str, hour: str, dom: str, month: str, dow: str, tz: str = "UTC") -> dict:
    return {
        "minute": minute,
        "hour": hour,
        "day_of_month": dom,
        "month_of_year": month,
        "day_of_week": dow,
        "timezone": tz,
    }


#: A tenant's digest at 08:00 on weekdays in Paris, an hourly cleanup, a paused one.
ROWS = [
    {
        "name": "tenant-42",
        "task": DIGEST,
        "crontab": crontab("0", "8", "*", "*", "mon-fri", "Europe/Paris"),
        "kwargs": {"tenant_id": 42},
    },
    {"name": "hourly", "task": "app.tasks.cleanup", "interval": {"every": 1, "period": "hours"}},
    {
        "name": "tenant 7 (paused)",
        "task": DIGEST,
        "interval": {"every": 30, "period": "minutes"},
        "kwargs": {"tenant_id": 7, "greeting": "bonjour"},
        "enabled": False,
    },
]
CREATED = [
    'create send_digest[tenant-42]: cron "0 8 * * 1-5" Europe/Paris kwargs {"tenant_id": 42}',
    "create app.tasks.cleanup[hourly]: every 1h kwargs {}",
    'create send_digest[tenant-7-paused]: every 30m kwargs {"greeting": "bonjour", '
    '"tenant_id": 7} disabled from "tenant 7 (paused)"',
]
MAP = f"--map={DIGEST}=send_digest"


# -- the command, on real rows ---------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_dry_run_prints_what_it_would_create_and_writes_nothing(child_env):
    result = importbeat(child_env, MAP, rows=ROWS)
    assert result.returncode == 0, result.stderr
    assert lines(result) == [
        *CREATED,
        "3 periodic tasks: 3 to create, 0 to change, 0 unchanged, 0 not importable; "
        "a dry run, nothing was written: --commit writes",
    ]
    assert result.stderr == ""
    assert not JobInstance.objects.exists()
    assert not JobLease.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_commit_writes_the_instances_with_their_leases_and_a_second_run_changes_nothing(
    child_env,
):
    result = importbeat(child_env, MAP, "--commit", rows=ROWS)
    assert result.returncode == 0, result.stderr
    assert lines(result) == [
        *CREATED,
        "3 periodic tasks: 3 created, 0 changed, 0 unchanged, 0 not imported",
    ]
    paris = JobInstance.objects.get(job="send_digest", key="tenant-42")
    assert (paris.cron, paris.every, paris.timezone, paris.enabled, paris.kwargs) == (
        "0 8 * * 1-5",
        None,
        "Europe/Paris",
        True,
        {"tenant_id": 42},
    )
    hourly = JobInstance.objects.get(job="app.tasks.cleanup", key="hourly")
    assert (hourly.cron, hourly.every) == ("", timedelta(hours=1))
    paused = JobInstance.objects.get(job="send_digest", key="tenant-7-paused")
    assert not paused.enabled
    leases = {row.name: row for row in JobLease.objects.all()}
    assert set(leases) == {
        "send_digest[tenant-42]",
        "app.tasks.cleanup[hourly]",
        "send_digest[tenant-7-paused]",
    }
    assert leases["send_digest[tenant-7-paused]"].paused
    next_run = leases["send_digest[tenant-42]"].next_run_at
    assert next_run.astimezone(paris_zone()).strftime("%H:%M %a") in {
        f"08:00 {day}" for day in ("Mon", "Tue", "Wed", "Thu", "Fri")
    }

    again = importbeat(child_env, MAP, "--commit")
    assert again.returncode == 0, again.stderr
    assert lines(again) == [
        "unchanged send_digest[tenant-42]",
        "unchanged app.tasks.cleanup[hourly]",
        'unchanged send_digest[tenant-7-paused] from "tenant 7 (paused)"',
        "3 periodic tasks: 0 created, 0 changed, 3 unchanged, 0 not imported",
    ]

    edited = [{**ROWS[0], "crontab": crontab("30", "9", "*", "*", "1-5", "Europe/Paris")}]
    changed = importbeat(child_env, MAP, "--commit", rows=edited)
    assert lines(changed)[0] == (
        'change send_digest[tenant-42]: cron "30 9 * * 1-5" Europe/Paris kwargs {"tenant_id": 42}'
        ' (was: cron "0 8 * * 1-5" Europe/Paris kwargs {"tenant_id": 42})'
    )
    assert JobInstance.objects.get(job="send_digest", key="tenant-42").cron == "30 9 * * 1-5"


def paris_zone():
    from zoneinfo import ZoneInfo

    return ZoneInfo("Europe/Paris")


UNMAPPABLE = [
    {
        "name": "at sunset",
        "task": DIGEST,
        "solar": {"event": "sunset", "latitude": "48.85", "longitude": "2.35"},
        "kwargs": {"tenant_id": 1},
    },
    {
        "name": "launch",
        "task": DIGEST,
        "clocked": "2030-05-01T09:00:00+00:00",
        "one_off": True,
        "kwargs": {"tenant_id": 1},
    },
    {
        "name": "once",
        "task": DIGEST,
        "interval": {"every": 1, "period": "hours"},
        "one_off": True,
        "kwargs": {"tenant_id": 1},
    },
    {
        "name": "until",
        "task": DIGEST,
        "interval": {"every": 1, "period": "hours"},
        "expires": FAR,
        "kwargs": {"tenant_id": 1},
    },
    {
        "name": "later",
        "task": DIGEST,
        "interval": {"every": 1, "period": "hours"},
        "start_time": FAR,
        "kwargs": {"tenant_id": 1},
    },
    {
        "name": "started long ago",
        "task": DIGEST,
        "interval": {"every": 1, "period": "hours"},
        "start_time": PAST,
        "kwargs": {"tenant_id": 1},
    },
    {
        "name": "positional",
        "task": DIGEST,
        "interval": {"every": 1, "period": "hours"},
        "args": [42, "fr"],
    },
    {"name": "stranger", "task": "app.tasks.unknown", "interval": {"every": 1, "period": "hours"}},
    {"name": "in code", "task": "app.tasks.nightly", "interval": {"every": 1, "period": "hours"}},
    {
        "name": "first monday",
        "task": DIGEST,
        "crontab": crontab("0", "8", "1-7", "*", "1"),
        "kwargs": {"tenant_id": 1},
    },
    {
        "name": "sunday as 7",
        "task": DIGEST,
        "crontab": crontab("0", "8", "*", "*", "7"),
        "kwargs": {"tenant_id": 1},
    },
]


@pytest.mark.django_db(transaction=True)
def test_each_row_that_cannot_be_mapped_is_one_line_and_the_others_are_written(child_env):
    result = importbeat(child_env, MAP, "--commit", rows=UNMAPPABLE)
    assert result.returncode == 1
    out = lines(result)
    expected = [
        'skip "at sunset": a solar schedule (sunset at 48.85, 2.35) moves every day',
        'skip "launch": a clocked schedule runs once, at 2030-05-01 09:00:00 UTC',
        'skip "once": one_off: celery-beat runs it once, then disables it',
        f'skip "until": expires at {FAR[:10]} ',
        f'skip "later": starts at {FAR[:10]} ',
        'create send_digest[started-long-ago]: every 1h kwargs {"tenant_id": 1} '
        'from "started long ago"',
        'skip "positional": positional args [42, "fr"] have no keyword names: give the '
        "handler keyword arguments and map them",
        'skip "stranger": task app.tasks.unknown has no job: declare one with '
        "@job(instances=True, name='app.tasks.unknown'), or map it to one with "
        "--map app.tasks.unknown=JOB",
        "skip \"in code\": job 'app.tasks.nightly' has a schedule in code, not instances=True",
        "skip \"first monday\": day_of_month '1-7' and day_of_week '1' are both restricted: "
        "celery fires on the days that match both, cron on the days that match either",
        "skip \"sunday as 7\": crontab day_of_week '7': celery cannot read it (Invalid end "
        "range: 7 > 6.) (celery numbers weekdays 0-6, Sunday 0), so celery-beat never ran "
        "this row",
    ]
    assert len(out) == len(expected) + 1
    for line, start in zip(out, expected, strict=False):
        assert line.startswith(start), (line, start)
    assert out[-1] == "11 periodic tasks: 1 created, 0 changed, 0 unchanged, 10 not imported"
    assert result.stderr.strip() == (
        "CommandError: 10 of 11 periodic task(s) cannot be imported: the skip lines say why"
    )
    assert [i.name for i in JobInstance.objects.all()] == ["send_digest[started-long-ago]"]


@pytest.mark.django_db(transaction=True)
def test_an_instance_the_system_checks_refuse_is_skipped_with_the_checks_message(child_env, jobs):
    rows = [
        {  # every minute, for a job whose timeout is 5 minutes: E004
            "name": "too often",
            "task": DIGEST,
            "interval": {"every": 1, "period": "minutes"},
            "kwargs": {"tenant_id": 1},
        },
        {  # an argument the handler does not take: E012
            "name": "wrong argument",
            "task": DIGEST,
            "crontab": crontab("0", "8", "*", "*", "*", "Europe/Paris"),
            "kwargs": {"tenant": 1},
        },
    ]
    result = importbeat(child_env, MAP, "--commit", rows=rows)
    assert result.returncode == 1

    # What the same instances get from the helper, in this process: the system checks'.
    _declare_jobs()
    refused = []
    for key, fields in (
        ("too-often", {"every": timedelta(minutes=1), "kwargs": {"tenant_id": 1}}),
        (
            "wrong-argument",
            {"cron": "0 8 * * *", "timezone": "Europe/Paris", "kwargs": {"tenant": 1}},
        ),
    ):
        with pytest.raises(ValidationError) as raised:
            Instances("send_digest").upsert(key, **fields)
        refused.append(raised.value.messages)
    assert "(fencedjobs.E004)" in refused[0][0]
    assert "(fencedjobs.E012)" in refused[1][0]
    assert lines(result)[:2] == [
        f'skip "too often": refused by the system checks: {"; ".join(refused[0])}',
        f'skip "wrong argument": refused by the system checks: {"; ".join(refused[1])}',
    ]
    assert not JobInstance.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_names_become_keys_and_two_names_with_one_key_are_told_apart_by_the_rows_id(child_env):
    every = {"interval": {"every": 1, "period": "hours"}}
    rows = [
        {"name": "Café: nightly report", "task": "app.tasks.cleanup", **every},
        {"name": "a b", "task": "app.tasks.cleanup", **every},
        {"name": "a  b", "task": "app.tasks.cleanup", **every},
        {"name": "a-b", "task": "app.tasks.cleanup", **every},
        # Another job: its keys are its own ("a-b" again).
        {"name": "a b!", "task": DIGEST, "kwargs": {"tenant_id": 3}, **every},
    ]
    result = importbeat(child_env, MAP, "--commit", rows=rows)
    assert result.returncode == 0, result.stderr
    keys = sorted(JobInstance.objects.values_list("job", "key"))
    made = [line.split("[", 1)[1].split("]")[0] for line in lines(result)[:-1]]
    # "a-b" is a key already: it keeps it; "a b" and "a  b" take their rows' ids.
    assert made[0] == "Cafe:-nightly-report"
    assert made[3] == "a-b"
    assert made[1].startswith("a-b-") and made[2].startswith("a-b-") and made[1] != made[2]
    assert made[4] == "a-b"
    assert keys == sorted(
        [("app.tasks.cleanup", key) for key in made[:4]] + [("send_digest", "a-b")]
    )
    # And the same keys on the next run.
    again = importbeat(child_env, MAP)
    assert [line.split()[0] for line in lines(again)[:-1]] == ["unchanged"] * 5


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--map", "app.tasks.send_digest"], "--map 'app.tasks.send_digest': write TASK=JOB"),
        (["--map", "a=no.such.job"], "--map a=no.such.job: no job named 'no.such.job'"),
        (["--map", "a=app.tasks.nightly"], "is not declared with instances=True"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_command_line_use_exits_2_with_one_line(child_env, args, message):
    result = importbeat(child_env, *args, rows=ROWS)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


@pytest.mark.django_db(transaction=True)
def test_without_django_celery_beat_installed_one_line_and_exit_3(child_env):
    result = subprocess.run(
        [sys.executable, "-m", "django", "importbeat"],
        cwd=REPO_ROOT,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 3
    assert result.stderr.strip() == (
        "CommandError: django-celery-beat is not installed: add 'django_celery_beat' to "
        "INSTALLED_APPS (pip install django-celery-beat), with the database its rows are in"
    )


@pytest.mark.django_db(transaction=True)
def test_not_migrated_one_line_and_exit_3(child_env):
    result = importbeat(child_env, unmigrate=True)
    assert result.returncode == 3
    assert result.stderr.startswith("CommandError: django-celery-beat's tables are missing")
    assert result.stderr.strip().endswith("run `manage.py migrate django_celery_beat`")
    assert len(result.stderr.strip().splitlines()) == 1


# -- the crontab, against celery's own fire times ---------------------------------------------

CRONTABS = [
    ("0", "8", "*", "*", "mon-fri"),
    ("*/15", "*", "*", "*", "fri-mon"),
    ("0,30", "8-17/2", "*", "*", "SUNDAY"),
    ("5", "20-4", "*", "*", "*"),
    ("0", "0", "*/10", "*", "*"),
    ("0", "6", "*", "jan-mar,dec", "*"),
    ("0", "6", "*/2", "*", "tue"),
    ("0", "12", "1-31", "*", "1"),
    ("0", "12", "15", "2-11/3", "0-6"),
]


@pytest.mark.parametrize("fields", CRONTABS, ids=" ".join)
def test_a_crontab_fires_when_celery_fires_it(fields):
    from celery.schedules import crontab as celery_crontab

    cron = beat.cron_of(*fields)
    ours = Schedule(cron, timezone="UTC")
    minute, hour, dom, month, dow = fields
    theirs = celery_crontab(
        minute=minute, hour=hour, day_of_month=dom, month_of_year=month, day_of_week=dow
    )
    at = datetime(2026, 1, 1, tzinfo=UTC)
    mine, celerys = [], []
    for _ in range(40):
        at = ours.next_after(at)
        mine.append(at)
    at = datetime(2026, 1, 1, tzinfo=UTC)
    for _ in range(40):  # celery's next run after the last, strictly after, as ours
        theirs.nowfun = lambda last=at: last
        at = at + theirs.remaining_estimate(at)
        celerys.append(at)
    assert mine == celerys, cron


def test_celery_weekdays_are_crons_and_seven_is_refused():
    assert beat.cron_of("0", "8", "*", "*", "sun") == "0 8 * * 0"
    assert beat.cron_of("0", "8", "*", "*", "sat-sun") == "0 8 * * 0,6"
    assert beat.cron_of("0", "8", "*", "*", "0-6") == "0 8 * * *"
    with pytest.raises(beat.Unmappable, match="celery numbers weekdays 0-6"):
        beat.cron_of("0", "8", "*", "*", "7")


def test_a_key_is_the_name_in_the_keys_characters():
    assert beat.slug("Tenant 42 digest") == "Tenant-42-digest"
    assert beat.slug("Café crème (Paris)") == "Cafe-creme-Paris"
    assert beat.slug("日本") == "task"
    assert beat.slug("x" * 300) == "x" * 100
    keys = beat.assign_keys([(1, "a b", "j"), (2, "a  b", "j"), (3, "a-b", "j"), (4, "a b", "k")])
    assert keys == {3: "a-b", 1: "a-b-1", 2: "a-b-2", 4: "a-b"}
    # The longest instance name still fits its lease row's name.
    long_job = "j" * 150
    (key,) = beat.assign_keys([(1, "y" * 150, long_job)]).values()
    assert len(f"{long_job}[{key}]") == 200
