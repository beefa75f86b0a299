"""Errors that cross module boundaries.

Every error names the thing that is wrong (DIP, field) and the value, so an operator
can fix the input without reading the code.
"""

from __future__ import annotations

SHORT_REPR_LIMIT = 120


def short_repr(value: object, limit: int = SHORT_REPR_LIMIT) -> str:
    """``repr(value)``, cut to ``limit`` characters with the original length noted: error
    messages and logs name a bad value without echoing megabytes of it."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


class KnapsackLBError(Exception):
    """Base class of every error this package raises on purpose."""


class InvalidInputError(KnapsackLBError, ValueError):
    """Malformed input: names the offending field (and DIP when there is one) and the value."""

    def __init__(self, field: str, value: object, problem: str, dip: str | None = None) -> None:
        self.field = field
        self.value = value
        self.problem = problem
        self.dip = dip
        where = f"DIP {dip!r}, field {field!r}" if dip is not None else f"field {field!r}"
        super().__init__(f"{where}: {problem} (got {short_repr(value)})")

    def __reduce__(self) -> tuple[type[InvalidInputError], tuple[str, object, str, str | None]]:
        """Pickled with its fields, so it crosses process pools (the benches' workers) intact."""
        return (type(self), (self.field, self.value, self.problem, self.dip))


class InfeasibleError(KnapsackLBError):
    """The constraints admit no plan; the message carries the numbers that show why."""


class SolverError(KnapsackLBError):
    """A solver failed to produce a plan (time limit, solver crash, numerical trouble)."""


class StoreUnavailableError(KnapsackLBError, ConnectionError):
    """The latency store does not answer (down, unreachable, timed out, loading). Callers back off
    and retry; nothing they hold is lost by it."""


class StalePlanError(KnapsackLBError):
    """A plan older than the stored one: another controller wrote a newer version of this VIP's
    plan (it took the VIP over), so this writer is stale and must not push its plan."""

    def __init__(self, vip: str, version: int, stored: int) -> None:
        self.vip, self.version, self.stored = vip, version, stored
        super().__init__(f"VIP {vip!r}: plan v{version} is stale, the store holds v{stored}")

    def __reduce__(self) -> tuple[type[StalePlanError], tuple[str, int, int]]:
        return (type(self), (self.vip, self.version, self.stored))

