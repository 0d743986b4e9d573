"""The sdist and the wheel hold what they must, and nothing stray (run by ``make lint``).

    python scripts/check_dist.py DIR

DIR holds the ``*.tar.gz`` and the ``*.whl`` that ``python -m build --outdir DIR`` made
from this checkout. What they must hold is read from the source tree, not from the
packaging configuration, so that a pattern dropped from ``[tool.setuptools.package-data]``
or from MANIFEST.in is caught:

* the wheel: every file of the package (its modules, the migrations, the templates and
  static files, ``py.typed``) and LICENSE in its ``.dist-info/licenses``; nothing outside
  the package and its ``.dist-info``;
* the sdist: the same package files, ``pyproject.toml``, ``README.md``, ``LICENSE``,
  ``PKG-INFO``, and every file git tracks under what MANIFEST.in grafts or includes (the
  tests, the docs, ...);
* neither: a virtualenv, ``__pycache__`` or compiled Python, the caches of hypothesis,
  pytest, mypy and ruff, a database file, ``build/`` or ``dist/``.

Each problem is printed on a line of its own naming the file; the exit status is 1 if there
is any, 2 if DIR does not hold one sdist and one wheel.
"""

from __future__ import annotations

import fnmatch
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "django_fencedjobs"
#: Beside the package, what any sdist of this project holds.
SDIST_TOP = {"pyproject.toml", "README.md", "LICENSE", "PKG-INFO"}

STRAY_DIRS = {
    ".venv",
    "__pycache__",
    ".hypothesis",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".git",
    ".demo",
    "build",
    "dist",
}
STRAY_FILES = ["*.pyc", "*.pyo", "*.sqlite3", "*.sqlite3-*", "*.sqlite", "*.db", "*~", ".DS_Store"]


def stray(path: str) -> str | None:
    """Why ``path`` (relative, with /) has no place in a distribution; None if it has."""
    *dirs, name = PurePosixPath(path).parts
    for part in dirs:
        if part in STRAY_DIRS or part.startswith(".venv"):
            return f"inside {part}/"
    for pattern in STRAY_FILES:
        if fnmatch.fnmatch(name, pattern):
            return f"matches {pattern}"
    return None


def package_files(root: Path = REPO) -> set[str]:
    """Every file of the package in the source tree, but what is stray."""
    found = set()
    for path in (root / PACKAGE).rglob("*"):
        relative = path.relative_to(root).as_posix()
        if path.is_file() and stray(relative) is None:
            found.add(relative)
    return found


def source_files(root: Path = REPO) -> list[str]:
    """The files of the source tree: those git tracks (and that exist), or, outside a git
    checkout, every file but what is stray."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True
        ).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        paths = (p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
        return sorted(p for p in paths if stray(p) is None)
    return sorted(p for p in listed.split("\0") if p and (root / p).is_file())


def manifest(root: Path = REPO) -> tuple[set[str], tuple[str, ...]]:
    """What MANIFEST.in puts in the sdist: the files its ``include`` lines name and those
    under its ``graft`` lines, among the source tree's files; and the grafted folders."""
    path = root / "MANIFEST.in"
    if not path.exists():
        return set(), ()
    files = source_files(root)
    wanted: set[str] = set()
    grafted: list[str] = []
    for line in path.read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        command, args = words[0], words[1:]
        if command == "include":
            wanted.update(f for f in files for a in args if fnmatch.fnmatch(f, a))
        elif command == "graft":
            grafted += [a.rstrip("/") + "/" for a in args]
            wanted.update(f for f in files if f.startswith(tuple(grafted)))
    return wanted, tuple(grafted)


def compare(
    label: str, names: Iterable[str], expected: set[str], allowed: Callable[[str], bool]
) -> list[str]:
    """Problems of one distribution whose members (paths with /) are ``names``: what is
    expected and missing, what is stray, and what is neither expected nor ``allowed``."""
    present = set(names)
    problems = [f"{label}: missing {name}" for name in sorted(expected - present)]
    for name in sorted(present):
        why = stray(name)
        if why:
            problems.append(f"{label}: stray {name} ({why})")
        elif name not in expected and not allowed(name):
            problems.append(f"{label}: unexpected {name}")
    return problems


def check_wheel(wheel: Path, package: set[str]) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if not n.endswith("/")]
    dist_info = next((n.split("/")[0] for n in names if ".dist-info/" in n), "?.dist-info")
    expected = package | {f"{dist_info}/licenses/LICENSE"}
    return compare(f"wheel {wheel.name}", names, expected, lambda n: n.startswith(f"{dist_info}/"))


def check_sdist(sdist: Path, package: set[str], root: Path = REPO) -> list[str]:
    with tarfile.open(sdist) as archive:
        members = [m.name for m in archive.getmembers() if m.isfile()]
    top = members[0].split("/")[0] if members else "?"
    names = [m.removeprefix(f"{top}/") for m in members]
    listed, grafted = manifest(root)
    # setuptools adds its egg-info, setup.cfg and the manifest itself; a grafted folder
    # may hold files git does not track yet.
    extras = {"setup.cfg", "MANIFEST.in"}
    return compare(
        f"sdist {sdist.name}",
        names,
        package | SDIST_TOP | listed,
        lambda n: n in extras or n.startswith((f"{PACKAGE}.egg-info/", *grafted)),
    )


def check(directory: Path, root: Path = REPO) -> list[str]:
    wheels, sdists = sorted(directory.glob("*.whl")), sorted(directory.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        raise SystemExit(
            f"check_dist: {directory} must hold one wheel and one sdist "
            f"(found {len(wheels)} and {len(sdists)})"
        )
    package = package_files(root)
    return check_wheel(wheels[0], package) + check_sdist(sdists[0], package, root)


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] in {"-h", "--help"}:
        print(__doc__.split("\n\n")[1].strip())
        return 2
    directory = Path(argv[0])
    problems = check(directory)
    for problem in problems:
        print(problem)
    if problems:
        print(f"check_dist: {len(problems)} problem(s) in {directory}", file=sys.stderr)
        return 1
    print(f"check_dist: the sdist and the wheel in {directory} hold what they must")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
