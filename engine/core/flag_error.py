"""`FlagError`: a broken vLLM rule, naming the field (Python) or the flag (CLI). Its own module so
that the configs engine/core/flags.py builds on (the speculative config) can raise it without
importing the flag table.

Torch-free: the simulator imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class FlagError(ValueError):
    """A broken vLLM rule. `{field}` placeholders in `rule` become field names (Python) or
    flags (CLI) when rendered."""

    def __init__(self, field: str, value: Any, rule: str) -> None:
        self.field, self.value, self.rule = field, value, rule
        super().__init__(self.render(lambda f: f))

    def render(self, spell: Callable[[str], str]) -> str:
        return f"{spell(self.field)} {self.value}: " + self.rule.format_map(_Spell(spell))


class _Spell(dict):
    def __init__(self, spell: Callable[[str], str]) -> None:
        super().__init__()
        self.spell = spell

    def __missing__(self, key: str) -> str:
        return self.spell(key)


__all__ = ["FlagError"]
