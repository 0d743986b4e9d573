"""Fault: handlers that no interrupt reaches (a socket read without a timeout, C code) keep
overrunning their timeout. Each is given up on after the grace and its worker replaced, but
its thread stays until the handler returns, if ever.

Why it matters: nothing but the end of the process ends such a thread. A runner that went
on replacing workers forever would pile up threads, and whatever their handlers hold,
without bound. Here, once as many given-up handlers are still running as the limit
(``MAX_ABANDONED_HANDLERS``, by default the number of workers), ``runjobs`` takes no further
run, records every run it holds, says so in one line and exits 4, for its supervisor to
start a new process. A handler that returns is no longer counted; the count is in the
runner's Prometheus metrics.

Real ``runjobs`` processes; the handlers wait on a file lock the test holds
(tests/checkapps/stuck).
"""

from __future__ import annotations

import fcntl
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from django_fencedjobs import clock, operations
from django_fencedjobs.models import LEASE_FREE, JobLease, JobRun, Outcome
from tests.faults.harness import wait_until
from tests.test_runjobs_command import REPO, check_env

pytestmark = pytest.mark.django_db(transaction=True)

BLOCKED = "stuck.blocked"
STEADY = "stuck.steady"
LATER = "stuck.later"
#: The line ``runjobs`` ends with at the limit (after ``CommandError: ``).
GAVE_UP = (
    "{handlers} given up on at their timeout still running, the most a runner keeps "
    "(FENCEDJOBS['MAX_ABANDONED_HANDLERS'], by default its number of workers: {limit}); "
    "took no further run, recorded the runs it held; exiting for a new process to take over"
)
#: Long enough for several handlers to be given up on (each: its timeout, 1 s, plus the
#: supervisor's grace, 5 s), on a busy machine.
WAIT = 90.0


class Gate:
    """The file lock the stuck handlers wait on: held by the test (exclusively) until
    :meth:`open`; :meth:`shut` holds it again."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()
        self._file = path.open("rb")
        self.shut()

    def shut(self) -> None:
        fcntl.flock(self._file, fcntl.LOCK_EX)

    def open(self) -> None:
        fcntl.flock(self._file, fcntl.LOCK_UN)

    def close(self) -> None:
        self._file.close()


@pytest.fixture
def gate(tmp_path: Path):
    gate = Gate(tmp_path / "gate")
    yield gate
    gate.close()


def env_for(child_env: dict[str, str], gate: Gate, settings: str = "") -> dict[str, str]:
    more = {"FENCEDJOBS_TEST_GATE": str(gate.path)}
    if settings:
        more["FENCEDJOBS_CHECK_SETTINGS"] = settings
    return check_env(child_env, "stuck", FENCEDJOBS_CHECK_LOGGING="none", **more)


def start(env: dict[str, str], tmp_path: Path, *args: str) -> subprocess.Popen[bytes]:
    with open(tmp_path / "runjobs.stderr", "wb") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "django", "runjobs", *args],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def abandoned_handlers(port: int) -> float | None:
    """``fencedjobs_runner_abandoned_handlers`` as the runner serves it; None while it
    serves nothing (not started yet, or gone)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    except OSError:
        return None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "fencedjobs_runner_abandoned_handlers":
                assert set(sample.labels) == {"owner"}
                return sample.value
    return None


def make_due(name: str) -> None:
    assert operations.make_due(name, clock.now()), f"{name} was already due"


def runs(name: str) -> list[JobRun]:
    return list(JobRun.objects.filter(job=name).order_by("fence"))


def assert_every_run_recorded_and_every_lease_free(*names: str) -> None:
    assert not JobRun.objects.filter(outcome=Outcome.RUNNING).exists()
    for row in JobLease.objects.filter(name__in=names):
        assert (row.owner, row.lease_until) == ("", LEASE_FREE), row.name


