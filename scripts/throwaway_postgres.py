#!/usr/bin/env python3
"""Run a command against a throwaway PostgreSQL cluster.

    python3 scripts/throwaway_postgres.py [--durable] [--pgbouncer | --no-pgbouncer]
        -- CMD [ARGS...]

Starts a private PostgreSQL cluster in a fresh temporary directory, runs CMD
with these variables in its environment, and returns CMD's exit code:

    DATABASE_URL                postgres://fencedjobs@127.0.0.1:PORT/postgres
    FENCEDJOBS_TEST_PG_CTL      shell-usable pg_ctl prefix for this cluster,
                                e.g. `$FENCEDJOBS_TEST_PG_CTL restart -m fast -w`
    FENCEDJOBS_TEST_PG_DATADIR  the cluster's data directory
    FENCEDJOBS_TEST_PG_BINDIR   the directory holding initdb/pg_ctl/postgres
    FENCEDJOBS_TEST_PG_THROWAWAY  "1"

In front of the cluster it also starts a PgBouncer in transaction pooling
(pool_mode = transaction, default_pool_size = 3, every database routed to the
cluster), the connection pooler the pooler tests (tests/test_poolers.py) and
`make soak-pgbouncer` put between the app and the server:

    FENCEDJOBS_TEST_PGBOUNCER_URL    postgres://fencedjobs@127.0.0.1:PORT/postgres
    FENCEDJOBS_TEST_PGBOUNCER_LOG    its log file

When PgBouncer cannot be had (no `pgbouncer` binary: apt-get install pgbouncer;
or it would not start), CMD runs all the same, with
FENCEDJOBS_TEST_PGBOUNCER_ERROR saying why, and the tests that need the pooler
fail with that reason. --pgbouncer makes that an error of this script instead
(exit 2); --no-pgbouncer starts none.

The cluster and the pooler are stopped and their directory removed whatever
happens to CMD (non-zero exit, Ctrl-C, SIGTERM, SIGHUP). A cluster or pooler
left behind by a run that was SIGKILLed is cleaned up by the next run.

If DATABASE_URL is already set, nothing is started: CMD simply runs.

By default durability is switched off (fsync, synchronous_commit,
full_page_writes) because the data is thrown away; --durable keeps
PostgreSQL's defaults, for benchmarks.

Standard library only; runs with the system python3.
"""

from __future__ import annotations

import argparse
import functools
import glob
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

SUPERUSER = "fencedjobs"
DIR_PREFIX = "fencedjobs-pg-"
OWNER_FILE = "runner.pid"
PROG = "throwaway_postgres"
STALE_UNOWNED_AGE = 600  # seconds before a directory without OWNER_FILE is stale


