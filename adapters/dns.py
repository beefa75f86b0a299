"""Weighted DNS with PowerDNS Authoritative: one LUA ``pickwrandom`` record per VIP.

Where a load balancer offers no interface for weights, KnapsackLB balances with DNS that
resolves the VIP's name to a DIP address chosen by weight (KnapsackLB paper, section 3.2
"Using weights to control traffic", and section 6.5 / Table 6, Azure Traffic Manager). Here
the DNS server is PowerDNS Authoritative with LUA records enabled
(``enable-lua-records=yes``); the VIP's name holds one LUA rrset::

    vip.example.test. 5 IN LUA A "pickwrandom({{100,'192.0.2.1'},{300,'192.0.2.2'},{600,'192.0.2.3'}})"

and every query is answered with one address drawn with those weights.

How ``apply`` works:

1. the plan is quantised to integers over ``resolution`` units (largest remainder); DIPs
   with weight 0 are left out of the table; a plan with every DIP at 0 is refused (the name
   would SERVFAIL, docs/design.md);
2. the rrset is replaced through the REST API (``PATCH /api/v1/servers/<id>/zones/<zone>``,
   ``changetype: REPLACE``);
3. the name is queried (dnspython, UDP) ``verify_queries`` times: the API accepts broken Lua
   with 204 and the name then SERVFAILs, so an answer that is not NOERROR with an address of
   the new table makes the adapter PATCH the previous rrset back and return ``ok=False``.

Semantics and limits: integer weights >= 1 (fractions are the adapter's job); the split is
per *query*, and resolvers and clients cache answers for the TTL (``ttl``, default 5 s), so
traffic follows a new plan only after caches expire (section 6.5: "depends on the DNS cache
timeout"). PowerDNS's own packet and query caches should be off (``cache-ttl=0``,
``query-cache-ttl=0``) or short, otherwise the same answer is repeated for their lifetime.

Every name is validated strictly: zone and record are DNS names (letters, digits, ``-``,
dots), addresses are IP literals (rendered in canonical form), the API key has no
whitespace or control characters. Nothing the operator types reaches the Lua text except
canonical IP literals and integers, so no quote or ``)`` can escape the string.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import quote, urlsplit

import dns.exception
import dns.message
import dns.query
import dns.rcode
import dns.rdatatype
import httpx
from pydantic import BeforeValidator, ConfigDict, Field, SecretStr, model_validator

from adapters.base import AdapterSettings, ApplyResult, CheckResult, parse_settings, quantise
from knapsack_lb.clock import Clock, SystemClock
from knapsack_lb.errors import InvalidInputError, KnapsackLBError
from knapsack_lb.model import DipConfig, WeightPlan
from knapsack_lb.names import (
    HOSTNAME_PATTERN,
    Name,
    format_address,
    parse_address,
    pydantic_rule,
    validate_host,
    validate_port,
)

DEFAULT_TTL = 5
DEFAULT_RESOLUTION = 1000
API_KEY_PATTERN = re.compile(r"^[\x21-\x7e]{1,256}$")  # printable ASCII, no space
ENV_NAME_PATTERN = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
LUA_PATTERN = re.compile(r"^(A|AAAA) \"pickwrandom\(\{(\{\d+,'[0-9A-Fa-f:.]+'\}(?:,\{\d+,'[0-9A-Fa-f:.]+'\})*)\}\)\"$")
ENTRY_PATTERN = re.compile(r"\{(\d+),'([0-9A-Fa-f:.]+)'\}")

RecordType = Literal["A", "AAAA"]


class PowerDnsError(KnapsackLBError):
    """PowerDNS could not be reached, refused a change, or the name does not resolve."""


# --- validation and rendering (pure) -------------------------------------------------------


def validate_dns_name(field: str, value: object) -> str:
    """A DNS name of letters, digits and ``-`` labels, returned fully qualified (trailing
    dot, lower case). IP literals, ``_``, ``*``, spaces, quotes, ``/`` and empty labels are refused."""
    if not isinstance(value, str) or not value or value == ".":
        raise InvalidInputError(field, value, "must be a DNS name such as 'vip.example.test.'")
    try:
        ipaddress.ip_address(value)
    except ValueError:
        pass
    else:
        raise InvalidInputError(field, value, "must be a DNS name, not an IP address")
    if not HOSTNAME_PATTERN.fullmatch(value):
        raise InvalidInputError(field, value, "must be dot-separated labels of letters, digits and '-'")
    return value.lower().rstrip(".") + "."


def validate_ip(field: str, value: object) -> str:
    """An IPv4 or IPv6 literal in canonical form (no ports, brackets, scopes or host names)."""
    if not isinstance(value, str):
        raise InvalidInputError(field, value, "must be an IP address literal")
    try:
        address = ipaddress.ip_address(value)
    except ValueError as exc:
        raise InvalidInputError(field, value, "must be an IP address literal (no port, no host name)") from exc
    if getattr(address, "scope_id", None):
        raise InvalidInputError(field, value, "must be an IP address literal without a zone index ('%')")
    return str(address)


def record_type(addresses: Mapping[str, str]) -> RecordType:
    """``A`` for IPv4 addresses, ``AAAA`` for IPv6; a mix is refused (one LUA record answers
    one type, so a mixed table would split traffic by address family, not by weight)."""
    versions = {ipaddress.ip_address(a).version for a in addresses.values()}
    if len(versions) != 1:
        raise InvalidInputError("adapter.settings.addresses", dict(addresses), "mixes IPv4 and IPv6")
    return "A" if versions == {4} else "AAAA"


def render_lua(rrtype: RecordType, addresses: Mapping[str, str], lb_weights: Mapping[str, int]) -> str:
    """The LUA record content for integer weights (DIPs at 0 left out, sorted by DIP)."""
    entries = []
    for dip in sorted(lb_weights):
        weight = lb_weights[dip]
        if isinstance(weight, bool) or not isinstance(weight, int) or weight < 0:
            raise InvalidInputError("weight", weight, "must be an integer >= 0", dip=dip)
        if weight == 0:
            continue
        if dip not in addresses:
            raise InvalidInputError("adapter.settings.addresses", dip, "the plan names a DIP with no address", dip=dip)
        entries.append(f"{{{weight},'{validate_ip(f'addresses.{dip}', addresses[dip])}'}}")
    if not entries:
        raise InvalidInputError("weights", dict(lb_weights), "every DIP has weight 0: the name would SERVFAIL")
    content = f'{rrtype} "pickwrandom({{{",".join(entries)}}})"'
    if not LUA_PATTERN.fullmatch(content):  # defence in depth: only digits and IP literals went in
        raise InvalidInputError("lua", content, "rendered record does not match the expected shape")
    return content


def parse_lua(content: str) -> tuple[RecordType, dict[str, int]]:
    """Inverse of :func:`render_lua`: record type and address -> weight. Raises
    ``PowerDnsError`` for content this adapter did not write."""
    match = LUA_PATTERN.fullmatch(content.strip())
    if match is None:
        raise PowerDnsError(f"LUA record is not a pickwrandom table written by this adapter: {content!r}")
    weights: dict[str, int] = {}
    for weight, address in ENTRY_PATTERN.findall(match.group(2)):
        canonical = validate_ip("lua", address)
        weights[canonical] = weights.get(canonical, 0) + int(weight)
    rrtype: RecordType = "A" if match.group(1) == "A" else "AAAA"
    return rrtype, weights


def rrset_patch(record: str, rrtype: RecordType, ttl: int, content: str | None) -> dict[str, Any]:
    """The PATCH body replacing (or, with ``content`` None, deleting) the VIP's LUA rrset."""
    rrset: dict[str, Any] = {"name": record, "type": "LUA"}
    if content is None:
        rrset["changetype"] = "DELETE"
    else:
        rrset.update(changetype="REPLACE", ttl=ttl, records=[{"content": content, "disabled": False}])
    return {"rrsets": [rrset]}


