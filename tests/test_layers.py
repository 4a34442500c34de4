"""The layers, checked: costline -> app -> advisor -> sim -> engine.core <- engine -> kernels.

`engine.core` is what the simulator and the engine share; it must import no torch or triton, and
the layers above the engine (`sim/`, `advisor/`, `app/`) reach the engine only through it. The
`costline` package (the command line composed: the advisor's commands and `costline engine`) sits
above both, and nothing below imports it.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import engine.core

REPO = Path(__file__).resolve().parents[1]
CORE_MODULES = sorted(["engine.core"] + [f"engine.core.{m.name}" for m in pkgutil.iter_modules(engine.core.__path__)])


def test_core_modules_import_no_torch():
    code = ("import importlib, sys\n"
            f"for name in {CORE_MODULES!r}:\n"
            "    importlib.import_module(name)\n"
            "    heavy = [m for m in ('torch', 'triton') if m in sys.modules]\n"
            "    assert not heavy, f'{name} imports {heavy}'\n")
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert len(CORE_MODULES) > 15  # the walk found the package


def _engine_imports(tree: ast.AST, module_level: bool) -> list[tuple[int, str]]:
    """(line, module) of every import of `engine...`: at module level (class bodies and `if`
    blocks included, function bodies not), or only inside functions."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                names = [child.module] if child.module != "engine" else [f"engine.{a.name}" for a in child.names]
            for name in names:
                if (name == "engine" or name.startswith("engine.")) and in_function != module_level:
                    found.append((child.lineno, name))
            visit(child, inner)

    visit(tree, False)
    return found


def _outside_core(name: str) -> bool:
    return not (name == "engine.core" or name.startswith("engine.core."))


def _sources() -> list[Path]:
    return [p for layer in ("sim", "advisor", "app") for p in sorted((REPO / layer).rglob("*.py"))]


def test_upper_layers_import_only_engine_core_at_module_level():
    bad = [f"{p.relative_to(REPO)}:{line} imports {name}"
           for p in _sources() for line, name in _engine_imports(ast.parse(p.read_text()), module_level=True)
           if _outside_core(name)]
    assert not bad, "sim/, advisor/ and app/ import the engine only through engine.core:\n" + "\n".join(bad)


def test_upper_layers_import_no_torch_engine_inside_functions_either():
    bad = [f"{p.relative_to(REPO)}:{line} imports {name}"
           for p in _sources() for line, name in _engine_imports(ast.parse(p.read_text()), module_level=False)
           if _outside_core(name)]
    assert not bad, "the torch engine is run from costline/ (above advisor and engine), not from:\n" + "\n".join(bad)


def test_nothing_below_the_command_line_imports_it():
    layers = ("engine", "kernels", "sim", "advisor", "app")
    bad = [f"{p.relative_to(REPO)}:{node.lineno}"
           for layer in layers for p in sorted((REPO / layer).rglob("*.py"))
           for node in ast.walk(ast.parse(p.read_text()))
           if (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "costline" for a in node.names))
           or (isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "costline")]
    assert not bad, "costline/ composes the layers; none of them imports it:\n" + "\n".join(bad)


def test_the_walk_sees_imports():
    tree = ast.parse("import engine.runner\nfrom engine import llm\nclass A:\n    from engine.core import flags\n"
                     "def f():\n    from engine.replay import replay\n")
    assert _engine_imports(tree, module_level=True) == [(1, "engine.runner"), (2, "engine.llm"), (4, "engine.core")]
    assert _engine_imports(tree, module_level=False) == [(6, "engine.replay")]