def test_a_loop_whose_handlers_keep_being_given_up_on_exits_4_in_one_line_at_the_limit(
    child_env, tmp_path, gate
):
    port = free_port()
    env = env_for(
        child_env,
        gate,
        '{"MAX_ABANDONED_HANDLERS": 2, "LOOP_MAX_SLEEP": timedelta(seconds=0.2)}',
    )
    args = ["--workers", "3", "--job", BLOCKED, "--job", STEADY]
    process = start(env, tmp_path, *args, "--metrics", f"127.0.0.1:{port}")

    def log() -> str:
        return (tmp_path / "runjobs.stderr").read_text(errors="replace")

    def count_is(expected: int) -> bool:
        return abandoned_handlers(port) == expected

    try:
        # Running, serving its metrics: no handler given up on yet.
        wait_until(lambda: count_is(0), timeout=WAIT, what="the metrics", diagnostics=log)
        wait_until(
            lambda: JobLease.objects.filter(name__in=[BLOCKED, STEADY]).count() == 2,
            what="the jobs' lease rows",
            diagnostics=log,
        )
        # A healthy run in progress meanwhile, on another worker.
        make_due(STEADY)
        wait_until(
            lambda: JobRun.objects.filter(job=STEADY, outcome=Outcome.RUNNING).exists(),
            what="the steady run",
            diagnostics=log,
        )

        # One handler given up on: counted while its thread runs, no longer once it returns.
        make_due(BLOCKED)
        wait_until(lambda: count_is(1), timeout=WAIT, what="1 abandoned", diagnostics=log)
        assert [run.outcome for run in runs(BLOCKED)] == [Outcome.TIMED_OUT]
        gate.open()
        wait_until(lambda: count_is(0), timeout=WAIT, what="it to return", diagnostics=log)
        gate.shut()
        assert process.poll() is None, log()

        # Two at once: the limit.
        make_due(BLOCKED)
        wait_until(lambda: count_is(1), timeout=WAIT, what="1 abandoned again", diagnostics=log)
        make_due(BLOCKED)
        code = process.wait(WAIT)
    finally:
        process.kill()
        process.wait()

    assert code == 4, log()
    lines = log().splitlines()
    assert "Traceback" not in log()
    assert lines[-1] == "CommandError: " + GAVE_UP.format(handlers="2 handlers", limit=2)
    assert sum("CommandError" in line for line in lines) == 1
    # Every run it held is recorded: the three given up on, and the healthy one, which
    # stopped when asked; their leases were released.
    assert [run.outcome for run in runs(BLOCKED)] == [Outcome.TIMED_OUT] * 3
    assert [run.outcome for run in runs(STEADY)] == [Outcome.SUCCEEDED]
    assert_every_run_recorded_and_every_lease_free(BLOCKED, STEADY)


def test_once_takes_no_further_run_past_the_limit_and_exits_4_in_one_line(
    child_env, tmp_path, gate
):
    """By default the limit is the number of workers: with one, the first handler given up
    on ends the pass, and the job due after it is not started."""
    env = env_for(child_env, gate)
    names = ["--job", BLOCKED, "--job", LATER]
    first = subprocess.run(
        [sys.executable, "-m", "django", "runjobs", "--once", *names],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert first.returncode == 0, first.stderr  # registers the jobs, runs nothing
    make_due(BLOCKED)
    make_due(LATER)  # due after it: started after it
    later = JobLease.objects.get(name=LATER)

    result = subprocess.run(
        [sys.executable, "-m", "django", "runjobs", "--once", "--workers", "1", *names],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT,
    )

    assert result.returncode == 4, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert lines[-1] == "CommandError: " + GAVE_UP.format(handlers="1 handler", limit=1)
    assert sum("CommandError" in line for line in lines) == 1
    assert [run.outcome for run in runs(BLOCKED)] == [Outcome.TIMED_OUT]
    # No further run: the job that waited for the worker was not acquired, and is still due.
    assert runs(LATER) == []
    row = JobLease.objects.get(name=LATER)
    assert (row.fence, row.next_run_at, row.lease_until) == (
        later.fence,
        later.next_run_at,
        LEASE_FREE,
    )
    assert_every_run_recorded_and_every_lease_free(BLOCKED, LATER)


@pytest.mark.parametrize("value", [0, -1, 2.0, "4"])
def test_a_bad_limit_is_refused_in_one_line(value):
    from django.core.exceptions import ImproperlyConfigured
    from django.test import override_settings

    from django_fencedjobs.conf import get_settings

    with (
        override_settings(FENCEDJOBS={"MAX_ABANDONED_HANDLERS": value}),
        pytest.raises(ImproperlyConfigured) as info,
    ):
        get_settings()
    assert "FENCEDJOBS['MAX_ABANDONED_HANDLERS'] must be an int of at least 1, or None" in str(
        info.value
    )


# -- the runner's metrics ---------------------------------------------------------------------


def test_the_runner_serves_its_metrics_to_the_bearer_of_the_token_only(child_env, tmp_path, gate):
    port = free_port()
    env = env_for(child_env, gate, '{"METRICS_TOKEN": "s3cret"}')
    process = start(env, tmp_path, "--job", LATER, "--metrics", f"127.0.0.1:{port}")
    url = f"http://127.0.0.1:{port}/metrics"

    def status(**headers: str) -> int | None:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers)) as page:
                return int(page.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return None  # not serving yet

    try:
        assert wait_until(status, timeout=WAIT, what="the metrics") == 401
        assert status(Authorization="Bearer wrong") == 401
        assert status(Authorization="Bearer s3cret") == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(WAIT) == 0
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["--metrics", "nine"], 2, "expected [HOST:]PORT, e.g. 127.0.0.1:9108, got 'nine'"),
        (["--metrics", "70000"], 2, "expected [HOST:]PORT"),
        (["--list", "--metrics", "9108"], 1, "--metrics serves a runner's metrics"),
    ],
)
def test_a_bad_metrics_address_is_one_line(child_env, gate, args, code, words):
    result = subprocess.run(
        [sys.executable, "-m", "django", "runjobs", *args],
        cwd=REPO,
        env=env_for(child_env, gate),
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert result.returncode == code, result.stderr
    assert words in result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr
