"""The top of the stack: the `costline` command line composed from the advisor's commands and the
engine's (docs/design.md). Nothing below imports this package."""
