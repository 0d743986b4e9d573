"""A throwaway ``redis-server`` for the tests of task backends that queue in Redis (RQ).

Each :class:`RedisServer` is a server of its own: its own temporary directory, a free TCP
port on 127.0.0.1 (taken once, and kept: :meth:`RedisServer.restart` brings the server back
on the same address, as a Redis restarted in production comes back where its clients look
for it), nothing persisted (``--save ''``, ``--appendonly no``: a restart empties it, as a
crash of a Redis without persistence does). It is ready when it answers ``PING``, and it is
stopped when the ``with`` block ends, whatever happened.

It speaks to the server with a raw socket, not redis-py: the harness needs nothing beyond the
standard library and Debian's ``redis-server``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
#: Where Debian installs the server, in case it is not on PATH.
DEBIAN_BINARY = "/usr/bin/redis-server"
#: How long a start or a stop may take before the harness gives up (generous: other suites
#: may share the CPUs).
WAIT = 20.0
#: How long a burst worker may take to start, find its queue and exit: a new interpreter
#: importing Django and RQ, which on a CPU shared with the soak has taken over 20 s.
EXIT_WAIT = 90.0


class RedisUnavailable(RuntimeError):
    """The server could not be started (the reason and the end of its log are the message)."""


def redis_binary() -> str | None:
    """The ``redis-server`` executable, or None when it is not installed."""
    found = shutil.which("redis-server")
    if found:
        return found
    return DEBIAN_BINARY if os.access(DEBIAN_BINARY, os.X_OK) else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def ping(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when a Redis server at ``host:port`` answers ``PING`` with ``PONG``."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` process, started by :meth:`start` (or ``with``), on
    ``127.0.0.1:<port>``; :attr:`url` is what a client is given (database 0)."""

    host = "127.0.0.1"

    def __init__(self, binary: str | None = None, directory: Path | None = None) -> None:
        found = binary or redis_binary()
        if found is None:
            raise RedisUnavailable(
                "redis-server is not installed (Debian: apt-get install redis-server; "
                "make test installs it)"
            )
        self.binary = found
        self._own_directory = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="fencedjobs-redis-"))
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        #: How many times the server has been started (a restart counts).
        self.starts = 0

    def __repr__(self) -> str:
        pid = self.proc.pid if self.proc else None
        return f"<RedisServer {self.host}:{self.port} pid={pid}>"

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the Redis server has not been started")
        return f"redis://{self.host}:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.directory / "redis.log"

    def log(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return f"--- log of redis-server ({self.host}:{self.port}):\n{text[-4000:]}"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -- starting and stopping ------------------------------------------------------------

    def start(self) -> RedisServer:
        """Start the server and wait until it answers ``PING``. The first start takes a free
        port (trying again if another process took it first); later ones reuse it."""
        if self.running():
            raise RuntimeError(f"{self!r} is already running")
        if self.port is not None:
            self._start_on(self.port)
            return self
        for _ in range(5):
            port = free_port()
            try:
                self._start_on(port)
            except RedisUnavailable:
                if "Address already in use" not in self.log():
                    raise
                continue  # another process took the port between our probe and the bind
            return self
        raise RedisUnavailable(f"no free port for redis-server after 5 tries\n{self.log()}")

    def _start_on(self, port: int) -> None:
        argv = [
            self.binary,
            "--bind", self.host,
            "--port", str(port),
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--logfile", str(self.log_path),
        ]  # fmt: skip
        self.log_path.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        self.starts += 1
        deadline = time.monotonic() + WAIT
        while not ping(self.host, port):
            if self.proc.poll() is not None:
                raise RedisUnavailable(
                    f"redis-server exited ({self.proc.returncode}) on port {port}\n{self.log()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise RedisUnavailable(f"redis-server did not answer PING on {port}\n{self.log()}")
            time.sleep(0.01)
        self.port = port

    def stop(self) -> None:
        """Stop the server (SIGTERM; SIGKILL if it does not exit in time). Nothing is saved."""
        if not self.running():
            return
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the server, as a crash would, and reap it."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.kill()
        self.proc.wait(WAIT)

    def restart(self, *, crash: bool = False) -> None:
        """Stop the server (``crash``: SIGKILL) and start it again on the same port, empty."""
        if crash:
            self.kill()
        else:
            self.stop()
        self.start()

    def close(self) -> None:
        """Stop the server and remove its directory (if the harness made it)."""
        try:
            self.kill()
        finally:
            if self._own_directory:
                shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# -- RQ workers -------------------------------------------------------------------------------


def children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc): an RQ worker's work horse, which
    puts itself in a process group of its own, is not reached by signalling the worker's."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _kill(pid: int) -> None:
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return


class StillRunning(subprocess.TimeoutExpired):
    """A worker did not exit in time; the message carries its log."""

    def __init__(self, cmd: Any, timeout: float, log: str) -> None:
        super().__init__(cmd, timeout)
        self.log = log

    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.log}"


class RQWorker:
    """One ``rqworker`` process started by :class:`RQWorkers`; its output goes to
    :attr:`log_path`."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        self.name, self.proc, self.log_path = name, proc, log_path

    def __repr__(self) -> str:
        return f"<RQWorker {self.name} pid={self.proc.pid}>"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        header = f"--- log of RQ worker {self.name} (pid {self.pid}, exit {self.proc.poll()}):"
        return f"{header}\n{text[-6000:]}"

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def wait_exit(self, timeout: float = EXIT_WAIT) -> int:
        """The worker's exit status; raises :class:`StillRunning` (a
        ``subprocess.TimeoutExpired`` whose message ends with the worker's log, which says
        where it was) after ``timeout``."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise StillRunning(exc.cmd, timeout, self.log()) from None

    def kill(self) -> None:
        """SIGKILL the worker and the work horse it may have forked (SIGCONT first, in case
        either is stopped), and reap the worker."""
        if self.proc.poll() is None:
            for child in children_of(self.pid):
                _kill(child)
            _kill(self.pid)
        self.proc.wait(WAIT)


