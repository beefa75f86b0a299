"""A real PowerDNS Authoritative server answering for a VIP's name with weighted DIP addresses.

Implements :class:`knapsack_lb.lab.testbed.lb_harness.LbTestbed` for DNS-based load balancing
(KnapsackLB paper, section 6.5). :class:`PdnsServer` starts Debian's ``pdns_server`` with a
private config dir, a fresh SQLite database (schema shipped by ``pdns-backend-sqlite3``),
LUA records and the REST API on free loopback ports, caches off so every query is drawn
anew. :class:`PdnsTestbed` creates the zone, gives each backend its own loopback address
(``127.0.0.10``, ``127.0.0.11``, ...) and sends DNS queries as "requests": the backend that
"served" a query is the one whose address came back.

How it fails: ``PdnsServer.start`` raises ``TimeoutError`` with the tail of the server log if
the API does not answer within ``start_timeout``; ``FileNotFoundError`` if PowerDNS or the
SQLite schema is not installed.
"""

from __future__ import annotations

import secrets
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import dns.exception
import dns.message
import dns.query
import dns.rcode
import dns.rdatatype
import httpx

from knapsack_lb.lab.procs import ManagedProcess, free_listening_port, require_binary, wait_for_port
from knapsack_lb.lab.testbed.lb_harness import RequestFailed, Sender
from knapsack_lb.names import validate_name

SCHEMA_PATHS = (
    Path("/usr/share/pdns-backend-sqlite3/schema/schema.sqlite3.sql"),
    Path("/usr/share/doc/pdns-backend-sqlite3/schema.sqlite3.sql"),
)


def sqlite_schema() -> str:
    """The gsqlite3 schema shipped by Debian's ``pdns-backend-sqlite3``."""
    for path in SCHEMA_PATHS:
        if path.exists():
            return path.read_text(encoding="utf-8")
    raise FileNotFoundError(
        f"no PowerDNS SQLite schema at {[str(p) for p in SCHEMA_PATHS]} (install pdns-backend-sqlite3)"
    )


def pdns_config(*, workdir: Path, dns_port: int, api_port: int, api_key: str, host: str = "127.0.0.1") -> str:
    """``pdns.conf`` for a throw-away server: gsqlite3, LUA records, API, no caches, no daemon."""
    lines = {
        "launch": "gsqlite3",
        "gsqlite3-database": str(workdir / "pdns.sqlite3"),
        "local-address": host,
        "local-port": str(dns_port),
        "api": "yes",
        "api-key": api_key,
        "webserver": "yes",
        "webserver-address": host,
        "webserver-port": str(api_port),
        "webserver-allow-from": "127.0.0.0/8",
        "enable-lua-records": "yes",
        "socket-dir": str(workdir),
        "guardian": "no",
        "daemon": "no",
        "disable-syslog": "yes",
        "loglevel": "4",
        "cache-ttl": "0",
        "query-cache-ttl": "0",
        "negquery-cache-ttl": "0",
        "zone-cache-refresh-interval": "0",
        "distributor-threads": "1",
        "receiver-threads": "1",
        "reuseport": "no",
    }
    return "".join(f"{key}={value}\n" for key, value in lines.items())


