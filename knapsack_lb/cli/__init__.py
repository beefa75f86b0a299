"""The ``klb`` command line (typer). Each concept registers its own commands."""
