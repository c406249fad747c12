"""The import graph of fpsim/, fpsim_kernels/ and fpsim_experiments/ has no cycle.

Every import statement counts, at module level or inside a function (a lazy import still makes
the two modules depend on each other), and so does ``importlib.import_module`` of a string
constant.  A package's ``__init__`` is a node of its own: ``from fpsim import blocks`` depends
on ``fpsim.blocks``, ``from fpsim import quantize`` on ``fpsim``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fpsim", "fpsim_kernels", "fpsim_experiments")


def _modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _targets(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules that ``name`` (at ``path``) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
              for t in n.targets if isinstance(t, ast.Name)
              and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}
    wanted: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            wanted += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
            wanted += subs if len(subs) == len(node.names) else subs + [base]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args):
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                wanted.append(arg.value)
            elif isinstance(arg, ast.Name) and arg.id in consts:
                wanted.append(consts[arg.id])
    out = set()
    for target in wanted:
        while target and target not in modules:       # `import a.b.c` of a package member
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _targets(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules (first repeated last), or None."""
    state: dict[str, int] = {}                        # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_graph_sees_lazy_and_relative_imports():
    graph = import_graph()
    assert "fpsim.formats" in graph["fpsim.rounding"]
    assert "fpsim_kernels" in graph["fpsim.dispatch"]        # imported inside a function
    assert "fpsim_experiments.cli" in graph["fpsim.cli"]     # importlib.import_module(NAME)


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_only_dispatch_reaches_the_kernels():
    graph = import_graph()
    users = {m for m, targets in graph.items()
             if m.startswith("fpsim") and not m.startswith("fpsim_kernels")
             and any(t == "fpsim_kernels" or t.startswith("fpsim_kernels.") for t in targets)}
    assert users == {"fpsim.dispatch"}


def test_kernels_use_public_names_of_the_layers_below_the_api():
    below = {"fpsim.formats", "fpsim.names", "fpsim.rounding", "fpsim.backend", "fpsim.blocks",
             "fpsim.packing", "fpsim.blockrules", "fpsim.stochastic"}
    for name, path in _modules().items():
        if not name.startswith("fpsim_kernels"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fpsim"):
                names = [f"{node.module}.{a.name}" for a in node.names]
                assert all(n in below or node.module in below for n in names), (name, names)
                assert not any(a.name.startswith("_") for a in node.names), (name, names)
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                    and isinstance(node.value, ast.Name) and node.value.id in ("fpsim",):
                raise AssertionError(f"{name} uses fpsim.{node.attr}")