@functools.cache
def env_has_chdir() -> bool:
    try:
        return (
            subprocess.run(
                ["env", "-C", "/", "true"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            ).returncode
            == 0
        )
    except OSError:
        return False


def log(msg: str) -> None:
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


# --------------------------------------------------------------------------
# Finding PostgreSQL


def _version_key(path: str) -> tuple[int, ...]:
    name = os.path.basename(os.path.dirname(path.rstrip("/")))
    return tuple(int(p) for p in re.findall(r"\d+", name)) or (0,)


def find_bindir() -> str | None:
    candidates = [
        d
        for d in glob.glob("/usr/lib/postgresql/*/bin")
        if all(os.access(os.path.join(d, b), os.X_OK) for b in ("initdb", "pg_ctl", "postgres"))
    ]
    if candidates:
        return max(candidates, key=_version_key)
    initdb = shutil.which("initdb")
    if initdb:
        bindir = os.path.dirname(os.path.realpath(initdb))
        if all(os.access(os.path.join(bindir, b), os.X_OK) for b in ("pg_ctl", "postgres")):
            return bindir
    return None


# --------------------------------------------------------------------------
# Helpers


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def postmaster_pid(datadir: str) -> int | None:
    try:
        with open(os.path.join(datadir, "postmaster.pid")) as f:
            return int(f.readline().strip())
    except (OSError, ValueError):
        return None


class Cluster:
    def __init__(self, bindir: str, durable: bool) -> None:
        self.bindir = bindir
        self.durable = durable
        self.as_root = os.geteuid() == 0
        self.tmpdir = ""
        self.datadir = ""
        self.logfile = ""
        self.sockdir = ""
        self.port = 0

    # Commands run as the postgres user when we are root (initdb and the
    # server refuse to run as root).
    def prefix(self) -> list[str]:
        return ["runuser", "-u", "postgres", "--"] if self.as_root else []

    def pg_ctl_prefix(self) -> list[str]:
        # `env -C`: the postgres user may not be allowed into the caller's cwd
        # (e.g. a checkout under /root); pg_ctl would warn about it.
        cd = ["env", "-C", self.tmpdir] if self.as_root and env_has_chdir() else []
        return [
            *self.prefix(),
            *cd,
            os.path.join(self.bindir, "pg_ctl"),
            "-D",
            self.datadir,
            "-l",
            self.logfile,
        ]

    def run_pg(self, args: list[str], check: bool = True, quiet: bool = True) -> int:
        # cwd=tmpdir: the postgres user may not be allowed into the caller's cwd.
        proc = subprocess.run(
            [*self.prefix(), *args],
            cwd=self.tmpdir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if quiet else None,
            stderr=subprocess.STDOUT if quiet else None,
            text=True,
        )
        if check and proc.returncode != 0:
            if quiet and proc.stdout:
                sys.stderr.write(proc.stdout)
            raise RuntimeError(f"{shlex.join(args[:1])} failed with exit code {proc.returncode}")
        return proc.returncode

    def create(self) -> None:
        base = "/tmp" if self.as_root else tempfile.gettempdir()
        self.tmpdir = tempfile.mkdtemp(prefix=DIR_PREFIX, dir=base)  # mode 0700
        with open(os.path.join(self.tmpdir, OWNER_FILE), "w") as f:
            f.write(f"{os.getpid()}\n")
        self.datadir = os.path.join(self.tmpdir, "data")
        self.sockdir = os.path.join(self.tmpdir, "sock")
        self.logfile = os.path.join(self.tmpdir, "postgres.log")
        os.mkdir(self.sockdir, 0o700)
        if self.as_root:
            pw = pwd.getpwnam("postgres")
            for path in (self.tmpdir, self.sockdir):
                os.chown(path, pw.pw_uid, pw.pw_gid)

    def initdb(self) -> None:
        self.run_pg(
            [
                os.path.join(self.bindir, "initdb"),
                "-D",
                self.datadir,
                "--no-locale",
                "-E",
                "UTF8",
                "-A",
                "trust",
                "-U",
                SUPERUSER,
                "--no-sync",
            ]
        )

    def configure(self, port: int) -> None:
        self.port = port
        lines = [
            "",
            "# added by scripts/throwaway_postgres.py",
            "listen_addresses = '127.0.0.1'",
            f"port = {port}",
            f"unix_socket_directories = '{self.sockdir}'",
            "max_connections = 200",
            "logging_collector = off",
        ]
        if not self.durable:
            lines += ["fsync = off", "synchronous_commit = off", "full_page_writes = off"]
        # Written as root into a postgres-owned file: appending keeps the owner.
        with open(os.path.join(self.datadir, "postgresql.conf"), "a") as f:
            f.write("\n".join(lines) + "\n")

    def start(self) -> None:
        for attempt in range(5):
            self.configure(free_port())
            pg_ctl = self.pg_ctl_prefix()[len(self.prefix()) :]
            rc = self.run_pg([*pg_ctl, "start", "-w", "-t", "60"], check=False)
            if rc == 0:
                break
            if attempt == 4 or "could not bind" not in self.read_log():
                sys.stderr.write(self.read_log()[-4000:])
                raise RuntimeError(f"pg_ctl start failed with exit code {rc}")
            log(f"port {self.port} was taken, retrying")
        self.wait_ready()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        "PostgreSQL did not accept TCP connections in 30 s"
                    ) from None
                time.sleep(0.05)

    def read_log(self) -> str:
        try:
            with open(self.logfile, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def destroy(self) -> None:
        if not self.tmpdir:
            return
        stop_and_remove(self.tmpdir, self.prefix(), self.bindir)
        self.tmpdir = ""

    def url(self) -> str:
        return f"postgres://{SUPERUSER}@127.0.0.1:{self.port}/postgres"


def stop_and_remove(tmpdir: str, prefix: list[str], bindir: str) -> None:
    stop_pgbouncer(tmpdir)
    datadir = os.path.join(tmpdir, "data")
    if os.path.exists(os.path.join(datadir, "postmaster.pid")):
        subprocess.run(
            [
                *prefix,
                os.path.join(bindir, "pg_ctl"),
                "-D",
                datadir,
                "stop",
                "-m",
                "immediate",
                "-w",
                "-t",
                "20",
            ],
            cwd=tmpdir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        pid = postmaster_pid(datadir)
        if pid is not None and pid_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
            deadline = time.monotonic() + 5
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
    shutil.rmtree(tmpdir, ignore_errors=True)


def reap_stale(bindir: str, as_root: bool) -> None:
    """Remove clusters left behind by runs that were killed with SIGKILL."""
    base = "/tmp" if as_root else tempfile.gettempdir()
    prefix = ["runuser", "-u", "postgres", "--"] if as_root else []
    for tmpdir in glob.glob(os.path.join(base, DIR_PREFIX + "*")):
        try:
            with open(os.path.join(tmpdir, OWNER_FILE)) as f:
                owner: int | None = int(f.read().strip())
        except (OSError, ValueError):
            owner = None
        if owner is None:
            # Interrupted between mkdtemp and writing OWNER_FILE.
            try:
                age = time.time() - os.stat(tmpdir).st_mtime
            except OSError:
                continue
            if age < STALE_UNOWNED_AGE:
                continue
        elif owner == os.getpid() or pid_alive(owner):
            continue
        log(f"removing stale cluster {tmpdir} (runner {owner} is gone)")
        stop_and_remove(tmpdir, prefix, bindir)


# --------------------------------------------------------------------------
# PgBouncer in front of the cluster

PGBOUNCER_PID = "pgbouncer.pid"


def find_pgbouncer() -> str | None:
    found = shutil.which("pgbouncer")
    if found:
        return found
    for path in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer", "/usr/local/bin/pgbouncer"):
        if os.access(path, os.X_OK):
            return path
    return None


class PgBouncer:
    """A PgBouncer in transaction pooling in front of ``cluster``, in the cluster's
    directory, run as the same user as the server."""

    def __init__(self, cluster: Cluster, binary: str) -> None:
        self.cluster = cluster
        self.binary = binary
        self.port = 0
        self.ini = os.path.join(cluster.tmpdir, "pgbouncer.ini")
        self.logfile = os.path.join(cluster.tmpdir, "pgbouncer.log")
        self.pidfile = os.path.join(cluster.tmpdir, PGBOUNCER_PID)

    def configure(self, port: int) -> None:
        self.port = port
        tmpdir = self.cluster.tmpdir
        userlist = os.path.join(tmpdir, "pgbouncer-users.txt")
        with open(userlist, "w") as f:
            # auth_type = trust still wants the user listed; the server trusts it too.
            f.write(f'"{SUPERUSER}" ""\n')
        lines = [
            "; written by scripts/throwaway_postgres.py",
            "[databases]",
            # Every database, the test databases included, on the throwaway cluster.
            f"* = host=127.0.0.1 port={self.cluster.port}",
            "",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {userlist}",
            f"admin_users = {SUPERUSER}",
            "pool_mode = transaction",
            "default_pool_size = 3",
            "min_pool_size = 0",
            "reserve_pool_size = 0",
            "max_client_conn = 500",
            # After a failed login (the server restarting), retry after 1 s rather than turn
            # every client away for 15: as docs/deployment.md advises for runners.
            "server_login_retry = 1",
            # psycopg 2 sends it; the pooler would refuse a client that does.
            "ignore_startup_parameters = extra_float_digits",
            "log_connections = 0",
            "log_disconnections = 0",
            f"logfile = {self.logfile}",
            f"pidfile = {self.pidfile}",
        ]
        with open(self.ini, "w") as f:
            f.write("\n".join(lines) + "\n")
        for path in (self.ini, userlist):
            os.chmod(path, 0o644)

    def start(self) -> None:
        for attempt in range(5):
            self.configure(free_port())
            rc = self.cluster.run_pg([self.binary, "-d", self.ini], check=False)
            if rc == 0 and self.wait_ready():
                return
            stop_pgbouncer(self.cluster.tmpdir)
            log_text = self.read_log()
            if attempt == 4 or "Address already in use" not in log_text:
                sys.stderr.write(log_text[-4000:])
                raise RuntimeError(f"pgbouncer did not start (exit code {rc})")
            log(f"port {self.port} was taken for pgbouncer, retrying")

    def wait_ready(self) -> bool:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return True
            except OSError:
                time.sleep(0.05)
        return False

    def read_log(self) -> str:
        try:
            with open(self.logfile, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def url(self) -> str:
        return f"postgres://{SUPERUSER}@127.0.0.1:{self.port}/postgres"


def stop_pgbouncer(tmpdir: str) -> None:
    """Stop the PgBouncer whose pid file is in ``tmpdir``, if any (immediate shutdown)."""
    try:
        with open(os.path.join(tmpdir, PGBOUNCER_PID)) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return
    for signum, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, signum)
        except OSError:
            return
        deadline = time.monotonic() + wait
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not pid_alive(pid):
            return


def start_pgbouncer(cluster: Cluster, required: bool) -> dict[str, str]:
    """The variables that tell CMD about the pooler: its URL, or why there is none."""
    binary = find_pgbouncer()
    if binary is None:
        reason = "pgbouncer is not installed (apt-get install pgbouncer)"
    else:
        bouncer = PgBouncer(cluster, binary)
        try:
            t0 = time.monotonic()
            bouncer.start()
        except RuntimeError as e:
            reason = f"{binary}: {e} (log: {bouncer.logfile})"
        else:
            log(
                f"PgBouncer (transaction pooling) ready at {bouncer.url()} "
                f"in {time.monotonic() - t0:.1f}s"
            )
            return {
                "FENCEDJOBS_TEST_PGBOUNCER_URL": bouncer.url(),
                "FENCEDJOBS_TEST_PGBOUNCER_LOG": bouncer.logfile,
            }
    if required:
        raise RuntimeError(reason)
    log(f"no PgBouncer: {reason}; the tests that need it will fail")
    return {"FENCEDJOBS_TEST_PGBOUNCER_ERROR": reason}


# --------------------------------------------------------------------------
# Running the command


def run_child(cmd: list[str], env: dict[str, str]) -> int:
    """Run cmd in our process group (so it keeps the terminal) and return its
    exit status; termination signals sent to us are passed on to it."""
    try:
        proc = subprocess.Popen(cmd, env=env)
    except FileNotFoundError:
        log(f"command not found: {cmd[0]}")
        return 127
    except PermissionError:
        log(f"command not executable: {cmd[0]}")
        return 126

    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        # Ctrl-C reaches the whole foreground process group, so the child has
        # its own SIGINT already; anything else we pass on.
        if signum != signal.SIGINT and proc.poll() is None:
            try:
                proc.send_signal(signum)
            except OSError:
                pass

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        escalation = [(5.0, signal.SIGINT), (30.0, signal.SIGTERM), (10.0, signal.SIGKILL)]
        first_signal_at: float | None = None
        while True:
            try:
                rc = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            if received and first_signal_at is None:
                first_signal_at = time.monotonic()
            if first_signal_at is not None and escalation:
                delay, sig = escalation[0]
                if time.monotonic() - first_signal_at > delay:
                    escalation.pop(0)
                    first_signal_at = time.monotonic()
                    try:
                        proc.send_signal(sig)
                    except OSError:
                        pass
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if rc < 0:
        return 128 - rc
    if received and rc == 0:
        return 128 + received[0]
    return rc


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """This script's options and CMD: the options are the leading arguments that start
    with "-", up to a "--" (dropped) or the first argument that does not; the rest is CMD,
    whatever it contains. So `--help` is this script's, and a "--" inside CMD is CMD's."""
    split = 0
    while split < len(argv) and argv[split].startswith("-") and argv[split] != "--":
        split += 1
    cmd = argv[split:]
    if cmd[:1] == ["--"]:
        cmd = cmd[1:]
    return argv[:split], cmd


def main(argv: list[str]) -> int:
    opts, cmd = split_argv(argv)
    parser = argparse.ArgumentParser(
        prog="throwaway_postgres.py",
        usage="%(prog)s [--durable] [--pgbouncer | --no-pgbouncer] -- CMD [ARGS...]",
        description="Run CMD with DATABASE_URL pointing at a throwaway PostgreSQL cluster.",
    )
    parser.add_argument(
        "--durable",
        action="store_true",
        help="keep fsync/synchronous_commit/full_page_writes at their defaults (benchmarks)",
    )
    pooler = parser.add_mutually_exclusive_group()
    pooler.add_argument(
        "--pgbouncer",
        action="store_true",
        help="fail (exit 2) when PgBouncer cannot be started in front of the cluster "
        "(by default CMD then runs without it, told why in FENCEDJOBS_TEST_PGBOUNCER_ERROR)",
    )
    pooler.add_argument(
        "--no-pgbouncer", action="store_true", help="start no PgBouncer in front of the cluster"
    )
    args = parser.parse_args(opts)
    if not cmd:
        parser.error("no command given (put it after --)")

    if os.environ.get("DATABASE_URL"):
        try:
            os.execvp(cmd[0], cmd)
        except OSError as e:
            log(f"cannot run {cmd[0]}: {e}")
            return 127

    bindir = find_bindir()
    if bindir is None:
        print(
            f"{PROG}: PostgreSQL server binaries not found; "
            "install them with: apt-get install postgresql-15 (or: apt-get install postgresql)",
            file=sys.stderr,
        )
        return 2
    cluster = Cluster(bindir, durable=args.durable)
    if cluster.as_root:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            print(
                f"{PROG}: running as root but there is no 'postgres' user to run the server",
                file=sys.stderr,
            )
            return 2
        if shutil.which("runuser") is None:
            print(f"{PROG}: running as root but runuser (util-linux) is missing", file=sys.stderr)
            return 2

    # Until the child runs, termination signals abort the setup; the finally
    # block below still tears the cluster down.
    def abort(signum: int, _frame: object) -> None:
        raise Interrupted(signum)

    old = {s: signal.signal(s, abort) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        try:
            reap_stale(bindir, cluster.as_root)
            t0 = time.monotonic()
            cluster.create()
            cluster.initdb()
            cluster.start()
            log(
                f"PostgreSQL {os.path.basename(os.path.dirname(bindir))} ready at {cluster.url()} "
                f"in {time.monotonic() - t0:.1f}s{' (durable)' if args.durable else ''}"
            )
            env = dict(os.environ)
            env.update(
                DATABASE_URL=cluster.url(),
                FENCEDJOBS_TEST_PG_CTL=shlex.join(cluster.pg_ctl_prefix()),
                FENCEDJOBS_TEST_PG_DATADIR=cluster.datadir,
                FENCEDJOBS_TEST_PG_BINDIR=bindir,
                FENCEDJOBS_TEST_PG_THROWAWAY="1",
            )
            for name in (
                "FENCEDJOBS_TEST_PGBOUNCER_URL",
                "FENCEDJOBS_TEST_PGBOUNCER_LOG",
                "FENCEDJOBS_TEST_PGBOUNCER_ERROR",
            ):
                env.pop(name, None)
            if not args.no_pgbouncer:
                env.update(start_pgbouncer(cluster, required=args.pgbouncer))
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        return run_child(cmd, env)
    except Interrupted as e:
        log(f"interrupted by signal {e.signum}")
        return 128 + e.signum
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    except RuntimeError as e:
        log(str(e))
        return 2
    finally:
        # Ignore further interrupts while tearing down.
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        cluster.destroy()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
