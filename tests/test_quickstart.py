"""docs/quickstart.md, followed to the letter in a new project, shows what it says it shows.

The test reads the quickstart and does what a new user does with it:

* each ```sh block is typed in, line by line: ``django-admin`` and ``python manage.py``
  commands run (each must exit 0), ``cd`` changes directory, ``pip install`` is skipped
  (the package is installed in this environment already);
* a ```text block right after an ```sh block is what its last command prints (stdout and
  stderr together): the test compares it line by line, with the numbers that change from
  one run to the next (dates, times, durations, counters) masked and runs of spaces
  collapsed;
* a ```python block whose first line is ``# path`` is written to that path; for a
  ``settings.py`` it is added at the end of the settings module, and a list written
  ``[..., "x"]`` extends the list the settings already have.

``python manage.py runjobs`` (the loop) is started, and stopped with SIGINT (Ctrl-C) once
it has printed as many lines as the quickstart shows, less the last one, which the
signal prints.

The project uses its own SQLite file, whatever database the suite runs on: marked
``system``, so that ``make test`` runs it once per Django version (the PostgreSQL and
matrix passes), not again in the SQLite pass.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "docs" / "quickstart.md"
#: The quickstart's whole sequence must not reach a slot of its job: a slot that comes
#: due between two commands would run, and print what the quickstart does not show.
SLOT_MARGIN = 30

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]


@dataclass
class Block:
    lang: str
    lines: list[str]


@dataclass
class Step:
    """One command typed in, and the output the quickstart shows for it (None: not shown)."""

    argv: list[str]
    shown: list[str] | None = None


@dataclass
class Walkthrough:
    """What the quickstart has the user do, in order: a command (:class:`Step`), a ``cd``
    (``str``), or a file to write (``(path, text)``; ``("settings", code)`` to add to the
    settings module)."""

    steps: list[Step | str | tuple[str, str]] = field(default_factory=list)


def blocks(markdown: str) -> list[Block]:
    found = []
    for match in re.finditer(r"^```(\w*)\n(.*?)^```\s*$", markdown, flags=re.M | re.S):
        found.append(Block(match.group(1), match.group(2).splitlines()))
    return found


def settings_fragment(source: str) -> str:
    """A settings fragment as code to append: ``NAME = [..., "x"]`` extends ``NAME``."""

    def is_ellipsis(node: ast.expr) -> bool:
        return isinstance(node, ast.Constant) and node.value is Ellipsis

    out = []
    tree = ast.parse(source)
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.List)
            and any(map(is_ellipsis, node.value.elts))
        ):
            (target,) = node.targets
            assert isinstance(target, ast.Name)
            rest = [e for e in node.value.elts if not is_ellipsis(e)]
            node.value.elts = [ast.Starred(ast.Name(target.id, ast.Load()), ast.Load()), *rest]
            out.append(ast.unparse(node))
        else:
            out.append(ast.get_source_segment(source, node) or "")
    return "\n".join(out)


def walkthrough() -> Walkthrough:
    text = QUICKSTART.read_text()
    walk = Walkthrough()
    previous: Block | None = None
    for block in blocks(text):
        if block.lang == "python":
            head = block.lines[0]
            assert head.startswith("# "), f"a python block must start with its path: {head!r}"
            path = head[2:].strip()
            body = "\n".join(block.lines[1:]) + "\n"
            if path.endswith("settings.py"):
                walk.steps.append(("settings", settings_fragment(body)))
            else:
                walk.steps.append((path, body))
        elif block.lang == "sh":
            for line in block.lines:
                command = line.split("  #")[0].strip()
                if not command or command.startswith("#") or command.startswith("pip "):
                    continue
                if command.startswith("cd "):
                    walk.steps.append(command)
                    continue
                argv = shlex.split(command)
                assert argv[0] in ("django-admin", "python"), f"not a command to type: {line!r}"
                walk.steps.append(Step(argv))
        elif block.lang == "text" and previous is not None and previous.lang == "sh":
            step = walk.steps[-1]
            assert isinstance(step, Step), "a text block follows the command it shows"
            step.shown = block.lines
        previous = block
    return walk


def mask(line: str) -> str:
    """The line without what changes from run to run."""
    # A time, with its date and zone or not (checkjobs leaves them out on the same day),
    # or a wait ("0:04:31", "2 days, 1:00:00").
    line = re.sub(
        r"(\d+ days?, |\b\d{4}-\d\d-\d\d )?\b\d+:\d\d(:\d\d)?(\.\d+)?( UTC\b)?", "T", line
    )
    line = re.sub(r"\d+(\.\d+)?", "N", line)
    return " ".join(line.split())


def environment() -> dict[str, str]:
    """A user's shell: none of the test suite's settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "DATABASE_URL", "FENCEDJOBS_", "PYTHONPATH"))
    }
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def argv_of(step: Step) -> list[str]:
    if step.argv[0] == "django-admin":
        return [sys.executable, "-m", "django", *step.argv[1:]]
    return [sys.executable, *step.argv[1:]]