class PdnsServer:
    """``pdns_server`` on free loopback ports with its own config dir and SQLite database."""

    def __init__(self, workdir: Path, *, host: str = "127.0.0.1", start_timeout: float = 15.0) -> None:
        self.workdir = workdir
        self.host = host
        self.start_timeout = start_timeout
        self.dns_port = 0
        self.api_port = 0
        self.api_key = secrets.token_hex(16)
        self._proc: ManagedProcess | None = None

    @property
    def api_url(self) -> str:
        return f"http://{self.host}:{self.api_port}"

    def start(self) -> PdnsServer:
        binary = require_binary("pdns_server")
        self.workdir.mkdir(parents=True, exist_ok=True)
        database = self.workdir / "pdns.sqlite3"
        database.unlink(missing_ok=True)
        with sqlite3.connect(database) as connection:
            connection.executescript(sqlite_schema())
        connection.close()
        self.dns_port = free_listening_port(self.host)
        self.api_port = free_listening_port(self.host, taken=[self.dns_port])
        conf = pdns_config(workdir=self.workdir, dns_port=self.dns_port, api_port=self.api_port, api_key=self.api_key)
        (self.workdir / "pdns.conf").write_text(conf, encoding="utf-8")
        log = self.workdir / "pdns.log"
        self._proc = ManagedProcess([binary, f"--config-dir={self.workdir}"], log_path=log).start()
        try:
            wait_for_port(self.host, self.api_port, timeout=self.start_timeout)
            deadline = time.monotonic() + self.start_timeout
            while True:
                try:
                    if self.api("GET", "/api/v1/servers/localhost").status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError("API did not answer")
                time.sleep(0.05)
        except TimeoutError as exc:
            self.stop()
            tail = log.read_text(encoding="utf-8", errors="replace")[-2000:] if log.exists() else ""
            raise TimeoutError(f"pdns_server did not come up within {self.start_timeout} s ({exc}): {tail}") from exc

    def api(self, method: str, path: str, json: Any = None) -> httpx.Response:
        return httpx.request(
            method, self.api_url + path, json=json, headers={"X-API-Key": self.api_key}, timeout=5.0, trust_env=False
        )

    def create_zone(self, zone: str) -> None:
        """A native zone with SOA and one NS record (PowerDNS fills the SOA)."""
        body = {"name": zone, "kind": "Native", "nameservers": [f"ns1.{zone}"]}
        response = self.api("POST", "/api/v1/servers/localhost/zones", body)
        if response.status_code != 201:
            raise RuntimeError(f"creating zone {zone}: HTTP {response.status_code} {response.text[:300]}")

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None

    def __enter__(self) -> PdnsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class DnsSender:
    """One DNS query per ``send``; returns the backend whose address was answered.

    A timeout, a truncated or non-NOERROR answer (SERVFAIL after a broken record), or an
    address no backend has raises ``RequestFailed``.
    """

    def __init__(self, server: tuple[str, int], name: str, by_address: Mapping[str, str], timeout: float = 2.0) -> None:
        self.server = server
        self.name = name
        self.by_address = dict(by_address)
        self.timeout = timeout

    def send(self) -> str:
        query = dns.message.make_query(self.name, dns.rdatatype.A)
        try:
            answer = dns.query.udp(query, self.server[0], port=self.server[1], timeout=self.timeout)
        except (dns.exception.DNSException, OSError) as exc:
            raise RequestFailed(f"{type(exc).__name__}: {exc}") from exc
        if answer.rcode() != dns.rcode.NOERROR:
            raise RequestFailed(dns.rcode.to_text(answer.rcode()))
        addresses = [str(r) for rrset in answer.answer if rrset.rdtype == dns.rdatatype.A for r in rrset]
        if len(addresses) != 1 or addresses[0] not in self.by_address:
            raise RequestFailed(f"unexpected answer {addresses}")
        return self.by_address[addresses[0]]

    def close(self) -> None:
        pass


class PdnsTestbed:
    """PowerDNS answering for ``vip.klb.test.``; the ``powerdns`` adapter drives its LUA record."""

    lb_name = "dns"
    adapter_name = "powerdns"
    retries = 0
    zone = "klb.test."
    record = "vip.klb.test."

    def __init__(self, backends: Mapping[str, str], workdir: Path, *, ttl: int = 5) -> None:
        if not backends or len(backends) > 200:
            raise ValueError("a DNS testbed needs 1-200 backends")
        names = sorted(validate_name("backend", b) for b in backends)
        self.addresses = {name: f"127.0.0.{10 + i}" for i, name in enumerate(names)}
        self.ttl = ttl
        self.server = PdnsServer(workdir)

    @property
    def adapter_settings(self) -> dict[str, Any]:
        return {
            "api_url": self.server.api_url,
            "api_key": self.server.api_key,
            "zone": self.zone,
            "record": self.record,
            "addresses": dict(self.addresses),
            "dns_server": f"{self.server.host}:{self.server.dns_port}",
            "ttl": self.ttl,
        }

    def traffic_target(self) -> str:
        return f"dns://{self.server.host}:{self.server.dns_port}/{self.record}"

    def open_sender(self) -> Sender:
        by_address = {ip: name for name, ip in self.addresses.items()}
        return DnsSender((self.server.host, self.server.dns_port), self.record, by_address)

    def __enter__(self) -> PdnsTestbed:
        self.server.start()
        try:
            self.server.create_zone(self.zone)
            table = ",".join(f"{{1,'{ip}'}}" for ip in self.addresses.values())
            body = {
                "rrsets": [
                    {
                        "name": self.record,
                        "type": "LUA",
                        "ttl": self.ttl,
                        "changetype": "REPLACE",
                        "records": [{"content": f'A "pickwrandom({{{table}}})"', "disabled": False}],
                    }
                ]
            }
            response = self.server.api("PATCH", f"/api/v1/servers/localhost/zones/{self.zone}", body)
            if response.status_code != 204:
                raise RuntimeError(f"initial record: HTTP {response.status_code} {response.text[:300]}")
        except BaseException:
            self.server.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.server.stop()
