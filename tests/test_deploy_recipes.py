"""The deployment recipes in deploy/ work as written: each is parsed by its own tool's
parser (systemd-analyze, supervisor, YAML) and the command it starts is run here, against
the test database, with the signal and the timeout the recipe gives it.

On a real host the recipes name /srv/myproject, its virtualenv and myproject.settings;
here those stand for this checkout, this interpreter and ``tests.deploy_settings``
(``tests.settings`` plus one job, ``deploy.probe``). Nothing else is changed.
"""

from __future__ import annotations

import configparser
import getpass
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from django_fencedjobs.models import JobLease, JobRun, Outcome
from tests.deployapp.jobs import PROBE
from tests.testapp.models import Write

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
DEPLOYMENT_DOC = REPO / "docs" / "deployment.md"

RECIPES = [
    "crontab",
    "supervisor/fencedjobs.conf",
    "systemd/fencedjobs.service",
    "systemd/fencedjobs-once.service",
    "systemd/fencedjobs-once.timer",
    "kubernetes/cronjob.yaml",
    "kubernetes/deployment.yaml",
]

#: Every recipe for the loop gives it this long to stop after SIGTERM (seconds).
STOP_TIMEOUT = 120
#: The longest job timeout the recipes for one pass are sized for (seconds).
LONGEST_JOB_TIMEOUT = 600
#: How long a test waits for a started process before calling it stuck (seconds).
STARTUP_WAIT = 60


def substituted(text: str, tmp_path: Path) -> str:
    """A recipe with the host's paths replaced by this checkout's."""
    for real, here in {
        "/srv/myproject/.venv/bin/python": sys.executable,
        "/srv/myproject": str(REPO),
        "myproject.settings": "tests.deploy_settings",
        "/var/log/supervisor": str(tmp_path),
    }.items():
        text = text.replace(real, here)
    return text


def recipe(name: str, tmp_path: Path) -> Path:
    """The recipe file, substituted, written to ``tmp_path`` under the same name."""
    target = tmp_path / Path(name).name
    target.write_text(substituted((DEPLOY / name).read_text(), tmp_path))
    return target


def read_unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(
        strict=False, interpolation=None, empty_lines_in_values=False
    )
    # systemd keys are case-sensitive.
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(path.read_text())
    return parser


def systemd_seconds(value: str) -> float:
    """A systemd time span (``120``, ``11min``, ``1min 30s``) in seconds."""
    units = {"": 1, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600, "hr": 3600}
    total = 0.0
    for part in value.split():
        number = part.rstrip("abcdefghijklmnopqrstuvwxyz")
        total += float(number) * units[part[len(number) :]]
    return total


def load_yaml(name: str) -> dict[str, Any]:
    (document,) = yaml.safe_load_all((DEPLOY / name).read_text())
    assert isinstance(document, dict)
    return document


# -- the documentation shows the files as they are ------------------------------------------


@pytest.mark.parametrize("name", RECIPES)
def test_every_recipe_is_shown_verbatim_in_the_deployment_docs(name: str) -> None:
    assert (DEPLOY / name).read_text().strip() in DEPLOYMENT_DOC.read_text(), (
        f"docs/deployment.md must include deploy/{name} as it is; copy it in again"
    )


# -- the crontab line ------------------------------------------------------------------------


@dataclass
class Crontab:
    variables: dict[str, str]
    schedule: str
    command: str


def parse_crontab(text: str) -> Crontab:
    """A user crontab as cron reads it: ``NAME=value`` lines and one job line."""
    variables: dict[str, str] = {}
    jobs: list[tuple[str, str]] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        head = stripped.split(None, 1)[0]
        if "=" in head and head.split("=", 1)[0].isidentifier():
            name, value = stripped.split("=", 1)
            variables[name.strip()] = value.strip()
            continue
        fields = stripped.split(None, 5)
        assert len(fields) == 6, f"not a crontab job line: {line!r}"
        jobs.append((" ".join(fields[:5]), fields[5]))
    assert len(jobs) == 1, f"expected one job line, found {jobs}"
    return Crontab(variables, *jobs[0])