def is_loop(step: Step) -> bool:
    args = step.argv[1:]
    return args[:2] == ["manage.py", "runjobs"] and not {"--once", "--list", "--now"} & set(args)


def run_loop(step: Step, cwd: Path, env: dict[str, str]) -> tuple[int, list[str]]:
    """Start the loop, wait for the lines the quickstart shows before Ctrl-C, send SIGINT."""
    process = subprocess.Popen(
        argv_of(step),
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout or []), daemon=True)
    reader.start()
    expected = len(step.shown or []) - 1
    deadline = time.monotonic() + 60
    while len(lines) < expected and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.1)
    time.sleep(1)  # anything it would print next, unshown, would show up in the comparison
    process.send_signal(signal.SIGINT)
    process.wait(timeout=60)
    reader.join(timeout=10)
    return process.returncode, [line.rstrip("\n") for line in lines]


def wait_past_a_near_slot(listing: str) -> None:
    """``runjobs --list`` shows the next fire times: if the first comes within the margin,
    let it pass (before the job's row exists, so it does not count as due)."""
    match = re.search(r"next: (?:.* = )?(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC", listing)
    assert match, listing
    first = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    wait = (first - datetime.now(UTC)).total_seconds()
    if wait < SLOT_MARGIN:
        time.sleep(max(wait, 0) + 1)


def test_the_quickstart_followed_to_the_letter_shows_what_it_says(tmp_path):
    walk = walkthrough()
    env = environment()
    cwd = tmp_path
    ran = []
    for step in walk.steps:
        if isinstance(step, str):
            cwd = cwd / step.split(None, 1)[1]
            continue
        if isinstance(step, tuple):
            path, body = step
            if path == "settings":
                (settings,) = [p for p in cwd.glob("*/settings.py")]
                settings.write_text(settings.read_text() + "\n" + body + "\n")
            else:
                target = cwd / path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(body)
            continue
        if step.argv[1:3] == ["manage.py", "migrate"]:
            listing = subprocess.run(
                [sys.executable, "manage.py", "runjobs", "--list"],
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert listing.returncode == 0, listing.stderr
            wait_past_a_near_slot(listing.stdout)
        if is_loop(step):
            returncode, output = run_loop(step, cwd, env)
        else:
            result = subprocess.run(
                argv_of(step),
                cwd=cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=120,
            )
            returncode, output = result.returncode, result.stdout.splitlines()
        command = " ".join(step.argv)
        ran.append(command)
        assert returncode == 0, f"{command} exited {returncode}:\n" + "\n".join(output)
        if step.shown is not None:
            assert sorted(map(mask, output)) == sorted(map(mask, step.shown)), (
                f"`{command}` printed:\n" + "\n".join(output)
            )
    # The quickstart shows each of these, and what it prints.
    shown = {" ".join(s.argv) for s in walk.steps if isinstance(s, Step) and s.shown}
    for command in (
        "python manage.py check",
        "python manage.py runjobs --once",
        "python manage.py checkjobs",
        "python manage.py runjobs",
    ):
        assert command in shown, f"the quickstart does not show what `{command}` prints"
    assert any(c.startswith("python manage.py runjobs --now ") for c in shown), ran
    assert any(c.startswith("django-admin startproject ") for c in ran), ran