# --- settings -------------------------------------------------------------------------------


def _api_url(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidInputError(field, value, "must be 'http://host:port'")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise InvalidInputError(field, value, "must be 'http://host:port' with no path, query or credentials")
    if parts.username or parts.password or parts.hostname is None:
        raise InvalidInputError(field, value, "must be 'http://host:port' with no path, query or credentials")
    try:
        port = parts.port
    except ValueError as exc:
        raise InvalidInputError(field, value, "port must be in 1-65535") from exc
    host = validate_host(field, parts.hostname)
    return f"{parts.scheme}://{format_address(host, validate_port(field, port or 80))}"


def _dns_server(field: str, value: object) -> str:
    host, port = parse_address(field, value)
    return format_address(validate_ip(field, host), port)


def _env_name(field: str, value: object) -> str:
    if not isinstance(value, str) or not ENV_NAME_PATTERN.fullmatch(value):
        raise InvalidInputError(field, value, "must be an environment variable name (A-Z, 0-9, '_')")
    return value


class PowerDnsSettings(AdapterSettings):
    """Settings of a PowerDNS weighted-DNS load balancer (the operator's, but for ``addresses``).

    ``api_url``, ``dns_server`` and ``api_key_env`` name a URL, an address and an environment
    variable of the controller: they are set in the configuration file only. The key itself is
    read from the environment when the adapter is built, never while settings are validated.
    """

    model_config = ConfigDict(strict=True)
    vip_fields: ClassVar[frozenset[str]] = frozenset({"addresses"})

    api_url: Annotated[str, BeforeValidator(pydantic_rule(_api_url))] = Field(
        description="http://host:port of the PowerDNS webserver/API."
    )
    api_key: SecretStr | None = Field(None, description="The API key (prefer api_key_env).")
    api_key_env: Annotated[str, BeforeValidator(pydantic_rule(_env_name))] | None = Field(
        None, description="Environment variable of the controller that holds the API key."
    )
    server_id: Name = Field("localhost", description="API server id.")
    zone: Annotated[str, BeforeValidator(pydantic_rule(validate_dns_name))] = Field(
        description="The zone holding the record, e.g. example.test. (must exist)."
    )
    record: str = Field(description="The VIP's name, fully qualified or relative to the zone.")
    addresses: dict[Name, Annotated[str, BeforeValidator(pydantic_rule(validate_ip))]] = Field(
        default_factory=dict, description="DIP name -> IP literal, all IPv4 or all IPv6 (default: each DIP's host)."
    )
    dns_server: Annotated[str, BeforeValidator(pydantic_rule(_dns_server))] = Field(
        description="ip:port queried to verify each change."
    )
    ttl: int = Field(DEFAULT_TTL, ge=0, le=86_400, description="Seconds resolvers may cache an answer.")
    resolution: int = Field(DEFAULT_RESOLUTION, ge=1, le=1_000_000, description="Integer weight units per plan.")
    verify_queries: int = Field(3, ge=1, le=100, description="Queries after each change that must all resolve.")
    timeout: float = Field(2.0, gt=0, le=60, description="Seconds for each API call and DNS query.")

    @model_validator(mode="after")
    def _consistent(self) -> PowerDnsSettings:
        if (self.api_key is None) == (self.api_key_env is None):
            raise InvalidInputError("api_key", "<hidden>", "give api_key or api_key_env (exactly one)")
        if self.api_key is not None and not API_KEY_PATTERN.fullmatch(self.api_key.get_secret_value()):
            # never echo a secret back
            raise InvalidInputError("api_key", "<hidden>", "must be 1-256 printable characters, no spaces")
        record = self.record if self.record.endswith(".") else f"{self.record}.{self.zone}"
        record = validate_dns_name("record", record)
        if record != self.zone and not record.endswith("." + self.zone):
            raise InvalidInputError("record", self.record, f"must be inside zone {self.zone!r}")
        object.__setattr__(self, "record", record)
        if self.addresses:
            if len(set(self.addresses.values())) != len(self.addresses):
                raise InvalidInputError("addresses", dict(self.addresses), "two DIPs share an address")
            record_type(self.addresses)
        return self

    @classmethod
    def defaults_for(cls, dips: Sequence[DipConfig]) -> dict[str, Any]:
        return {"addresses": {d.name: d.host_port[0] for d in dips}}

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> PowerDnsSettings:
        """Validate raw settings; errors name ``adapter.settings.<field>``."""
        return parse_settings(cls, raw)

    @property
    def rrtype(self) -> RecordType:
        return record_type(self.addresses)

    @property
    def dns_address(self) -> tuple[str, int]:
        return parse_address("dns_server", self.dns_server)

    def api_key_from(self, environ: Mapping[str, str]) -> str:
        """The API key: ``api_key``, or the variable ``api_key_env`` names in ``environ``."""
        if self.api_key is not None:
            return self.api_key.get_secret_value()
        assert self.api_key_env is not None
        key = environ.get(self.api_key_env)
        if key is None:
            raise InvalidInputError("adapter.settings.api_key_env", self.api_key_env, "environment variable is not set")
        if not API_KEY_PATTERN.fullmatch(key):
            raise InvalidInputError("adapter.settings.api_key_env", self.api_key_env, "holds no usable API key")
        return key


# --- the adapter ---------------------------------------------------------------------------


class PowerDnsAdapter:
    """Pushes plans into a PowerDNS LUA ``pickwrandom`` record. See the module docstring."""

    name = "powerdns"

    Settings: ClassVar[type[PowerDnsSettings]] = PowerDnsSettings

    def __init__(self, settings: PowerDnsSettings, api_key: str, clock: Clock | None = None) -> None:
        if not settings.addresses:
            raise InvalidInputError("adapter.settings.addresses", {}, "must map DIP names to IP addresses")
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        self.last_error = ""
        self._rrtype = settings.rrtype
        self._ip_to_dip = {ip: dip for dip, ip in settings.addresses.items()}
        self._client = httpx.Client(
            base_url=settings.api_url,
            headers={"X-API-Key": api_key},
            timeout=settings.timeout,
            trust_env=False,
        )

    @classmethod
    def from_config(cls, raw: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> PowerDnsAdapter:
        settings = PowerDnsSettings.parse(raw)
        return cls(settings, settings.api_key_from(os.environ if environ is None else environ))

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> PowerDnsAdapter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def zone_path(self) -> str:
        s = self.settings
        return f"/api/v1/servers/{quote(s.server_id, safe='')}/zones/{quote(s.zone, safe='')}"

    # -- apply ----------------------------------------------------------------------------

    def render(self, plan: WeightPlan) -> tuple[str, dict[str, int], float]:
        """The LUA content for ``plan``, its integer weights and quantisation error."""
        unknown = sorted(set(plan.weights) - set(self.settings.addresses))
        if unknown:
            raise InvalidInputError("weights", unknown, "DIPs missing from adapter.settings.addresses")
        q = quantise(plan.weights, self.settings.resolution, low=1)
        return render_lua(self._rrtype, self.settings.addresses, q.weights), q.weights, q.error

    def apply(self, plan: WeightPlan) -> ApplyResult:
        started = self.clock.now()

        def result(ok: bool, weights: Mapping[str, int], error: float, reason: str = "") -> ApplyResult:
            return ApplyResult(ok, self.name, dict(weights), error, self.clock.now() - started, reason)

        try:
            content, lb_weights, error = self.render(plan)
        except InvalidInputError as exc:
            return result(False, {}, 0.0, str(exc))
        try:
            previous = self.read_rrset()
        except PowerDnsError as exc:
            return result(False, lb_weights, error, str(exc))
        try:
            self._patch(content)
        except PowerDnsError as exc:
            return result(False, lb_weights, error, str(exc))
        allowed = {self.settings.addresses[d] for d, w in lb_weights.items() if w > 0}
        problem = self.verify(allowed)
        if not problem:
            return result(True, lb_weights, error)
        try:
            self._patch(previous[0] if previous else None, ttl=previous[1] if previous else None)
            restored = "previous rrset restored" if previous else "rrset removed (there was none before)"
        except PowerDnsError as exc:
            restored = f"restoring the previous rrset failed too: {exc}"
        return result(False, lb_weights, error, f"{problem}; {restored}")

    def _patch(self, content: str | None, ttl: int | None = None) -> None:
        body = rrset_patch(self.settings.record, self._rrtype, ttl if ttl is not None else self.settings.ttl, content)
        try:
            response = self._client.patch(self.zone_path, json=body)
        except httpx.HTTPError as exc:
            raise PowerDnsError(f"PowerDNS API {self.settings.api_url} unreachable: {exc}") from exc
        if response.status_code not in (200, 204):
            raise PowerDnsError(f"PowerDNS API refused the change: HTTP {response.status_code} {response.text[:300]}")

    def verify(self, allowed: set[str]) -> str:
        """Query the name ``verify_queries`` times; ``""`` if every answer is NOERROR with
        addresses from ``allowed``, else what went wrong."""
        host, port = self.settings.dns_address
        rdtype = dns.rdatatype.A if self._rrtype == "A" else dns.rdatatype.AAAA
        for _ in range(self.settings.verify_queries):
            query = dns.message.make_query(self.settings.record, rdtype)
            try:
                answer = dns.query.udp(query, host, port=port, timeout=self.settings.timeout)
            except (dns.exception.DNSException, OSError) as exc:
                return f"{self.settings.record} did not resolve at {format_address(host, port)}: {exc}"
            if answer.rcode() != dns.rcode.NOERROR:
                return f"{self.settings.record} answered {dns.rcode.to_text(answer.rcode())} after the change"
            got = {str(rdata) for rrset in answer.answer if rrset.rdtype == rdtype for rdata in rrset}
            if not got or not got <= allowed:
                return f"{self.settings.record} answered {sorted(got)}, expected addresses from {sorted(allowed)}"
        return ""

    # -- read / check --------------------------------------------------------------------

    def read_rrset(self) -> tuple[str, int] | None:
        """(content, ttl) of the VIP's LUA rrset, or None if there is none. Raises
        ``PowerDnsError`` if the API cannot be asked or the zone does not exist."""
        try:
            response = self._client.get(self.zone_path)
        except httpx.HTTPError as exc:
            raise PowerDnsError(f"PowerDNS API {self.settings.api_url} unreachable: {exc}") from exc
        if response.status_code != 200:
            raise PowerDnsError(
                f"PowerDNS API: zone {self.settings.zone!r}: HTTP {response.status_code} {response.text[:200]}"
            )
        for rrset in response.json().get("rrsets", []):
            if rrset.get("name") == self.settings.record and rrset.get("type") == "LUA":
                records = [r for r in rrset.get("records", []) if not r.get("disabled")]
                if len(records) != 1:
                    raise PowerDnsError(f"{self.settings.record} has {len(records)} LUA records; expected one")
                return str(records[0]["content"]), int(rrset.get("ttl", self.settings.ttl))
        return None

    def read_lb_weights(self) -> dict[str, int]:
        """DIP -> integer weight in the record now (raises ``PowerDnsError``)."""
        current = self.read_rrset()
        if current is None:
            raise PowerDnsError(f"{self.settings.record} has no LUA record yet")
        rrtype, by_ip = parse_lua(current[0])
        if rrtype != self._rrtype:
            raise PowerDnsError(f"{self.settings.record} is a LUA {rrtype} record; expected {self._rrtype}")
        unknown = sorted(set(by_ip) - set(self._ip_to_dip))
        if unknown:
            raise PowerDnsError(f"{self.settings.record} names addresses no DIP has: {unknown}")
        return {self._ip_to_dip[ip]: w for ip, w in by_ip.items()}

    def read(self) -> dict[str, float]:
        """Fractions per configured DIP in the record now (0 for DIPs left out). ``{}`` if
        PowerDNS cannot be read (reason in ``last_error``); never raises."""
        try:
            weights = self.read_lb_weights()
        except PowerDnsError as exc:
            self.last_error = str(exc)
            return {}
        total = sum(weights.values())
        return {dip: (weights.get(dip, 0) / total if total else 0.0) for dip in self.settings.addresses}

    def check(self) -> CheckResult:
        try:
            current = self.read_rrset()
        except PowerDnsError as exc:
            return CheckResult(False, self.name, str(exc))
        if current is None:
            return CheckResult(
                True, self.name, f"zone {self.settings.zone} reachable; {self.settings.record} not set yet"
            )
        started = self.clock.now()
        problem = self.verify(set(self.settings.addresses.values()))
        if problem:
            return CheckResult(False, self.name, problem)
        took = (self.clock.now() - started) * 1000
        return CheckResult(True, self.name, f"{self.settings.record} resolves ({took:.1f} ms); record {current[0]!r}")
