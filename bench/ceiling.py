"""The ceiling: single-row update transactions per second, one client, on this PostgreSQL.

``pgbench -b simple-update`` (one client, 10 s) when pgbench is installed: what the server
and its WAL flush can do for one session with no client-side cost worth mentioning. Then
the same transaction from Python through a raw psycopg connection (no Django), which is
the floor of what any Django code can add to. Every other figure reads as a fraction of
these.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bench import common

PGBENCH_DB = "fencedjobs_bench_pgbench"


def find_pgbench() -> str | None:
    candidates = [
        "/usr/bin/pgbench",
        os.path.join(os.environ.get("FENCEDJOBS_TEST_PG_BINDIR", "/nonexistent"), "pgbench"),
        "/usr/lib/postgresql/15/bin/pgbench",
        shutil.which("pgbench") or "",
    ]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def pgbench(seconds: int) -> tuple[float, str]:
    """tps of ``pgbench -b simple-update -c 1 -T seconds`` and the command line."""
    exe = find_pgbench()
    assert exe is not None
    dsn = common._server_dsn()
    conn_args = [f"--host={dsn.get('host', '')}", f"--username={dsn.get('user', '')}"]
    if dsn.get("port"):
        conn_args.append(f"--port={dsn['port']}")
    env = dict(os.environ)
    if dsn.get("password"):
        env["PGPASSWORD"] = dsn["password"]
    with common.connect(dsn["dbname"]) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {PGBENCH_DB}")
        admin.execute(f"CREATE DATABASE {PGBENCH_DB}")
    try:
        with tempfile.TemporaryDirectory() as cwd:  # pgbench may write log files
            subprocess.run(
                [exe, *conn_args, "--initialize", "--scale=1", "--quiet", PGBENCH_DB],
                env=env,
                cwd=cwd,
                check=True,
                capture_output=True,
                text=True,
            )
            run = [
                exe,
                *conn_args,
                "--builtin=simple-update",
                "--client=1",
                f"--time={seconds}",
                PGBENCH_DB,
            ]
            out = subprocess.run(
                run, env=env, cwd=cwd, check=True, capture_output=True, text=True
            ).stdout
    finally:
        with common.connect(dsn["dbname"]) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {PGBENCH_DB} WITH (FORCE)")
    match = re.search(r"tps = ([0-9.]+)", out)
    if not match:
        raise RuntimeError(f"could not read pgbench's output:\n{out}")
    shown = f"{Path(exe).name} --builtin=simple-update --client=1 --time={seconds}"
    return float(match.group(1)), shown


def psycopg_loop(seconds: float) -> float:
    """The simple-update transaction from Python through raw psycopg: tps."""
    with common.connect(autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_ceiling_accounts, bench_ceiling_history")
        conn.execute(
            "CREATE TABLE bench_ceiling_accounts (aid int PRIMARY KEY, abalance int NOT NULL)"
        )
        conn.execute("CREATE TABLE bench_ceiling_history (aid int, delta int, mtime timestamptz)")
        conn.execute(
            "INSERT INTO bench_ceiling_accounts SELECT g, 0 FROM generate_series(1, 100000) g"
        )
        conn.execute("VACUUM ANALYZE bench_ceiling_accounts")
        conn.autocommit = False
        cur = conn.cursor()
        n = 0
        aid = 1
        end = time.perf_counter() + seconds
        start = time.perf_counter()
        while time.perf_counter() < end:
            aid = aid * 48271 % 100000 + 1
            cur.execute(
                "UPDATE bench_ceiling_accounts SET abalance = abalance + %s WHERE aid = %s",
                (7, aid),
            )
            cur.execute("SELECT abalance FROM bench_ceiling_accounts WHERE aid = %s", (aid,))
            cur.fetchone()
            cur.execute(
                "INSERT INTO bench_ceiling_history VALUES (%s, %s, CURRENT_TIMESTAMP)", (aid, 7)
            )
            conn.commit()
            n += 1
        elapsed = time.perf_counter() - start
        conn.autocommit = True
        conn.execute("DROP TABLE bench_ceiling_accounts, bench_ceiling_history")
    return n / elapsed


def measure(smoke: bool) -> common.Report:
    report = common.Report("Ceiling", "what this PostgreSQL does at all, one client")
    seconds = 1 if smoke else 10
    rows = []
    if find_pgbench():
        tps, shown = pgbench(seconds)
        report.figures["ceiling_tps"] = tps
        rows.append([f"`{shown}`", f"{tps:,.0f}", f"{1000 / tps:.3f}"])
    raw = psycopg_loop(seconds / 2 if not smoke else 0.5)
    report.figures["psycopg_tps"] = raw
    report.figures.setdefault("ceiling_tps", raw)
    rows.append(
        [
            "the same transaction from Python, raw psycopg 3 (no Django)",
            f"{raw:,.0f}",
            f"{1000 / raw:.3f}",
        ]
    )
    if not find_pgbench():
        report.add("pgbench is not installed: the ceiling is the raw psycopg loop.")
        report.add("")
    report.add("Single-row update transactions (UPDATE, SELECT, INSERT, COMMIT), 1 client:")
    report.add("")
    for line in common.table(["what", "transactions/s", "ms per transaction"], rows):
        report.add(line)
    return report


if __name__ == "__main__":
    raise SystemExit(common.main(measure))
