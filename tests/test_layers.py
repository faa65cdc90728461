"""The packages' layering, read from the code's own imports: no cycles, and no import against the layers.

engine/ stands alone; probes/ observes the engine; reports/ reads run directories (probes' records);
loadtests/ drives all of them, and its cli.py, the one ``servescope`` main, is the top floor; studies/
(scripts that measure) may use everything and nothing uses them. Inside reports/ and loadtests/ each
folder is one feature, on a floor of its own: a folder imports only folders below it, and no two
rooms (a folder, or a module at the package's top) import each other in a circle. Every import
counts, including those inside functions.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "probes", "loadtests", "reports", "studies")
# package -> the project packages it must never import
FORBIDDEN = {
    "engine": {"probes", "loadtests", "reports", "studies"},
    "probes": {"loadtests", "reports", "studies"},
    "reports": {"engine", "loadtests", "studies"},
    "loadtests": {"studies"},
    "studies": set(),
}
# The folders of a package, from the ground up: a module in one imports nothing from a folder above it.
FLOORS = {
    "reports": ("reports.capacity", "reports.levers", "reports.verdict", "reports.html", "reports.gate"),
    "loadtests": ("loadtests.workloads", "loadtests.client", "loadtests.run", "loadtests.gate", "loadtests.pytest_plugin"),
}
TOP_FLOOR = "loadtests.cli"


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _imported(node: ast.AST, module: str, is_package: bool, modules: dict[str, Path]) -> Iterator[str]:
    """The modules one import statement names: ``from a import b`` is ``a.b`` when that is a module, else ``a``."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            anchor = module.split(".")
            anchor = anchor if is_package else anchor[:-1]
            anchor = anchor[: len(anchor) - node.level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            yield submodule if submodule in modules else base


@cache  # NOTE: parsed once for every test here; none changes it
def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (``from a import b`` names ``a.b`` when that is a module)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets = set()
        for node in ast.walk(tree):
            for target in _imported(node, name, path.name == "__init__.py", modules):
                if target in modules and target != name:
                    targets.add(target)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def room(module: str) -> str:
    """The room a module stands in: its folder inside a package (``reports.verdict``), else itself."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else module


def room_graph(graph: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """room -> the rooms of ``package`` it imports (a folder counts as one room)."""
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        if module.split(".")[0] == package:
            rooms.setdefault(room(module), set()).update(
                room(t) for t in targets if t.split(".")[0] == package and room(t) != room(module))
    return rooms


def test_the_graph_sees_the_imports_it_must() -> None:
    graph = import_graph()
    assert "engine.flags" in graph["engine.cli"]
    assert "probes.run_dir" in graph["reports.dataset"]
    assert "reports" in graph["loadtests.run.finish"]  # a package's __init__ counts as a module


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_cycles_are_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_package_imports_against_the_layers() -> None:
    wrong = [f"{module} imports {target}" for module, targets in import_graph().items() for target in targets
             if target.split(".")[0] in FORBIDDEN[module.split(".")[0]]]
    assert wrong == []


def test_a_folder_imports_no_folder_above_it() -> None:
    wrong = []
    for module, targets in import_graph().items():
        floors = FLOORS.get(module.split(".")[0], ())
        if room(module) not in floors:
            continue
        wrong += [f"{module} imports {target}" for target in targets
                  if room(target) in floors and floors.index(room(target)) > floors.index(room(module))]
    assert wrong == []


def test_no_rooms_import_each_other_in_a_circle() -> None:
    for package in FLOORS:
        assert cycles(room_graph(import_graph(), package)) == [], package


def test_nothing_imports_the_command_line() -> None:
    assert [module for module, targets in import_graph().items() if TOP_FLOOR in targets] == []


def test_the_room_checks_see_what_they_must() -> None:
    graph = import_graph()
    assert "reports.capacity" in room_graph(graph, "reports")["reports.verdict"]
    assert room("reports.verdict.rules") == "reports.verdict" and room("reports.summary") == "reports.summary"
    assert cycles(room_graph({"x.a.m": {"x.b.n"}, "x.b.n": {"x.c"}, "x.c": {"x.a.o"}, "x.a.o": set()}, "x")) == [
        ["x.a", "x.b", "x.c"]]
