"""Tables printed by ``klb`` keep every number when stdout is a log, not a terminal."""

from __future__ import annotations

from typer.testing import CliRunner

from knapsack_lb.cli.main import app
from knapsack_lb.cli.output import LOG_WIDTH, stdout_console


def test_off_a_terminal_the_console_is_as_wide_as_a_log_line() -> None:
    console = stdout_console()  # pytest captures stdout: not a terminal
    assert not console.is_terminal and console.width == LOG_WIDTH


def test_a_wide_table_printed_to_a_log_cuts_no_cell() -> None:
    result = CliRunner().invoke(app, ["sim", "run", "l7-basics", "--policy", "round_robin", "--duration", "20"])
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout, result.stdout
