"""Where the ``klb`` commands print their tables and summaries."""

from __future__ import annotations

from rich.console import Console

LOG_WIDTH = 160  # columns when stdout is a file, a pipe or a CI log: wide enough for every table to show its numbers


def stdout_console() -> Console:
    """A console on stdout: the terminal's own width, or ``LOG_WIDTH`` when stdout is not a terminal
    (rich would assume 80 columns there and cut the cells of a wide table to an ellipsis)."""
    console = Console()
    return console if console.is_terminal else Console(width=LOG_WIDTH)
