"""The ``Policy`` protocol: how a load balancer instance picks a DIP for a request.

A policy sees only what its own LB instance knows (``LbView``: its own outstanding
requests per DIP, the weights pushed to it, the time) and what came back on responses
(``Outcome``: latency, status, and anything the server piggybacked, such as its in-flight
count for DL3 or a confidence chip for BLOC). Randomness comes only from the ``rng`` passed
in. Retries, backoff and probe scheduling belong to the caller (the simulator or testbed):
a policy that wants probes says which DIPs through ``probe_targets``; its answer to a
request may be ``None`` (shed / reject / nothing available).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

Status = Literal["ok", "error", "timeout", "rejected"]


@dataclass(frozen=True)
class Request:
    """A request as the LB sees it when it must choose."""

    id: int
    client: str
    time: float
    attempt: int = 0
    excluded: frozenset[int] = frozenset()  # DIPs already tried for this request (retries)
    connection: int | None = None  # layer-4 connection id when requests ride connections


@runtime_checkable
class LbView(Protocol):
    """What one LB instance knows at decision time."""

    @property
    def now(self) -> float: ...

    @property
    def dip_names(self) -> Sequence[str]: ...

    def outstanding(self, dip: int) -> int:
        """Requests this LB instance has in flight to ``dip``."""
        ...

    def weight(self, dip: int) -> float:
        """Weight pushed to this LB (by a controller or the configuration), >= 0."""
        ...


@dataclass(frozen=True)
class Outcome:
    """A response (or failure) as the LB instance observes it."""

    request_id: int
    dip: int
    sent_at: float
    finished_at: float
    status: Status
    server_inflight: int | None = None  # piggybacked load (DL3), None if not reported
    chip: bool = False  # BLOC confidence chip attached by the server
    probe: bool = False  # a probe the policy asked for, not client traffic
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def latency(self) -> float:
        return self.finished_at - self.sent_at


@runtime_checkable
class Policy(Protocol):
    """Picks a DIP index for a request, or ``None`` to reject it."""

    name: str

    def pick(self, request: Request, view: LbView, rng: random.Random) -> int | None: ...

    def observe(self, outcome: Outcome, view: LbView) -> None:
        """Learn from a response or probe answer (no-op for stateless policies)."""
        ...

    def probe_targets(self, view: LbView, rng: random.Random) -> Sequence[int]:
        """DIPs to probe now (called by the caller every ``probe_interval``; empty = none)."""
        ...


class StatelessPolicy:
    """Base for policies that neither learn from responses nor probe."""

    name = "stateless"

    def observe(self, outcome: Outcome, view: LbView) -> None:
        return None

    def probe_targets(self, view: LbView, rng: random.Random) -> Sequence[int]:
        return ()
