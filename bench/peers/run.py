"""Measure the peers the way docs/tasks.md measures django-fencedjobs: each scheduler's own
code, installed from PyPI into a throwaway virtualenv under /tmp, driven on the same
simulated clock (``dst.py``).

    python3 bench/peers/run.py                 # a new virtualenv, removed afterwards
    python3 bench/peers/run.py --keep          # keep it (its path is printed)
    python3 bench/peers/run.py --venv DIR      # reuse (or create) the virtualenv DIR
    python3 bench/peers/run.py --python /path/to/python3.13
    python3 scripts/throwaway_postgres.py -- python3 bench/peers/run.py   # and PostgreSQL

Two measurements: ``dst.py`` (each scheduler's next-fire-time code across the 2026 New
York DST days) and ``double_fire.py`` (two scheduler processes of each database-based
peer on one database: on a new SQLite file, and on PostgreSQL when ``DATABASE_URL`` names
one, as ``scripts/throwaway_postgres.py`` sets it).

Standard library only; needs the network to PyPI. Not part of ``make test``: nothing in the
test suite imports it. The peers pin the versions docs/tasks.md reports on (``PEERS``);
django-fencedjobs itself is this checkout, put on the measuring interpreter's path (not
installed, so the checkout is left as it is).

The interpreter must be Python 3.13 or newer (django-periodic-tasks 0.2.1 requires 3.13,
django-crontask 2.2.0 requires 3.14): by default the newest of 3.14 and 3.13 that
``scripts/find_python`` finds. On 3.13, django-crontask is installed with
``--ignore-requires-python`` (its code runs there; the output says so).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]

#: The peers, at the versions docs/tasks.md reports on, and what they need for dst.py.
PEERS = [
    "django-periodic-tasks==0.2.1",
    "django-scheduled-tasks==0.3.0",
    "django-celery-beat==2.9.0",
    "psycopg[binary]>=3.1",
]
#: Requires Python 3.14: installed apart, without its Requires-Python check on 3.13.
CRONTASK = "django-crontask==2.2.0"
CRONTASK_DEPS = ["apscheduler"]
#: django-scheduled-tasks and django-crontask need Django 6.0; django-celery-beat < 6.1.
COMMON = ["Django>=6.0,<6.1", "tzdata"]


def find_python() -> str:
    found = subprocess.run(
        [str(REPO_ROOT / "scripts" / "find_python"), "3.14", "3.13"],
        capture_output=True,
        text=True,
    )
    if found.returncode != 0:
        sys.exit(
            "bench/peers: no Python 3.14 or 3.13 found (the peers require it); name one "
            "with --python /path/to/python3.13\n" + found.stderr
        )
    return found.stdout.strip()


def pip(python: Path, *args: str) -> None:
    print(f"$ pip install {' '.join(args)}", flush=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args],
        check=True,
    )


def version_of(python: str) -> tuple[int, int]:
    out = subprocess.run(
        [python, "-c", "import sys; print(*sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return int(out[0]), int(out[1])


def double_fire(venv_python: Path, seconds: float, *, as_json: bool) -> None:
    """Two scheduler processes per database-based peer, on SQLite and on PostgreSQL (when
    ``DATABASE_URL`` names one)."""
    url = os.environ.get("DATABASE_URL", "")
    databases = ["sqlite", *(["postgresql"] if url.startswith("postgres") else [])]
    print(
        f"\n$ {venv_python} bench/peers/double_fire.py PEER --seconds {seconds:g}"
        f"   # on {' and '.join(databases)}\n",
        flush=True,
    )
    results = []
    for peer in ("scheduled-tasks", "periodic-tasks"):
        for db in databases:
            env = dict(os.environ)
            if db == "sqlite":
                env.pop("DATABASE_URL", None)
            out = subprocess.run(
                [str(venv_python), str(HERE / "double_fire.py"), peer, "--seconds", str(seconds)],
                cwd=HERE,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            results.append(json.loads(out.strip().splitlines()[-1]))
    if as_json:
        print(json.dumps(results, indent=2))
        return
    print(
        "| peer | database | slots | enqueues | slots enqueued twice | of which the tick "
        "committed twice | errors logged |"
    )
    print("| --- | --- | ---: | ---: | ---: | --- | ---: |")
    for r in results:
        committed = r["slots_committed_twice_or_more"]
        print(
            f"| django-{r['peer']} | {r['database']} | {r['slots']} | {r['enqueues']} "
            f"| {r['slots_enqueued_twice_or_more']} "
            f"| {'n/a (no transaction)' if committed is None else committed} "
            f"| {r['errors']}{': ' + r['first_error'][:80] if r['errors'] else ''} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", help="interpreter for the virtualenv (3.13 or newer)")
    parser.add_argument("--venv", type=Path, help="virtualenv to use or create (kept)")
    parser.add_argument("--keep", action="store_true", help="keep the new virtualenv")
    parser.add_argument("--json", action="store_true", help="print the raw results as JSON")
    parser.add_argument(
        "--seconds",
        type=float,
        default=30.0,
        help="how long the two scheduler processes run, per peer and database (default 30)",
    )
    options = parser.parse_args()

    python = options.python or find_python()
    major, minor = version_of(python)
    if (major, minor) < (3, 13):
        sys.exit(f"bench/peers: {python} is Python {major}.{minor}; the peers need 3.13+")
    venv = options.venv or Path(tempfile.mkdtemp(prefix="fencedjobs-peers-", dir="/tmp"))
    remove = options.venv is None and not options.keep
    try:
        venv_python = venv / "bin" / "python"
        if not venv_python.exists():
            print(f"$ {python} -m venv {venv}", flush=True)
            subprocess.run([python, "-m", "venv", str(venv)], check=True)
        pip(venv_python, *COMMON, *PEERS, *CRONTASK_DEPS)
        if (major, minor) < (3, 14):
            print(
                f"note: {CRONTASK} declares Requires-Python >=3.14; installed on "
                f"{major}.{minor} with --ignore-requires-python",
                flush=True,
            )
            pip(venv_python, "--no-deps", "--ignore-requires-python", CRONTASK)
        else:
            pip(venv_python, CRONTASK)
        print(f"$ {venv_python} bench/peers/dst.py\n", flush=True)
        subprocess.run(
            [str(venv_python), str(HERE / "dst.py"), *(["--json"] if options.json else [])],
            cwd=REPO_ROOT,
            check=True,
        )
        double_fire(venv_python, options.seconds, as_json=options.json)
    finally:
        if remove:
            shutil.rmtree(venv, ignore_errors=True)
        else:
            print(f"\nvirtualenv kept: {venv}")


if __name__ == "__main__":
    main()