def cron_environment(crontab: Crontab, child_env: dict[str, str]) -> dict[str, str]:
    """What cron gives the command: almost nothing, plus the crontab's variables. The
    database URL (and this test run's id) stand for what the project's settings read."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(Path.home()),
        "LOGNAME": getpass.getuser(),
        **crontab.variables,
    }
    passed = {
        k: v for k, v in child_env.items() if k.startswith(("DATABASE_URL", "FENCEDJOBS_TEST"))
    }
    env.update(passed)
    return env


def test_the_crontab_ticks_runjobs_once_every_minute_without_flock() -> None:
    crontab = parse_crontab((DEPLOY / "crontab").read_text())
    assert crontab.schedule == "* * * * *"
    argv = shlex.split(crontab.command)
    assert argv[argv.index("$PYTHON") :] == [
        "$PYTHON",
        "-m",
        "django",
        "runjobs",
        "--once",
        "-v",
        "0",
    ], "errors only: cron mails whatever the command prints"
    assert "flock" not in crontab.command
    assert {"APP_DIR", "PYTHON", "DJANGO_SETTINGS_MODULE"} <= set(crontab.variables)


@pytest.mark.django_db(transaction=True)
def test_the_crontab_line_runs_and_overlapping_passes_run_a_slot_once(
    child_env: dict[str, str], tmp_path: Path
) -> None:
    crontab = parse_crontab(substituted((DEPLOY / "crontab").read_text(), tmp_path))
    env = cron_environment(crontab, child_env)

    def start(**extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["/bin/sh", "-c", crontab.command],
            env={**env, **extra},
            cwd="/",
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def finish(process: subprocess.Popen[str]) -> None:
        output, _ = process.communicate(timeout=STARTUP_WAIT)
        assert process.returncode == 0, output
        assert output == "", "runjobs --once should be silent when all is well"

    # The first pass creates the job's lease row; its first slot is months away.
    finish(start())
    lease = JobLease.objects.get(name=PROBE)
    assert not JobRun.objects.filter(job=PROBE).exists()

    # The slot comes due. Two passes overlap (the first holds the lease for 2 s):
    # the slot runs once, and both exit 0.
    slot = lease.next_run_at.replace(year=lease.next_run_at.year - 1)  # the previous slot
    JobLease.objects.filter(name=PROBE).update(next_run_at=slot)
    passes = [start(FENCEDJOBS_PROBE_SLEEP="2"), start(FENCEDJOBS_PROBE_SLEEP="2")]
    for process in passes:
        finish(process)
    run = JobRun.objects.get(job=PROBE)
    assert (run.scheduled_for, run.outcome) == (slot, Outcome.SUCCEEDED)
    assert Write.objects.filter(job=PROBE).count() == 1


# -- the loop under systemd, supervisor, Kubernetes -------------------------------------------


@dataclass
class LoopRecipe:
    argv: list[str]
    cwd: str
    env: dict[str, str]
    stop_signal: signal.Signals
    stop_timeout: float


def systemd_loop(tmp_path: Path) -> LoopRecipe:
    service = read_unit(recipe("systemd/fencedjobs.service", tmp_path))["Service"]
    assert service["Type"] == "exec"
    assert service["KillMode"] == "mixed"
    assert service["Restart"] == "always"
    env = dict(item.split("=", 1) for item in shlex.split(service["Environment"]))
    return LoopRecipe(
        shlex.split(service["ExecStart"]),
        service["WorkingDirectory"],
        env,
        signal.Signals[service["KillSignal"]],
        systemd_seconds(service["TimeoutStopSec"]),
    )


def supervisor_loop(tmp_path: Path) -> LoopRecipe:
    (program,) = supervisor_programs(tmp_path)
    assert program.name == "fencedjobs"
    assert (program.autostart, program.killasgroup, program.stopasgroup) == (True, True, False)
    return LoopRecipe(
        shlex.split(program.command),
        program.directory,
        dict(program.environment),
        signal.Signals(program.stopsignal),
        float(program.stopwaitsecs),
    )


def kubernetes_loop(tmp_path: Path) -> LoopRecipe:
    deployment = load_yaml("kubernetes/deployment.yaml")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    argv = list(container["command"])
    assert argv[0] == "python"
    return LoopRecipe(
        [sys.executable, *argv[1:]],
        str(REPO),  # the image's working directory
        {e["name"]: substituted(e["value"], tmp_path) for e in container["env"]},
        signal.SIGTERM,  # what the kubelet sends
        float(pod["terminationGracePeriodSeconds"]),
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("load", [systemd_loop, supervisor_loop, kubernetes_loop])
def test_the_loop_recipe_starts_runjobs_and_its_stop_signal_stops_it_cleanly(
    load: Any, child_env: dict[str, str], tmp_path: Path
) -> None:
    loop = load(tmp_path)
    assert loop.argv[1:] == ["-m", "django", "runjobs"]
    assert loop.stop_signal == signal.SIGTERM
    assert loop.stop_timeout == STOP_TIMEOUT
    process = subprocess.Popen(
        loop.argv,
        cwd=loop.cwd,
        env={**child_env, **loop.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + STARTUP_WAIT
        while not JobLease.objects.filter(name=PROBE).exists():
            assert process.poll() is None, process.communicate()[0]
            assert time.monotonic() < deadline, "the loop did not take up its jobs"
            time.sleep(0.1)
        process.send_signal(loop.stop_signal)
        output, _ = process.communicate(timeout=min(loop.stop_timeout, STARTUP_WAIT))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, output


# -- systemd ---------------------------------------------------------------------------------


def test_the_systemd_units_have_the_expected_keys(tmp_path: Path) -> None:
    loop = read_unit(recipe("systemd/fencedjobs.service", tmp_path))
    once = read_unit(recipe("systemd/fencedjobs-once.service", tmp_path))
    timer = read_unit(recipe("systemd/fencedjobs-once.timer", tmp_path))

    assert shlex.split(loop["Service"]["ExecStart"])[1:] == ["-m", "django", "runjobs"]
    assert loop["Service"]["KillSignal"] == "SIGTERM"
    assert systemd_seconds(loop["Service"]["TimeoutStopSec"]) == STOP_TIMEOUT
    assert loop["Install"]["WantedBy"] == "multi-user.target"

    service = once["Service"]
    assert service["Type"] == "oneshot"
    assert shlex.split(service["ExecStart"])[1:] == ["-m", "django", "runjobs", "--once"]
    assert service["KillSignal"] == "SIGTERM"
    assert systemd_seconds(service["TimeoutStopSec"]) == STOP_TIMEOUT
    assert systemd_seconds(service["TimeoutStartSec"]) > LONGEST_JOB_TIMEOUT
    assert "Install" not in once, "the timer starts the one-pass service, not a target"

    assert timer["Timer"]["OnCalendar"] == "*-*-* *:*:00"
    assert timer["Timer"]["Unit"] == "fencedjobs-once.service"
    assert "Persistent" not in timer["Timer"], "the app catches up on missed slots itself"
    assert timer["Install"]["WantedBy"] == "timers.target"


def test_the_systemd_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    assert shutil.which("systemd-analyze"), (
        "systemd-analyze is missing: install the Debian package systemd to verify the units"
    )
    units = [
        recipe(name, tmp_path)
        for name in (
            "systemd/fencedjobs.service",
            "systemd/fencedjobs-once.service",
            "systemd/fencedjobs-once.timer",
        )
    ]
    result = subprocess.run(
        ["systemd-analyze", "verify", *map(str, units)],
        capture_output=True,
        text=True,
        env={**os.environ, "SYSTEMD_LOG_LEVEL": "notice"},
    )
    assert result.returncode == 0, result.stderr
    # Unknown keys and bad values are only warnings: the units must produce none.
    complaints = [line for line in result.stderr.splitlines() if "fencedjobs" in line]
    assert complaints == [], result.stderr


# -- supervisor ------------------------------------------------------------------------------


def supervisor_programs(tmp_path: Path) -> list[Any]:
    """The program configs supervisord builds from the recipe, included from a minimal
    supervisord.conf, as ``supervisord -c`` would at start-up."""
    from supervisor.options import ServerOptions

    program = recipe("supervisor/fencedjobs.conf", tmp_path)
    program.write_text(program.read_text().replace("user=fencedjobs", f"user={getpass.getuser()}"))
    main = tmp_path / "supervisord.conf"
    main.write_text(
        "[supervisord]\n"
        f"logfile={tmp_path}/supervisord.log\n"
        f"pidfile={tmp_path}/supervisord.pid\n"
        "[include]\n"
        f"files={program}\n"
    )
    options = ServerOptions()
    options.realize(args=["-c", str(main)])
    return [config for group in options.process_group_configs for config in group.process_configs]


def test_supervisor_reads_every_key_of_the_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from supervisor.options import UnhosedConfigParser

    read: set[tuple[str, str]] = set()
    saneget = UnhosedConfigParser.saneget

    def recording(self: Any, section: str, option: str, *args: Any, **kwargs: Any) -> Any:
        read.add((section, option))
        return saneget(self, section, option, *args, **kwargs)

    monkeypatch.setattr(UnhosedConfigParser, "saneget", recording)
    (program,) = supervisor_programs(tmp_path)
    written = configparser.ConfigParser(interpolation=None)
    written.read(DEPLOY / "supervisor" / "fencedjobs.conf")
    assert written.sections() == ["program:fencedjobs"]
    section = "program:fencedjobs"
    unread = {key for key in written[section] if (section, key) not in read}
    assert unread == set(), f"keys supervisor ignores (typos?): {sorted(unread)}"
    assert program.stopwaitsecs == STOP_TIMEOUT
    assert program.stdout_logfile == str(tmp_path / "fencedjobs.log")


# -- Kubernetes ------------------------------------------------------------------------------

#: The fields of the API objects the manifests set (batch/v1 CronJobSpec and JobSpec,
#: apps/v1 DeploymentSpec): a misspelt field is silently dropped by a lenient apply.
CRONJOB_SPEC = {
    "schedule", "timeZone", "startingDeadlineSeconds", "concurrencyPolicy", "suspend",
    "jobTemplate", "successfulJobsHistoryLimit", "failedJobsHistoryLimit",
}  # fmt: skip
JOB_SPEC = {
    "parallelism", "completions", "activeDeadlineSeconds", "podFailurePolicy", "successPolicy",
    "backoffLimit", "backoffLimitPerIndex", "maxFailedIndexes", "selector", "manualSelector",
    "template", "ttlSecondsAfterFinished", "completionMode", "suspend", "podReplacementPolicy",
    "managedBy",
}  # fmt: skip
DEPLOYMENT_SPEC = {
    "replicas", "selector", "template", "strategy", "minReadySeconds", "revisionHistoryLimit",
    "paused", "progressDeadlineSeconds",
}  # fmt: skip


def test_the_cronjob_ticks_runjobs_once_and_leaves_the_zone_to_the_app() -> None:
    cronjob = load_yaml("kubernetes/cronjob.yaml")
    assert (cronjob["apiVersion"], cronjob["kind"]) == ("batch/v1", "CronJob")
    spec = cronjob["spec"]
    assert set(spec) <= CRONJOB_SPEC
    assert spec["schedule"] == "* * * * *"
    assert spec["concurrencyPolicy"] == "Forbid"
    # Long enough for the controller (it looks every 10 s), shorter than the next tick.
    assert 10 <= spec["startingDeadlineSeconds"] < 60
    assert "timeZone" not in spec, "the app's schedules are authoritative"

    job = spec["jobTemplate"]["spec"]
    assert set(job) <= JOB_SPEC
    assert job["backoffLimit"] == 0
    assert LONGEST_JOB_TIMEOUT < job["activeDeadlineSeconds"] <= 2 * LONGEST_JOB_TIMEOUT
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["terminationGracePeriodSeconds"] == STOP_TIMEOUT
    (container,) = pod["containers"]
    assert container["command"] == ["python", "-m", "django", "runjobs", "--once"]
    once = read_unit(DEPLOY / "systemd" / "fencedjobs-once.service")["Service"]
    assert job["activeDeadlineSeconds"] == systemd_seconds(once["TimeoutStartSec"])


def test_the_deployment_runs_the_loop_with_a_grace_period_for_sigterm() -> None:
    deployment = load_yaml("kubernetes/deployment.yaml")
    assert (deployment["apiVersion"], deployment["kind"]) == ("apps/v1", "Deployment")
    spec = deployment["spec"]
    assert set(spec) <= DEPLOYMENT_SPEC
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    pod = spec["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == STOP_TIMEOUT
    (container,) = pod["containers"]
    assert container["command"] == ["python", "-m", "django", "runjobs"]
