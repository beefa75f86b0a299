"""The package layering: the core imports neither the adapters, the probes nor the lab, and no
two parts of the code import each other (a cycle), read from the source with ``ast``."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("knapsack_lb", "adapters", "probes")
CORE = ("model", "errors", "names", "clock", "quantise", "rounds", "plugins", "curves", "solver", "controller",
        "loop", "store")
NOT_FOR_THE_CORE = ("adapters", "probes", "knapsack_lb.lab", "knapsack_lb.sim", "knapsack_lb.service",
                    "knapsack_lb.api", "knapsack_lb.cli", "knapsack_lb.config")


def unit(module: str) -> str:
    """The part of the code a module belongs to: ``knapsack_lb.<first part>``, ``adapters`` or ``probes``."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "knapsack_lb" and len(parts) > 1 else parts[0]


def imports() -> dict[str, set[str]]:
    """Module -> the project modules it imports (at any depth of the file, lazy imports included)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                graph[module] |= {n for n in names if n.split(".")[0] in PACKAGES}
    return graph


def test_the_core_imports_neither_adapters_probes_nor_the_lab() -> None:
    offending = sorted(
        f"{module} imports {target}"
        for module, targets in imports().items()
        if unit(module).removeprefix("knapsack_lb.") in CORE
        for target in targets
        if any(target == bad or target.startswith(bad + ".") for bad in NOT_FOR_THE_CORE)
    )
    assert offending == []


def test_no_two_parts_of_the_code_import_each_other() -> None:
    edges: dict[str, set[str]] = defaultdict(set)
    for module, targets in imports().items():
        for target in targets:
            if unit(target) != unit(module):
                edges[unit(module)].add(unit(target))
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(edges.get(node, ())):
            if nxt in path:
                cycles.append(" -> ".join([*path[path.index(nxt):], nxt]))
            elif len(path) < 12:
                visit(nxt, [*path, nxt])

    for start in sorted(edges):
        visit(start, [start])
    assert sorted(set(cycles)) == []


def test_the_check_sees_imports() -> None:
    graph = imports()
    assert "knapsack_lb.controller.core" in graph["knapsack_lb.loop"]
    assert unit("knapsack_lb.controller.core") == "knapsack_lb.controller" and unit("adapters.haproxy") == "adapters"
