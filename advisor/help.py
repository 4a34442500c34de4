"""`--help` laid out for a terminal of up to 100 columns: each option on its own line, its
description wrapped under it at the full width (not squeezed into a narrow right-hand column).

Every command of the `costline` CLI is made with `cls=StackedHelp` (`HELP` below), so the layout and
the placeholders (click's TEXT / INTEGER / FLOAT / PATH, or the choices) are one style everywhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from typer.core import TyperCommand

if TYPE_CHECKING:  # annotations only: typer >= 0.2x carries its own click, and the light install has no other
    import click

HELP_WIDTH = 100  # columns the help may use at most (a wider terminal gets no wider help)


class StackedHelp(TyperCommand):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["rich_markup_mode"] = None  # click's plain layout, which format_options below rearranges
        settings = dict(kwargs.get("context_settings") or {})
        settings.setdefault("max_content_width", HELP_WIDTH)
        kwargs["context_settings"] = settings
        super().__init__(*args, **kwargs)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(p.param_type_name, p.get_help_record(ctx)) for p in self.get_params(ctx)]
        for kind, title in (("argument", "Arguments"), ("option", "Options")):
            records = [rec for k, rec in rows if k == kind and rec is not None]
            if not records:
                continue
            with formatter.section(title):
                for name, text in records:
                    formatter.write_text(name)
                    if text:
                        with formatter.indentation():
                            formatter.write_text(text)


HELP: dict[str, Any] = {"cls": StackedHelp}

__all__ = ["HELP", "HELP_WIDTH", "StackedHelp"]
