"""No private name crosses a module boundary (issue 26): a module never imports another module's
`_name` nor reads `obj._name` off anything but `self` / `cls`. Outside our code (os._exit,
torch._scaled_mm, the Triton interpreter's internals we patch) is listed by name."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "sim", "advisor", "app", "kernels")
# other projects' private names we must use, each with why
ALLOWED = {
    "os._exit",  # a worker process leaves without running the parent's atexit handlers
    "torch._scaled_mm",  # PyTorch's FP8 GEMM has no public name
    "interpreter._patch_lang_tensor",  # kernels/_interpreter_compat.py patches Triton's CPU interpreter
    "interpreter._get_np_dtype",
    "interpreter._patch_lang",  # fix 4: a helper inside a launch reuses the launch's patches
    "tl.core._type_for_tuple_values",  # fix 5: a Triton tuple's type worked out by Triton's own function, lazily
}


def private_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of every private name this module takes from another object or module."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            out += [(node.lineno, f"from {node.module} import {a.name}") for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            text = ast.unparse(node)
            if text not in ALLOWED:
                out.append((node.lineno, text))
    return out


def test_the_check_finds_what_it_should() -> None:
    src = ("from a.b import _hidden, shown\nx = obj._field\ny = self._own\nz = self.other._field\n"
           "os._exit(0)\nw = obj.__class__\n")
    assert private_uses(ast.parse(src)) == [(1, "from a.b import _hidden"), (2, "obj._field"),
                                           (4, "self.other._field")]


def test_no_private_name_crosses_a_module() -> None:
    found = [f"{path.relative_to(REPO).as_posix()}:{line}: {text}"
             for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))
             for line, text in private_uses(ast.parse(path.read_text()))]
    assert not found, "private names used across modules (make them public or keep them inside):\n" + \
        "\n".join(found)
