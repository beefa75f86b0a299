"""Which live worker probes which DIP: rendezvous (highest random weight) hashing.

Every worker computes the same owner for a DIP from the same member list, without
talking to the others; when a member joins or leaves only the DIPs it wins or held move
(about 1/n of them). Leases in the store (:meth:`LatencyStore.acquire_lease`) make the
choice exclusive while member lists briefly disagree: a worker probes only DIPs whose
lease it holds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence


def _score(member: str, resource: str) -> int:
    digest = hashlib.blake2b(f"{member}\x00{resource}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous_owner(resource: str, members: Sequence[str]) -> str | None:
    """The member with the highest score for ``resource``; None when there are no members."""
    if not members:
        return None
    return max(members, key=lambda m: (_score(m, resource), m))


def assigned_to(member: str, resources: Iterable[str], members: Sequence[str]) -> set[str]:
    """The resources that ``member`` owns among ``members`` (``member`` counts as live)."""
    everyone = sorted(set(members) | {member})
    return {r for r in resources if rendezvous_owner(r, everyone) == member}
