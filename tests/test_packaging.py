"""The package as users get it: the wheel, its version, its typed public API, and an
exception for every failure, each importable and documented."""

from __future__ import annotations

import email
import importlib.util
import inspect
import io
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
from django.core.management import call_command

import django_fencedjobs
from django_fencedjobs import exceptions

REPO = Path(__file__).resolve().parent.parent
API_DOC = REPO / "docs" / "api.md"


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> tuple[zipfile.ZipFile, str]:
    """A wheel built by pip from a copy of the sources (no build/ left in the checkout),
    and what the build printed."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(
        REPO / "django_fencedjobs",
        source / "django_fencedjobs",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out), "."],
        cwd=source,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    (built,) = out.glob("*.whl")
    return zipfile.ZipFile(built), result.stdout + result.stderr


@pytest.fixture(scope="module")
def wheel(build: tuple[zipfile.ZipFile, str]) -> zipfile.ZipFile:
    return build[0]


def wheel_metadata(wheel: zipfile.ZipFile) -> email.message.Message:
    (metadata_name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return email.message_from_bytes(wheel.read(metadata_name))


def check_dist() -> ModuleType:
    """scripts/check_dist.py, which ``make lint`` runs on the sdist and the wheel that
    ``python -m build`` makes: what a distribution must hold is written there only."""
    spec = importlib.util.spec_from_file_location("check_dist", REPO / "scripts" / "check_dist.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_wheel_holds_every_file_of_the_package_and_nothing_else(
    wheel: zipfile.ZipFile,
) -> None:
    checker = check_dist()
    expected = checker.package_files()
    assert {
        "django_fencedjobs/py.typed",
        "django_fencedjobs/migrations/0001_initial.py",
        "django_fencedjobs/static/fencedjobs/admin.css",
    } <= expected
    assert any(n.startswith("django_fencedjobs/templates/") for n in expected)
    assert checker.check_wheel(Path(wheel.filename or ""), expected) == []


def test_the_distribution_check_names_a_missing_file_and_a_stray_one(
    wheel: zipfile.ZipFile, tmp_path: Path
) -> None:
    """A wheel without the admin's stylesheet (a pattern dropped from the package data),
    and with a compiled module left in: each is one line naming the file."""
    broken = tmp_path / Path(wheel.filename or "").name
    with zipfile.ZipFile(broken, "w") as out:
        for name in wheel.namelist():
            if name != "django_fencedjobs/static/fencedjobs/admin.css":
                out.writestr(name, wheel.read(name))
        out.writestr("django_fencedjobs/__pycache__/lease.cpython-311.pyc", b"")
    checker = check_dist()
    assert checker.check_wheel(broken, checker.package_files()) == [
        f"wheel {broken.name}: missing django_fencedjobs/static/fencedjobs/admin.css",
        f"wheel {broken.name}: stray django_fencedjobs/__pycache__/lease.cpython-311.pyc "
        "(inside __pycache__/)",
    ]


def test_the_wheel_carries_the_one_version_and_the_extras(wheel: zipfile.ZipFile) -> None:
    version = django_fencedjobs.__version__
    assert Path(wheel.filename or "").name.startswith(f"django_fencedjobs-{version}-")
    metadata = wheel_metadata(wheel)
    assert metadata["Version"] == version
    assert metadata["Requires-Python"] == ">=3.11"
    assert {"postgres", "sentry", "prometheus", "tasks", "holidays"} <= set(
        metadata.get_all("Provides-Extra") or []
    )
    requires = metadata.get_all("Requires-Dist") or []
    assert any(r.startswith("django-tasks-db") and 'extra == "tasks"' in r for r in requires)
    assert "Typing :: Typed" in (metadata.get_all("Classifier") or [])


def test_the_license_is_an_spdx_expression_shipped_with_its_file(wheel: zipfile.ZipFile) -> None:
    metadata = wheel_metadata(wheel)
    assert metadata["License-Expression"] == "BSD-3-Clause"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert not [c for c in metadata.get_all("Classifier") or [] if c.startswith("License ::")]
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in wheel.namelist())


def test_building_the_package_warns_of_nothing(build: tuple[zipfile.ZipFile, str]) -> None:
    """setuptools deprecates the ``project.license`` table and license classifiers (PEP
    639): what ``make demo`` and every ``pip install -e .`` print, unless fixed."""
    output = build[1]
    warnings = [line for line in output.splitlines() if "warn" in line.lower()]
    assert warnings == [], output


@pytest.mark.django_db
def test_every_model_change_has_its_migration() -> None:
    """``manage.py makemigrations --check --dry-run``: the shipped migrations describe the
    models as they are, so no user's ``makemigrations`` ever writes one into the package."""
    out = io.StringIO()
    try:
        call_command("makemigrations", "fencedjobs", check=True, dry_run=True, stdout=out)
    except SystemExit:
        pytest.fail(f"a migration is missing:\n{out.getvalue()}")
    assert "No changes detected" in out.getvalue()


