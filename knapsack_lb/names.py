"""Strict validation of every name that goes into a command, a key or a config file.

Names of VIPs, DIPs, backends, servers, clusters, zones and records end up in HAProxy
runtime commands (joined by ``;``), Nginx include files, Envoy JSON, DNS records and Redis
keys. Nothing that could end a command or a line, quote, or escape a path is allowed:
no ``;``, whitespace, newline, quote, ``/`` or ``\\``. Validation refuses; it never strips.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Annotated

from pydantic import BeforeValidator, ValidationInfo

from knapsack_lb.errors import InvalidInputError

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
HOSTNAME_PATTERN = re.compile(
    r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$"
)


def validate_name(field: str, value: object) -> str:
    """Return ``value`` if it is a safe identifier (letters, digits, ``.``, ``_``, ``-``; at most 63)."""
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise InvalidInputError(
            field,
            value,
            "must be 1-63 characters of letters, digits, '.', '_' or '-', starting with a letter or digit",
        )
    return value


def validate_host(field: str, value: object) -> str:
    """Return ``value`` if it is an IPv4/IPv6 literal or a DNS hostname (no ports, no brackets)."""
    if not isinstance(value, str) or not value:
        raise InvalidInputError(field, value, "must be an IP address or hostname")
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if not HOSTNAME_PATTERN.fullmatch(value):
        raise InvalidInputError(field, value, "must be an IP address or a DNS hostname")
    return value


def validate_port(field: str, value: object) -> int:
    """Return ``value`` as an int if it is a TCP/UDP port in 1-65535."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise InvalidInputError(field, value, "must be an integer port in 1-65535")
    return value


def parse_address(field: str, value: object) -> tuple[str, int]:
    """Parse ``host:port`` or ``[v6]:port`` into ``(host, port)``, validating both parts."""
    if not isinstance(value, str):
        raise InvalidInputError(field, value, "must be 'host:port' or '[ipv6]:port'")
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise InvalidInputError(field, value, "must be '[ipv6]:port'")
        port_text = rest[1:]
    else:
        host, sep, port_text = value.rpartition(":")
        if not sep or ":" in host:
            raise InvalidInputError(field, value, "must be 'host:port' (IPv6 in brackets: '[::1]:80')")
    if not port_text.isdigit():
        raise InvalidInputError(field, value, "port must be a number in 1-65535")
    return validate_host(field, host), validate_port(field, int(port_text))


def format_address(host: str, port: int) -> str:
    """Inverse of :func:`parse_address`: brackets IPv6 literals."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def validate_absolute_path(field: str, value: object) -> str:
    """Return ``value`` if it is an absolute path with nothing a shell, a config file or a
    command line could read as a separator: no whitespace, ``;``, quotes, NUL or control
    characters, no ``..`` component."""
    if (
        not isinstance(value, str)
        or not value.startswith("/")
        or any(c.isspace() or c in ";'\"\\`$\x00" or ord(c) < 32 or ord(c) == 127 for c in value)
        or ".." in value.split("/")
    ):
        raise InvalidInputError(
            field, value, "must be an absolute path without whitespace, quotes, ';', '$', '..' or control characters"
        )
    return value


def pydantic_rule(check: Callable[[str, object], object]) -> Callable[[object, ValidationInfo], object]:
    """A pydantic ``BeforeValidator`` function from one of the checks above (its message kept)."""

    def run(value: object, info: ValidationInfo) -> object:
        try:
            return check(info.field_name or "value", value)
        except InvalidInputError as exc:
            raise ValueError(exc.problem) from None

    return run


def _address(field: str, value: object) -> str:
    return format_address(*parse_address(field, value))


# pydantic field types with the rules above (settings models of adapters and configuration)
Name = Annotated[str, BeforeValidator(pydantic_rule(validate_name))]
Address = Annotated[str, BeforeValidator(pydantic_rule(_address))]
AbsolutePath = Annotated[str, BeforeValidator(pydantic_rule(validate_absolute_path))]
