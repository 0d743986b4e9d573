"""No module of the package imports another that imports it back, directly or through
others: the modules stay in layers, each readable without the ones above it.

Every import counts, wherever it is written: at the top, inside a function (deferred, it
still ties the two modules), under ``if TYPE_CHECKING:``. ``from django_fencedjobs import
x`` is an import of the module ``x`` when there is one, else of the package itself;
relative imports are resolved the same way. Read from the source with :mod:`ast`, nothing
is imported.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import django_fencedjobs

PACKAGE = Path(django_fencedjobs.__file__).resolve().parent
ROOT = "django_fencedjobs"

#: Cycles known and being removed, each as the set of its modules: the test passes with
#: them and fails on any other (or on one of these grown larger). None today.
EXPECTED: set[frozenset[str]] = set()


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """The package's modules that the module ``name`` (at ``path``) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield from _within(alias.name, known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                target = f"{base}.{alias.name}"
                yield from _within(target if target in known else base, known)


def _within(dotted: str, known: set[str]) -> Iterator[str]:
    """The longest prefix of ``dotted`` that is a module of the package, if any."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in known:
            yield candidate
            return


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {
        name: {target for target in imported(name, path, known) if target != name}
        for name, path in found.items()
    }


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each group of modules that import one another (strongly connected, Tarjan), as
    one cycle through all of them where there is one, else the group sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return [_path_through(group, edges) for group in groups]


def _path_through(group: set[str], edges: dict[str, set[str]]) -> list[str]:
    """A cycle from the group's first module back to it, by the shortest imports."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(edges[node] & group):
                if target == start:
                    return [*paths[node], start]
                if target not in paths:
                    paths[target] = [*paths[node], target]
                    following.append(target)
        frontier = following
    return sorted(group)


def test_no_module_imports_one_that_imports_it_back():
    found = cycles(graph())
    unexpected = [cycle for cycle in found if frozenset(cycle) not in EXPECTED]
    assert not unexpected, "import cycles:\n" + "\n".join(" -> ".join(c) for c in unexpected)


def test_the_graph_sees_imports_inside_functions_and_relative_ones(tmp_path):
    """The reader itself: a deferred import, a relative one and ``from package import
    module`` are all edges; an attribute of a module is an edge to the module."""
    edges = graph()
    # apps.ready() imports these inside the method.
    assert {f"{ROOT}.checks", f"{ROOT}.integrations.sentry"} <= edges[f"{ROOT}.apps"]
    # `from django_fencedjobs.registry import Job` is an import of the registry.
    assert f"{ROOT}.registry" in edges[f"{ROOT}.health"]
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from .sub import b\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("from .. import a\nfrom ..a import f\n")
    known = {"pkg", "pkg.a", "pkg.sub", "pkg.sub.b"}
    assert set(imported("pkg.a", package / "a.py", known)) == {"pkg.sub.b"}
    assert set(imported("pkg.sub.b", package / "sub" / "b.py", known)) == {"pkg.a"}
    assert cycles({"pkg.a": {"pkg.sub.b"}, "pkg.sub.b": {"pkg.a"}}) == [
        ["pkg.a", "pkg.sub.b", "pkg.a"]
    ]


# -- the layers docs/internals.md states -------------------------------------------------------

INTERNALS = PACKAGE.parent / "docs" / "internals.md"
#: Imports that run back up the layers on purpose, each with its reason (docs/internals.md).
UPWARD = {
    (f"{ROOT}.run", f"{ROOT}.integrations.tasks"): "Run.enqueue hands its task to django.tasks",
}


def layers() -> list[tuple[str, list[str]]]:
    """The table under "Modules by layer": each layer's name and its modules, as written
    (``lease.py``, ``admin/*``), first layer first."""
    text = INTERNALS.read_text()
    table = text.split("## Modules by layer", 1)[1].split("\n\n|", 1)[1].split("\n\n", 1)[0]
    found = []
    for line in ("|" + table).splitlines()[2:]:
        name, modules, _ = (cell.strip() for cell in line.strip("|").split("|"))
        found.append((name, re.findall(r"`([^`]+)`", modules)))
    return found


def layer_of(module: str, table: list[tuple[str, list[str]]]) -> int | None:
    relative = module.removeprefix(f"{ROOT}.").replace(".", "/")
    for index, (_, patterns) in enumerate(table):
        for pattern in patterns:
            if pattern.endswith("/*") and (relative + "/").startswith(pattern[:-1]):
                return index  # a module of the folder, or its package
            if relative + ".py" == pattern:
                return index
    return None


def test_every_module_is_in_a_layer_of_docs_internals():
    table = layers()
    assert [name for name, _ in table][:2] == ["facts, Django-free", "configuration"]
    placed = [m for m in modules() if m != ROOT and ".migrations" not in m]
    missing = [m for m in placed if m != f"{ROOT}.management" and layer_of(m, table) is None]
    assert not missing, f"modules in no layer of {INTERNALS.name}: {missing}"


def test_no_module_imports_from_a_layer_below_its_own():
    table = layers()
    wrong = []
    for module, targets in graph().items():
        own = layer_of(module, table)
        for target in targets:
            theirs = layer_of(target, table)
            if own is None or theirs is None or theirs <= own or (module, target) in UPWARD:
                continue
            wrong.append(f"{module} ({table[own][0]}) imports {target} ({table[theirs][0]})")
    assert not wrong, "imports running back down the layers:\n" + "\n".join(wrong)


# -- one seam between the app and its databases --------------------------------------------

#: The modules that may ask which database they talk to: the statements that decide
#: exclusion, spelled once per database (``lease``), and every other difference (``db``).
DATABASE_SEAM = {f"{ROOT}.db", f"{ROOT}.lease"}


def vendor_reads(path: Path) -> list[int]:
    """The lines of ``path`` that read a connection's ``vendor`` to decide something (naming
    it in a message, inside an f-string, decides nothing)."""
    tree = ast.parse(path.read_text(), str(path))
    named = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.FormattedValue) and isinstance(node.value, ast.Attribute)
    }
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "vendor" and id(node) not in named
    ]


def test_only_the_store_and_db_ask_which_database_they_talk_to():
    found = {
        name: lines
        for name, path in modules().items()
        if name not in DATABASE_SEAM and ".migrations" not in name
        for lines in [vendor_reads(path)]
        if lines
    }
    assert not found, f"modules that branch on connection.vendor outside db and lease: {found}"
    # The reader sees a branch, and passes over a name in a message.
    assert vendor_reads(PACKAGE / "db.py")
    assert not vendor_reads(PACKAGE / "registry.py")
