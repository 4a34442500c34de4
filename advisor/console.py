"""Rich output that prints user-supplied text as typed.

Names, labels, paths, notes and messages come from the user (a `--label '[/]'`, a spec named
`[bold]`, a file called `[red]x.json`); Rich would parse them as markup and fail (MarkupError) or
restyle them. So every console here is made with markup off: strings print verbatim, and the few
styled words are `Text` objects (`styled`). `escape` is for the rare place that must build markup.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape as _escape
from rich.text import Text


def console(*, stderr: bool = False) -> Console:
    """A console that never parses markup or highlights what it prints."""
    return Console(stderr=stderr, markup=False, highlight=False)


def styled(*parts: str | tuple[str, str]) -> Text:
    """Text from plain strings and (text, style) pairs: `styled(("error:", "bold red"), " ", msg)`."""
    return Text.assemble(*parts)


def escape(value: Any) -> str:
    """`value` as markup that shows it verbatim."""
    return _escape(str(value))


__all__ = ["console", "escape", "styled"]
