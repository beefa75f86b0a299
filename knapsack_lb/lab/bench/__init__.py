"""The ``klb bench`` benchmarks, one module per subject."""
