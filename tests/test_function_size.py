"""Small functions (issue 26's target: none over 60 lines outside Triton kernels), as a ratchet:
a function that grows past the limit fails here; the ones already past it are listed by name and
may only leave the list (shorten one, then delete its line).

`python -m tests.test_function_size` prints every function over the limit, longest first."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "sim", "advisor", "app", "kernels")
MAX_LINES = 60  # from `def` to the function's last line (signature and docstring count, decorators not)
# functions allowed over the limit, with their lengths (none since 2026-12-02: keep it that way)
KNOWN_LONG: dict[str, int] = {}


def _is_kernel(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any("jit" in ast.unparse(d) or "autotune" in ast.unparse(d) for d in node.decorator_list)


def long_functions(root: Path = REPO, limit: int = MAX_LINES) -> dict[str, int]:
    """{"path::Qualified.name": lines} of every function over `limit` lines outside Triton kernels."""
    out: dict[str, int] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            _visit(ast.parse(path.read_text()), rel, "", limit, out)
    return out


def _visit(node: ast.AST, rel: str, prefix: str, limit: int, out: dict[str, int]) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef):
            _visit(child, rel, f"{prefix}{child.name}.", limit, out)
        elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = child.end_lineno - child.lineno + 1
            if lines > limit and not _is_kernel(child):
                out[f"{rel}::{prefix}{child.name}"] = lines
            _visit(child, rel, f"{prefix}{child.name}.", limit, out)


def test_no_new_function_over_the_limit() -> None:
    new = {k: v for k, v in long_functions().items() if k not in KNOWN_LONG}
    assert not new, f"functions over {MAX_LINES} lines (split them): {new}"


def test_the_known_long_ones_do_not_grow() -> None:
    found = long_functions()
    grown = {k: (KNOWN_LONG[k], v) for k, v in found.items() if k in KNOWN_LONG and v > KNOWN_LONG[k]}
    assert not grown, f"(then, now) lines: {grown}"


if __name__ == "__main__":
    for name, lines in sorted(long_functions().items(), key=lambda kv: -kv[1]):
        print(f"{lines:4d}  {name}")