class RQWorkers:
    """``workers(name, *queues, burst=False, simple=False)`` starts a real RQ worker of
    django-tasks-rq, ``python -m django rqworker --job-class django_tasks_rq.Job``, in the
    environment ``env`` (the test's database, tests.rq_settings, its Redis server), on
    ``queues`` (default: ``default``):

    * ``name`` is the worker's name in Redis, and its id in the task's results: unique among
      the workers of one server (a worker killed keeps its name registered for its TTL);
    * ``burst``: the worker exits once the queues are empty, else it runs until killed;
    * ``simple``: rq's ``SimpleWorker``, which runs each job in the worker's own process,
      instead of forking a work horse per job (rq's default ``Worker``).

    Used as a context manager, it kills every worker it started on exit, whatever happened.
    """

    def __init__(self, env: dict[str, str], directory: Path) -> None:
        self.env = env
        self.directory = directory
        self.started: list[RQWorker] = []

    def __call__(
        self, name: str = "W", /, *queues: str, burst: bool = False, simple: bool = False
    ) -> RQWorker:
        argv = [sys.executable, "-m", "django", "rqworker"]
        argv += ["--job-class", "django_tasks_rq.Job", "--name", name]
        if simple:
            argv += ["--worker-class", "rq.worker.SimpleWorker"]
        if burst:
            argv.append("--burst")
        argv += list(queues or ("default",))
        log_path = self.directory / f"rqworker-{name}.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                argv,
                env=self.env,
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        worker = RQWorker(name, proc, log_path)
        self.started.append(worker)
        return worker

    def logs(self) -> str:
        return "\n".join(worker.log() for worker in self.started)

    def kill_all(self) -> None:
        for worker in self.started:
            worker.kill()

    def __enter__(self) -> RQWorkers:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.kill_all()


# -- Celery workers ---------------------------------------------------------------------------


class CeleryWorker(RQWorker):
    """One ``celery worker`` process started by :class:`CeleryWorkers`; its output goes to
    :attr:`log_path`. :attr:`hostname` is its node name, what Celery's extended results
    record as the task's worker."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        super().__init__(name, proc, log_path)
        self.hostname = f"{name}@fencedjobs"

    def __repr__(self) -> str:
        return f"<CeleryWorker {self.hostname} pid={self.pid}>"

    def log(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        header = (
            f"--- log of Celery worker {self.hostname} (pid {self.pid}, exit {self.proc.poll()}):"
        )
        return f"{header}\n{text[-6000:]}"

    def kill(self) -> None:
        """SIGKILL the worker and its pool's processes (SIGCONT first, in case any is
        stopped), and reap the worker."""
        if self.proc.poll() is None:
            children = children_of(self.pid)
            _kill(self.pid)  # first, so that it does not start a new pool process
            for child in children:
                _kill(child)
        self.proc.wait(WAIT)


class CeleryWorkers:
    """``workers(name, *queues, pool="solo")`` starts a real Celery worker of
    django-tasks-fennel, ``python -m celery -A django_tasks_fennel.app worker``, in the
    environment ``env`` (the test's database, tests.celery_settings, its Redis server as
    broker and result backend), on ``queues`` (default: ``default``):

    * ``name`` is the worker's node name, ``<name>@fencedjobs``: unique among the workers of
      one test;
    * ``pool``: ``solo`` runs each task in the worker's own process; ``prefork`` in one
      pool process it forks (concurrency 1 either way);
    * it registers the tasks of tests/celery_tasks.py (``--include``), loads Django through
      Celery's Django fixup, and starts without gossip, mingle or heartbeats (no other
      worker to talk to).

    Used as a context manager, it kills every worker it started, with its pool's processes,
    on exit, whatever happened.
    """

    app = "django_tasks_fennel.app"
    include = "tests.celery_tasks"

    def __init__(self, env: dict[str, str], directory: Path) -> None:
        self.env = env
        self.directory = directory
        self.started: list[CeleryWorker] = []

    def __call__(self, name: str = "W", /, *queues: str, pool: str = "solo") -> CeleryWorker:
        if pool not in ("solo", "prefork"):
            raise ValueError(f"pool {pool!r}: use solo or prefork")
        argv = [sys.executable, "-m", "celery", "-A", self.app, "worker"]
        argv += ["--pool", pool, "--concurrency", "1", "--hostname", f"{name}@fencedjobs"]
        argv += ["--queues", ",".join(queues or ("default",)), "--include", self.include]
        argv += ["--loglevel", "INFO", "--without-gossip", "--without-mingle"]
        argv += ["--without-heartbeat"]
        log_path = self.directory / f"celery-{name}.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                argv,
                env=self.env,
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        worker = CeleryWorker(name, proc, log_path)
        self.started.append(worker)
        return worker

    def logs(self) -> str:
        return "\n".join(worker.log() for worker in self.started)

    def kill_all(self) -> None:
        for worker in self.started:
            worker.kill()

    def __enter__(self) -> CeleryWorkers:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.kill_all()
