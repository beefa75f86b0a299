"""The demo's phases: what HAProxy runs and where the weights come from in each.

1. ``roundrobin`` - HAProxy's own round robin in ``mode tcp``, equal weights (the paper's RR).
2. ``leastconn`` - HAProxy's least connections in ``mode tcp``, equal weights (the paper's LC):
   it balances *connection counts*, not load (KnapsackLB section 2.1).
3. ``knapsacklb`` - ``roundrobin`` in ``mode tcp`` with the weights KnapsackLB's controller
   pushes through the admin socket. Before it, a learning period (not counted) lets the
   controller learn the curves and solve; the controller keeps running.
4. ``http-leastconn`` - ``mode http`` with ``leastconn`` and the learned weights (HAProxy picks
   the lowest connections/weight per *request*). At the request level a central
   least-connections is near-optimal on its own (docs/design.md, "When weights can beat
   least-connections"); this phase shows what the weights add there, whatever the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

WeightSource = Literal["equal", "controller", "learned"]


@dataclass(frozen=True)
class Phase:
    key: str
    title: str
    balance: str
    mode: Literal["http", "tcp"]
    weights: WeightSource
    description: str


PHASES: tuple[Phase, ...] = (
    Phase("roundrobin", "HAProxy roundrobin (L4)", "roundrobin", "tcp", "equal",
          "mode tcp, balance roundrobin, equal weights: connections rotate over the DIPs"),
    Phase("leastconn", "HAProxy leastconn (L4)", "leastconn", "tcp", "equal",
          "mode tcp, balance leastconn, equal weights: a new connection goes to the DIP with fewest connections"),
    Phase("knapsacklb", "KnapsackLB weights (L4)", "roundrobin", "tcp", "controller",
          "mode tcp, balance roundrobin, runtime weights pushed by the KnapsackLB controller"),
    Phase("http-leastconn", "HTTP leastconn + learned weights (L7)", "leastconn", "http", "learned",
          "mode http, balance leastconn per request, weights frozen at the learned plan"),
)
PHASE_KEYS = tuple(p.key for p in PHASES)
