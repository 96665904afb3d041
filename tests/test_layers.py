"""The package's layers: nothing reaches back up.

framework-free core (trace, metrics, pipeline, mesh, ...) -> framework runtime and comm
-> strategies (parlab.torch.*, parlab.tf.*) -> launcher -> lab-facing helpers (exercises,
course, bench). A strategy says what one rank does; it never starts ranks or checks
exercises. Every import is checked, including those inside functions, and no two
modules import each other, even lazily (a circle: neither can be read without the
other). No module grows past MAX_LINES: split it along a seam it has.
"""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "parlab"

CORE = {"trace", "metrics", "pipeline", "pipeline_orders", "split", "mesh", "data", "errors", "plot", "sim",
        "processes", "zero", "steps", "spans", "recorders", "timeline", "progress", "nodes"}
MAX_LINES = 500
ABOVE_STRATEGIES = {"parlab.launcher", "parlab._worker", "parlab.exercises",
                    "parlab.experiments", "parlab.widgets", "parlab.bench", "parlab.__main__",
                    "parlab.course", "parlab.starting", "parlab.restarts",
                    "parlab.two_nodes"}
FRAMEWORKS = ("torch", "tensorflow", "keras", "parlab.torch", "parlab.tf")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, relative imports resolved, at any depth of the code."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)  # `from . import comm`
    return found


def _within(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


STRATEGY_FILES = sorted([*PACKAGE.glob("torch/*.py"), *PACKAGE.glob("tf/*.py")])


@pytest.mark.parametrize("path", STRATEGY_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_strategies_never_import_the_launcher_or_the_lab_helpers(path):
    above = {m for m in imports_of(path) if _within(m, ABOVE_STRATEGIES)}
    assert not above, (f"{path.relative_to(PACKAGE.parent)} imports {sorted(above)}: starting "
                       "ranks and checking exercises belong in parlab.experiments / "
                       "parlab.exercises, above the strategies")


@pytest.mark.parametrize("name", sorted(CORE))
def test_the_core_imports_no_framework_and_nothing_above_it(name):
    paths = ([PACKAGE / f"{name}.py"] if (PACKAGE / f"{name}.py").exists()
             else sorted((PACKAGE / name).glob("*.py")))      # a core package (sim/)
    assert paths, f"no module parlab/{name}"
    bad = {m for path in paths for m in imports_of(path)
           if _within(m, FRAMEWORKS) or _within(m, ABOVE_STRATEGIES)}
    assert not bad, f"parlab/{name}.py is framework-free core but imports {sorted(bad)}"


def test_the_checker_sees_relative_and_lazy_imports():
    # The imports a strategy would most likely plant: lazy, relative, or by name.
    planted = PACKAGE / "torch" / "_planted_for_test.py"
    planted.write_text("import parlab.bench\n"
                       "def go():\n    from ..launcher import launch\n"
                       "    from ..exercises import run_on_ranks\n    from . import comm\n")
    try:
        found = imports_of(planted)
    finally:
        planted.unlink()
    assert {"parlab.bench", "parlab.launcher", "parlab.exercises", "parlab.torch.comm"} <= found


def _module_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the parlab modules it imports, at any depth of its code. An import of a
    package that contains the importer is left out: Python imports it first anyway."""
    paths = {_module_name(p): p for p in package.rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        graph[name] = {m for m in imports_of(path)
                       if m in paths and m != name and not name.startswith(m + ".")}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan, 1972)."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_no_two_modules_import_each_other():
    circles = import_circles(_module_graph())
    assert not circles, ("modules that import each other (even inside a function): "
                         f"{circles}; move what both need into a module below them")


def test_the_circle_check_finds_a_planted_circle():
    # Two modules that import each other, one of them only inside a function.
    a, b = PACKAGE / "_planted_a.py", PACKAGE / "course" / "_planted_b.py"
    a.write_text("def go():\n    from .course import _planted_b\n")
    b.write_text("from .. import _planted_a\n")
    try:
        circles = import_circles(_module_graph())
    finally:
        a.unlink()
        b.unlink()
    assert ["parlab._planted_a", "parlab.course._planted_b"] in circles


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")),
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_is_longer_than_the_limit(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, (f"parlab/{path.relative_to(PACKAGE)} has {lines} lines (at most "
                                f"{MAX_LINES}): split it along a seam it already has")
