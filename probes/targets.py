"""What a probe worker measures: one :class:`ProbeTarget` per (VIP, DIP), checked up front.

A bad probe URL or DIP address is refused here, at configuration time, with a message
naming the VIP, the DIP and the value, never discovered later as a stream of failed
probes. Host names must resolve now (``getaddrinfo``); ports must be 1-65535; paths start
with '/'. ``parse_probe_url`` accepts an ``http://host:port/path`` URL for tools and
configuration files that give probe URLs whole (``https`` is refused: probes speak plain
HTTP/1.1 to the DIP, as the paper's KLM does).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from knapsack_lb.errors import InvalidInputError
from knapsack_lb.model import ProbeSpec, VipConfig
from knapsack_lb.names import format_address, parse_address, validate_name


@dataclass(frozen=True)
class ProbeTarget:
    """One DIP of one VIP and how to probe it (KnapsackLB section 5, KLM)."""

    vip: str
    dip: str
    host: str
    port: int
    spec: ProbeSpec = field(default_factory=ProbeSpec)

    @property
    def resource(self) -> str:
        """The lease name of this target: ``vip:dip`` (names never contain ':')."""
        return f"{self.vip}:{self.dip}"

    @property
    def url(self) -> str:
        return f"http://{format_address(self.host, self.port)}{self.spec.path}"


def check_resolvable(host: str, *, vip: str, dip: str) -> None:
    """Refuse a host that does not resolve to an address right now."""
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as error:
        raise InvalidInputError("address", host, f"VIP {vip!r}: host does not resolve ({error})", dip=dip) from None


def build_targets(config: VipConfig, *, resolve: bool = True) -> list[ProbeTarget]:
    """Targets for every DIP of ``config``; raises :class:`InvalidInputError` on a bad address or path."""
    targets = []
    for dip in config.dips:
        try:
            host, port = parse_address("address", dip.address)
        except InvalidInputError as bad:
            problem = f"VIP {config.name!r}: {bad.problem}"
            raise InvalidInputError("address", dip.address, problem, dip=dip.name) from None
        if resolve:
            check_resolvable(host, vip=config.name, dip=dip.name)
        targets.append(ProbeTarget(config.name, dip.name, host, port, config.probe))
    return targets


def parse_probe_url(url: str, *, vip: str, dip: str) -> tuple[str, int, str]:
    """``http://host:port/path?query`` -> (host, port, path); refuses anything else clearly."""
    validate_name("vip", vip)
    validate_name("dip", dip)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise InvalidInputError("probe_url", url, f"VIP {vip!r}: not a URL ({error})", dip=dip) from None
    if parts.scheme != "http":
        raise InvalidInputError("probe_url", url, f"VIP {vip!r}: only http:// probe URLs are supported", dip=dip)
    if parts.username or parts.password or parts.fragment:
        raise InvalidInputError("probe_url", url, f"VIP {vip!r}: no user info or fragment allowed", dip=dip)
    if not parts.hostname:
        raise InvalidInputError("probe_url", url, f"VIP {vip!r}: the URL needs a host", dip=dip)
    host = parts.hostname
    address = format_address(host, port or 80)
    host, port = parse_address("probe_url", address)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        ProbeSpec(path=path)
    except ValueError as error:
        raise InvalidInputError("probe_url", url, f"VIP {vip!r}: bad path ({error})", dip=dip) from None
    return host, port, path
