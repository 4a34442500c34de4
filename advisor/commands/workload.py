"""`costline workload ...`: describe and fit workloads (issue: Foundation)."""

from __future__ import annotations

import typer

app = typer.Typer(help="Describe, fit and export workloads and real traces.", no_args_is_help=True)


@app.command("describe")
def describe(source: str = typer.Argument(..., help="preset name, spec file or trace file"),
             as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Request count, rate, burstiness, length percentiles, prefix reuse and task mix."""
    raise typer.Exit(code=2)  # implemented by the Foundation issue
