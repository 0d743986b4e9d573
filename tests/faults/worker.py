"""Entry point of the fault tests' child processes.

    python -m tests.faults.worker once JOB [--wait-go] [--set KEY=VALUE ...]
    python -m tests.faults.worker loop JOB [--set KEY=VALUE ...]
    python -m tests.faults.worker rounds JOB [--set KEY=VALUE ...]
    python -m tests.faults.worker tasks - [--set KEY=VALUE ...]

* ``once``: ``runjobs --once --job JOB``; with ``--wait-go``, only after reading ``go``
  from stdin (the process is started early, so that its start-up is not on the clock).
* ``loop``: ``runjobs --job JOB``, the loop, until SIGTERM.
* ``rounds``: for each line ``go N`` on stdin, ``runjobs --once --job JOB``, then the event
  ``round_done``: one process per contender, reused for every round of a double-fire test.
* ``tasks``: django-tasks-db's worker, ``db_worker`` (``batch=1``: until the queue is empty;
  else until SIGTERM), under the id ``<label>``; JOB is not used.

The environment is the test's ``child_env`` (its test database, ``tests.settings``). The jobs
of :mod:`tests.faults.jobs` are registered here, not autodiscovered. Events go to
``<dir>/events-<label>.jsonl``; the runner's log records go to stderr.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.worker")
    parser.add_argument("mode", choices=["once", "loop", "rounds", "tasks"])
    parser.add_argument("job")
    parser.add_argument("--wait-go", action="store_true")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(levelname)s %(message)s"))
    log = logging.getLogger("django_fencedjobs")
    log.addHandler(handler)
    log.setLevel(logging.INFO)

    from django.core.management import call_command
    from django.db import connection

    from tests.faults import jobs

    jobs.CONFIG.update(item.split("=", 1) for item in args.set)
    jobs.register()
    connection.ensure_connection()
    jobs.report("ready")
    # JOB may name several jobs, comma-separated.
    selected = [word for name in args.job.split(",") if name for word in ("--job", name)]
    if "workers" in jobs.CONFIG:
        selected += ["--workers", jobs.CONFIG["workers"]]

    if args.mode == "once":
        if args.wait_go and sys.stdin.readline().strip() != "go":
            return 3
        jobs.report("go")
        call_command("runjobs", "--once", *selected)
    elif args.mode == "loop":
        call_command("runjobs", *selected)
    elif args.mode == "tasks":
        options = ["--interval", "0.05", "--no-startup-delay", "--worker-id", jobs.label()]
        if jobs.CONFIG.get("batch") == "1":
            options.append("--batch")
        call_command("db_worker", *options)
    else:
        for line in sys.stdin:
            word, number = line.split()
            if word != "go":
                return 3
            jobs.CONFIG["round"] = number
            call_command("runjobs", "--once", *selected)
            jobs.report("round_done", round=int(number))
    jobs.report("exit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