def test_the_version_is_written_in_one_place() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert project["project"]["dynamic"] == ["version"]
    dynamic = project["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "django_fencedjobs.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?", django_fencedjobs.__version__)
    changelog = (REPO / "CHANGELOG.md").read_text()
    (latest,) = re.findall(r"^## (\S+)", changelog, flags=re.MULTILINE)[:1]
    assert latest == django_fencedjobs.__version__


def public_exceptions() -> list[type[Exception]]:
    return [
        value
        for value in vars(exceptions).values()
        if inspect.isclass(value) and issubclass(value, exceptions.FencedJobsError)
    ]


@pytest.mark.parametrize("exc", public_exceptions(), ids=lambda exc: exc.__name__)
def test_every_exception_is_exported_documented_and_says_what_to_do(
    exc: type[exceptions.FencedJobsError],
) -> None:
    assert getattr(django_fencedjobs, exc.__name__) is exc
    assert exc.__name__ in django_fencedjobs.__all__
    assert f"| `{exc.__name__}` |" in API_DOC.read_text(), "a row in docs/api.md's table"
    assert str(exc()) == " ".join((exc.__doc__ or "").split()), "the docstring, on one line"
    assert len(str(exc())) > 20


def test_every_public_name_is_in_the_api_reference() -> None:
    doc = API_DOC.read_text()
    missing = [name for name in django_fencedjobs.__all__ if f"`{name}`" not in doc]
    assert missing == []


TYPED_USE = """
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import assert_type

from django_fencedjobs import Job, Run, Schedule, Window, __version__, fenced_atomic, job


@job("*/15 * * * *", name="typing.sync", timezone="Europe/Berlin", jitter=timedelta(minutes=3))
def sync(run: Run) -> None:
    assert_type(run.fence, int)
    assert_type(run.scheduled_for, datetime)
    assert_type(run.stopping, bool)
    for window in run.windows(step=timedelta(hours=1)):
        assert_type(window, Window)
        with fenced_atomic():
            run.advance_watermark(window.end)
            run.add_items(1)


@fenced_atomic
def write(n: int) -> int:
    return n


@fenced_atomic(using="default")
def write_to(n: int) -> str:
    return str(n)


handler: Callable[[Run], None] = sync
assert_type(write(1), int)
assert_type(write_to(1), str)
assert_type(Schedule("0 9 * * 1-5", timezone="Europe/Berlin").next_after(datetime.now()), datetime)
assert_type(__version__, str)
declared: Job = sync.job  # type: ignore[attr-defined]
"""

MISTYPED_USE = """
from datetime import timedelta

from django_fencedjobs import Run, Schedule, job


@job("*/15 * * * *", every=5)
def wrong_every(run: Run) -> None: ...


@job("*/15 * * * *", timeout=600)
def wrong_timeout(run: Run) -> None: ...


@job("*/15 * * * *", exclusion="redis")
def wrong_exclusion(run: Run) -> None: ...


Schedule(every=timedelta(minutes=5)).next_after("2026-01-01")


@job("*/15 * * * *")
def fine(run: Run) -> None: ...


fine(1)  # @job keeps the function's own signature
"""


def mypy(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    module = tmp_path / "use_fencedjobs.py"
    module.write_text(source)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--follow-imports=silent",
            "--no-incremental",
            "--config-file=",
            str(module),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )


def test_code_using_the_public_api_type_checks_strictly(tmp_path: Path) -> None:
    result = mypy(tmp_path, TYPED_USE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mistyped_arguments_to_the_public_api_are_type_errors(tmp_path: Path) -> None:
    result = mypy(tmp_path, MISTYPED_USE)
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    lines = sorted({int(line.split(":")[1]) for line in errors})
    assert lines == [7, 11, 15, 19, 26], result.stdout
