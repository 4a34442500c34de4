"""One module per command group of the `costline` CLI; each exposes a typer app `app`
(or a function registered by `advisor.cli`)."""
