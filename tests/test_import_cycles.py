"""No import cycle between costline's modules, counting imports inside functions too (issue 26):
a function-level import that closes a cycle hides a layering knot. Torch-side cycles that remain
are listed by their modules and may only go."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "sim", "advisor", "app", "kernels")
# still there when this test was written (2026-12-02): the kernels' backend picks its kernels
# lazily; the P/D result reads the router's state; tensor parallelism's worker
KNOWN = [
    {"kernels", "kernels.backend", "kernels.cache_write", "kernels.fused", "kernels.paged_attention",
     "kernels.work_lists"},
    {"engine.disagg.result", "engine.disagg.router"},
    {"engine.engine_loop", "engine.tp_worker"},  # a TP rank builds its model through the engine loop
]


def _modules() -> dict[str, Path]:
    mods = {}
    for package in PACKAGES:
        for f in (REPO / package).rglob("*.py"):
            name = ".".join(f.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
            mods[name] = f
    return mods


def _imports(tree: ast.AST) -> set[str]:
    """Every absolute module name an import statement anywhere in `tree` may load."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def import_graph() -> dict[str, set[str]]:
    mods = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for m, f in mods.items():
        targets = {resolve(t) for t in _imports(ast.parse(f.read_text())) if t.split(".")[0] in PACKAGES}
        graph[m] = {t for t in targets if t and t != m}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []
    for root, targets in graph.items():
        if root in index:
            continue
        work = [(root, iter(sorted(targets)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.add(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


def test_no_new_import_cycle() -> None:
    new = [c for c in cycles(import_graph()) if not any(c <= k for k in KNOWN)]
    assert not new, f"import cycles (function-level imports included): {[sorted(c) for c in new]}"


def test_the_walk_finds_a_cycle_closed_inside_a_function() -> None:
    graph = {"a": {"b"}, "b": {"a"}, "c": {"a"}}
    assert cycles(graph) == [{"a", "b"}]
    tree = ast.parse("def f():\n    from sim.run import run\n")
    assert "sim.run" in _imports(tree)
