#!/usr/bin/env python3
"""``make soak``: the randomized fault test (docs/reliability.md).

    python3 scripts/throwaway_postgres.py -- .venv/bin/python scripts/soak.py
        [--seconds 600] [--seed N] [--quiet 40] [--dir PATH] [--markdown PATH]
        [--json PATH] [--keep-db] [--print-plan] [--pgbouncer]

Runs the jobs of ``soak/soakapp/jobs.py`` in three runner processes against the
``DATABASE_URL`` server (in a database of its own, dropped at the end) while injecting the
faults of the seed's plan for ``--seconds``, then a quiet period of ``--quiet`` seconds,
then checks the data. Prints the seed first and the figures at the end; exits 0 when no
invariant was violated, 1 when one was, 2 when the soak could not run. The same seed
replays the same fault schedule (``--print-plan`` shows it without running anything).

``--pgbouncer`` puts a connection pooler in the path: every process of the soak (the
driver and the runners) reaches the server through the PgBouncer in transaction pooling
that scripts/throwaway_postgres.py starts in front of its cluster
(``FENCEDJOBS_TEST_PGBOUNCER_URL``; ``make soak-pgbouncer``). The server restarts behind
it.

Server restarts need ``FENCEDJOBS_TEST_PG_CTL`` (set by scripts/throwaway_postgres.py);
without it they are skipped and reported so.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# This file's directory comes first on sys.path, and this file is named "soak" too: the
# package must win.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "scripts"]
sys.path.insert(0, str(REPO))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scripts/soak.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0, help="fault phase (s)")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one")
    parser.add_argument("--quiet", type=float, default=40.0, help="quiet period (s)")
    parser.add_argument("--dir", type=Path, help="logs and acks (default: a temporary one)")
    parser.add_argument("--markdown", type=Path, help="write the figures as a markdown table")
    parser.add_argument("--json", type=Path, help="write the figures as JSON")
    parser.add_argument("--keep-db", action="store_true", help="do not drop the database")
    parser.add_argument("--print-plan", action="store_true", help="print the plan and exit")
    parser.add_argument(
        "--sabotage",
        choices=["time-only-lease", "check-then-act", "restart-fences"],
        help="break the app on purpose in the runners (soak/sabotage.py): the checker must "
        "then report safety violations",
    )
    parser.add_argument(
        "--pgbouncer",
        action="store_true",
        help="reach the server through the PgBouncer (transaction pooling) that "
        "scripts/throwaway_postgres.py starts (FENCEDJOBS_TEST_PGBOUNCER_URL)",
    )
    args = parser.parse_args(argv)

    from soak.plan import make_plan

    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    plan = make_plan(seed, args.seconds, args.quiet)
    target = "soak-pgbouncer" if args.pgbouncer else "soak"
    command = f"make {target} SOAK_SECONDS={args.seconds:g} SOAK_SEED={seed}"
    print(
        f"soak: seed {seed}, plan {plan.digest}: {len(plan.faults)} faults "
        f"({', '.join(f'{k} {n}' for k, n in plan.counts().items())}); {len(plan.ops)} "
        f"operations ({', '.join(f'{k} {n}' for k, n in plan.op_counts().items())})",
        flush=True,
    )
    if args.print_plan:
        for event in sorted((*plan.faults, *plan.ops), key=lambda e: e.at):
            print(event.describe())
        return 0

    if args.pgbouncer:
        pooler = os.environ.get("FENCEDJOBS_TEST_PGBOUNCER_URL", "")
        if not pooler:
            why = os.environ.get("FENCEDJOBS_TEST_PGBOUNCER_ERROR") or "none was started"
            print(
                f"soak: --pgbouncer but no PgBouncer ({why}); run `make soak-pgbouncer`, or "
                "python3 scripts/throwaway_postgres.py --pgbouncer -- .venv/bin/python "
                "scripts/soak.py --pgbouncer",
                file=sys.stderr,
            )
            return 2
        # The runners go through the pooler; the driver watches them from a session of its
        # own on the server: through a pool of three, two stopped runners holding theirs
        # in open transactions would leave it waiting for a session.
        os.environ["FENCEDJOBS_SOAK_DRIVER_URL"] = os.environ.get("DATABASE_URL", "")
        os.environ["DATABASE_URL"] = pooler
        print(f"soak: through PgBouncer (transaction pooling) at {pooler}", flush=True)
    url = os.environ.get("DATABASE_URL", "")
    if not url.lower().startswith(("postgres://", "postgresql://", "pgsql://")):
        print(
            "soak: DATABASE_URL must name a PostgreSQL server; run `make soak`, or "
            "python3 scripts/throwaway_postgres.py -- .venv/bin/python scripts/soak.py",
            file=sys.stderr,
        )
        return 2

    def interrupted(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)
    workdir = args.dir or Path(tempfile.mkdtemp(prefix="fencedjobs-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"soak: logs in {workdir}", flush=True)

    from soak import driver

    database = f"fencedjobs_soak_{os.getpid()}"
    pg_ctl = driver.pg_ctl_prefix()
    if pg_ctl is None:
        print("soak: FENCEDJOBS_TEST_PG_CTL is not set: server restarts are skipped", flush=True)
    if args.sabotage:
        print(f"soak: SABOTAGE {args.sabotage}: violations are expected", flush=True)
        command += f" SOAK_ARGS='--sabotage {args.sabotage}'"
    with driver.own_database(database, keep=args.keep_db):
        os.environ["FENCEDJOBS_SOAK_DB"] = database
        os.environ["DJANGO_SETTINGS_MODULE"] = "soak.settings"
        os.environ.setdefault("SOAK_RUNNER", "driver")
        import django

        django.setup()
        from soak import check, report, sabotage

        if args.sabotage == "restart-fences":  # the driver creates lease rows too
            sabotage.apply(args.sabotage)

        soak = driver.Driver(
            plan, workdir=workdir, database=database, pg_ctl=pg_ctl, sabotage=args.sabotage
        )
        try:
            seen = soak.run()
        finally:
            soak.kill_all()
        found = check.check(seen, workdir / "acks")
        summary = report.summary(plan, seen, found, command)
        print(report.text(summary), flush=True)
        report.write(summary, json_path=args.json, markdown_path=args.markdown)
        if found.total() or args.dir is not None:
            check.dump(workdir)
            print(f"soak: tables and logs in {workdir}", flush=True)
        if found.total():
            return 1
    if args.dir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
