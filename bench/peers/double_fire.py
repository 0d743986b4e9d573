"""Two scheduler processes: how many slots the database-based peers enqueue twice when two
of their schedulers run side by side on one database. Run by ``bench/peers/run.py`` inside
the peers' throwaway virtualenv:

    python double_fire.py PEER --seconds 30            # on a new SQLite file
    DATABASE_URL=postgres://... python double_fire.py PEER --seconds 30

``PEER`` is ``scheduled-tasks`` (django-scheduled-tasks) or ``periodic-tasks``
(django-periodic-tasks). Each process runs the library's own scheduler loop, in the
library's own code, on a job due every second, polling every 20 ms:

* django-scheduled-tasks: a ``periodic_task(interval=1 s)``, and
  ``TaskScheduler.run_scheduling_loop(interval=20 ms)``, what ``run_task_scheduler`` runs;
* django-periodic-tasks: a schedule on ``* * * * * *`` (croniter's sixth field, seconds)
  in its registry, and its scheduler class (``PeriodicTaskScheduler``) with
  ``interval=0.02``, run in the main thread as ``run_scheduler`` runs it (whose
  ``--interval`` takes whole seconds only: the class takes any positive number).

Both processes start at the same instant and stop after ``--seconds``. Each enqueue is
counted by its slot, the time the library says it was due (django-scheduled-tasks'
``last_scheduled_run_time``, django-periodic-tasks' ``next_run_at`` of the row it fires),
observed by a wrapper that logs the slot and calls the library's own function unchanged.
Tasks go to the framework's ``DummyBackend`` (in memory): what is counted is each
scheduler's decision to enqueue a slot. A real backend's enqueue (a database write, a
Redis call) takes longer, and can only widen a race: the figures are a lower bound.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

HERE = Path(__file__).resolve().parent
PEERS = ("scheduled-tasks", "periodic-tasks")
POLL = 0.02


def database() -> dict[str, Any]:
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith("postgres"):
        parts = urlsplit(url)
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": parts.path.lstrip("/"),
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
        }
    return {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["PEERS_SQLITE"]}


def configure(peer: str) -> None:
    import django
    from django.conf import settings

    sys.path.insert(0, str(HERE))
    if peer == "periodic-tasks":
        from importlib.util import find_spec

        # django-periodic-tasks prefers the django-tasks backport when it is installed.
        framework = "django_tasks" if find_spec("django_tasks") else "django.tasks"
    else:
        framework = "django.tasks"
    settings.configure(
        USE_TZ=True,
        TIME_ZONE="UTC",
        INSTALLED_APPS=[
            "django.contrib.contenttypes",
            "django_periodic_tasks" if peer == "periodic-tasks" else "django_scheduled_tasks",
        ],
        DATABASES={"default": database()},
        TASKS={"default": {"BACKEND": f"{framework}.backends.dummy.DummyBackend"}},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        LOGGING_CONFIG=None,
    )
    django.setup()


# -- one scheduler process ---------------------------------------------------------------------


def child(peer: str, log_path: Path, start_at: float, seconds: float) -> None:
    configure(peer)
    log = log_path.open("a", buffering=1)

    def record(slot: Any, kind: str = "enqueued") -> None:
        log.write(f"{os.getpid()} {slot.isoformat()} {kind}\n")

    while time.time() < start_at:
        time.sleep(0.001)
    stop = threading.Event()
    threading.Timer(seconds, stop.set).start()

    if peer == "scheduled-tasks":
        from django_scheduled_tasks import base
        from django_scheduled_tasks.models import ScheduledTaskRunLog
        from peer_scheduled_tasks import probe

        original = ScheduledTaskRunLog.create_or_update_run_log.__func__  # type: ignore[attr-defined]

        def observed(cls: type, schedule: Any, **fields: Any) -> Any:
            if "task_id" in fields:  # written right after an enqueue, with its slot
                record(fields["last_scheduled_run_time"])
            return original(cls, schedule, **fields)

        ScheduledTaskRunLog.create_or_update_run_log = classmethod(observed)  # type: ignore[method-assign,assignment]
        base.periodic_task(interval=timedelta(seconds=1), task=probe)
        base.scheduler.run_scheduling_loop(stop, interval=timedelta(seconds=POLL))
    else:
        from django.db import transaction
        from django_periodic_tasks.conf import get_scheduler_class
        from django_periodic_tasks.models import ScheduledTask
        from django_periodic_tasks.registry import schedule_registry
        from peer_periodic_tasks import probe

        enqueue_now = ScheduledTask.enqueue_now

        def observed_enqueue(self: Any) -> None:
            slot = self.next_run_at  # the slot this tick fires, read under its row lock
            record(slot)
            enqueue_now(self)
            # The tick's transaction: a backend writing to this database would keep the
            # enqueue only if it commits.
            transaction.on_commit(lambda: record(slot, "committed"))

        ScheduledTask.enqueue_now = observed_enqueue  # type: ignore[method-assign]
        schedule_registry.register(probe, cron="* * * * * *", name="probe")
        scheduler = get_scheduler_class()(interval=POLL)  # type: ignore[arg-type]
        threading.Thread(target=lambda: (stop.wait(), scheduler.stop()), daemon=True).start()
        scheduler.run()


# -- the measurement ---------------------------------------------------------------------------


def measure(peer: str, seconds: float) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="fencedjobs-peers-double-", dir="/tmp"))
    env = dict(os.environ)
    if not env.get("DATABASE_URL", "").startswith("postgres"):
        env.pop("DATABASE_URL", None)
    env.setdefault("PEERS_SQLITE", str(work / "db.sqlite3"))
    setup = subprocess.run(
        [sys.executable, __file__, "--migrate", peer], env=env, capture_output=True, text=True
    )
    if setup.returncode != 0:
        sys.exit(setup.stderr)
    start_at = time.time() + 3.0
    logs = [work / f"scheduler-{n}.log" for n in range(2)]
    errs = [work / f"scheduler-{n}.err" for n in range(2)]
    children = []
    for log, err in zip(logs, errs, strict=True):
        with err.open("w") as stderr:
            children.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--child",
                        peer,
                        str(log),
                        str(start_at),
                        str(seconds),
                    ],
                    env=env,
                    stderr=stderr,
                    stdout=subprocess.DEVNULL,
                )
            )
    for process in children:
        process.wait(timeout=seconds + 60)
    per_slot: Counter[str] = Counter()
    committed: Counter[str] = Counter()
    per_process = []
    for log in logs:
        lines = [line.split() for line in (log.read_text().splitlines() if log.exists() else [])]
        per_process.append(sum(1 for line in lines if line[2] == "enqueued"))
        per_slot.update(line[1] for line in lines if line[2] == "enqueued")
        committed.update(line[1] for line in lines if line[2] == "committed")
    errors = [
        line
        for err in errs
        for line in err.read_text().splitlines()
        if "Error" in line and not line.startswith(" ")
    ]
    result = {
        "peer": peer,
        "database": "postgresql" if "DATABASE_URL" in env else "sqlite",
        "seconds": seconds,
        "slots": len(per_slot),
        "enqueues": sum(per_slot.values()),
        "slots_enqueued_twice_or_more": sum(1 for n in per_slot.values() if n > 1),
        # django-periodic-tasks only: ticks whose transaction committed, per slot.
        "slots_committed_twice_or_more": (
            sum(1 for n in committed.values() if n > 1) if committed else None
        ),
        "enqueues_per_process": per_process,
        "exit_codes": [p.returncode for p in children],
        "errors": len(errors),
        "first_error": errors[0] if errors else "",
    }
    shutil.rmtree(work, ignore_errors=True)
    return result


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        peer, log, start_at, seconds = sys.argv[2:6]
        child(peer, Path(log), float(start_at), float(seconds))
        return
    if sys.argv[1:2] == ["--migrate"]:
        configure(sys.argv[2])
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        # A fresh start on a server used before: no run log, no schedule row.
        if sys.argv[2] == "scheduled-tasks":
            from django_scheduled_tasks.models import ScheduledTaskRunLog

            ScheduledTaskRunLog.objects.all().delete()
        else:
            from django_periodic_tasks.models import ScheduledTask

            ScheduledTask.objects.all().delete()
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("peer", choices=PEERS)
    parser.add_argument("--seconds", type=float, default=30.0)
    options = parser.parse_args()
    print(json.dumps(measure(options.peer, options.seconds)))


if __name__ == "__main__":
    main()
