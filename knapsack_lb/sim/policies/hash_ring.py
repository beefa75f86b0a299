"""Consistent hash ring on the client address (L7 report, "Server Selection").

Each DIP gets ``points`` (100) nodes on a ring of 2^32 positions (md5 of ``"<dip name>#<i>"``); a
request's client address is hashed to a position and served by the DIP of the first node with a
greater hash (wrapping around), skipping excluded (unhealthy, already tried) DIPs. Nodes live in a
sorted list plus a node -> DIP map, so a lookup is a binary search. A ring, not modulo, so that a DIP
going away only moves its own clients.
How it fails: load follows the client population; with few clients some DIPs get none (the report's
test where no client hashed to server 2) and others get many.
"""

from __future__ import annotations

import bisect
import hashlib
import random
from collections.abc import Sequence

from knapsack_lb.sim.policies.base import LbView, Request, StatelessPolicy
from knapsack_lb.sim.policies.registry import PolicyContext


def ring_hash(key: str) -> int:
    return int.from_bytes(hashlib.md5(key.encode()).digest()[:4], "big")


class HashRing(StatelessPolicy):
    name = "hash_ring"

    def __init__(self, dip_names: Sequence[str], points: int = 100) -> None:
        if points < 1:
            raise ValueError(f"points must be >= 1 (got {points})")
        self.points = points
        owner: dict[int, int] = {}
        for dip, name in enumerate(dip_names):
            for i in range(points):
                owner.setdefault(ring_hash(f"{name}#{i}"), dip)
        self.nodes = sorted(owner)
        self.owner = owner
        self._cache: dict[str, int] = {}

    def lookup(self, client: str, excluded: frozenset[int] = frozenset()) -> int | None:
        pos = self._cache.get(client)
        if pos is None:
            pos = bisect.bisect_right(self.nodes, ring_hash(client))
            self._cache[client] = pos
        n = len(self.nodes)
        seen: set[int] = set()
        for step in range(n):
            dip = self.owner[self.nodes[(pos + step) % n]]
            if dip not in excluded:
                return dip
            seen.add(dip)
            if len(seen) == len(set(self.owner.values())):
                break
        return None

    def pick(self, request: Request, view: LbView, rng: random.Random) -> int | None:
        return self.lookup(request.client, request.excluded)


def make_hash_ring(ctx: PolicyContext) -> HashRing:
    """Consistent hash ring on the client address, 100 points per DIP (L7 report)."""
    return HashRing(ctx.dip_names, **ctx.params)
