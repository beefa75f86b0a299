"""What every route of the admin API shares: the store, the settings, the operator's load
balancers, one write lock, and the helpers that turn store and validation failures into HTTP.

Writes are serialised by the lock in this process (read-modify-write of one ``VipConfig``); two
API processes writing the same VIP at the same instant could lose one of the two updates.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import HTTPException, Request, status
from pydantic import BaseModel, ValidationError

from knapsack_lb.api.schemas import json_safe
from knapsack_lb.config import ApiSettings, LoadBalancerConfig, adapter_settings_for, error_field, error_message
from knapsack_lb.errors import InvalidInputError, short_repr
from knapsack_lb.model import DipConfig, VipConfig
from knapsack_lb.store import LatencyStore

T = TypeVar("T")
INPUT_ECHO_LIMIT = 200  # characters of a refused value a 422 body repeats


class StoreUnavailable(Exception):
    """The latency store did not answer."""


@dataclass
class ApiContext:
    """The state of one API process (``app.state.context``)."""

    store: LatencyStore
    settings: ApiSettings
    wall: Callable[[], float]
    load_balancers: Mapping[str, LoadBalancerConfig] = field(default_factory=dict)
    validate_adapters: bool = True
    write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def call(self, awaitable: Awaitable[T]) -> T:
        """Await a store call; an unreachable store becomes :class:`StoreUnavailable` (503)."""
        try:
            return await awaitable
        except (OSError, ConnectionError, TimeoutError) as exc:
            raise StoreUnavailable(str(exc)) from exc
        except Exception as exc:
            if type(exc).__module__.startswith("redis"):
                raise StoreUnavailable(str(exc)) from exc
            raise

    async def load_vip(self, vip: str) -> VipConfig:
        config = await self.call(self.store.get_vip(vip))
        if config is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"VIP {vip!r} not found")
        return config

    async def update_vip(self, vip: str, change: Callable[[dict[str, Any]], None], loc: list[str | int]) -> VipConfig:
        """Read, change and write one VIP under the write lock; the result is validated whole."""
        async with self.write_lock:
            config = await self.load_vip(vip)
            data = config.model_dump()
            change(data)
            try:
                updated = VipConfig.model_validate(data)
            except ValidationError as exc:
                raise validation_to_422(exc, loc) from exc
            if updated.dips != config.dips or updated.adapter != config.adapter:
                self.check_vip(updated, ["body"], previous=config)
            await self.call(self.store.put_vip(updated))
        return updated

    def check_vip(self, config: VipConfig, loc: list[str | int], previous: VipConfig | None = None) -> None:
        """What the operator allows: the DIP count, the DIP networks (for DIPs new since
        ``previous``), and a load balancer of theirs with only the settings a VIP may set.
        Nothing is contacted and nothing is built."""
        limit = self.settings.max_dips_per_vip
        if len(config.dips) > limit:
            problem = f"at most {limit} DIPs per VIP (api.max_dips_per_vip)"
            raise unprocessable([*loc, "dips"], problem, len(config.dips))
        known = set() if previous is None else set(previous.dips)
        for index, dip in enumerate(config.dips):
            if dip not in known:
                self.check_dip_address(dip, [*loc, "dips", index, "address"])
        if self.validate_adapters and config.adapter.lb is not None:
            try:
                adapter_settings_for(self.load_balancers, config)
            except InvalidInputError as exc:
                raise unprocessable([*loc, *exc.field.split(".")], exc.problem, exc.value) from exc

    def check_dip_address(self, dip: DipConfig, loc: list[str | int]) -> None:
        networks = self.settings.dip_networks
        if not networks:
            return
        host = dip.host_port[0]
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            raise unprocessable(loc, "must be an IP literal: api.dip_networks restricts DIP addresses", host) from None
        if not any(address in network for network in networks):
            shown = [str(n) for n in networks]
            raise unprocessable(loc, f"is outside the networks the operator allows (api.dip_networks: {shown})", host)


def context(request: Request) -> ApiContext:
    """FastAPI dependency: the process's :class:`ApiContext`."""
    found: ApiContext = request.app.state.context
    return found


def require_dip(config: VipConfig, dip: str) -> None:
    if dip not in {d.name for d in config.dips}:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"DIP {dip!r} not found in VIP {config.name!r}")


def clipped(value: object) -> Any:
    """A refused value as a 422 body repeats it: JSON-safe, and cut short when large."""
    safe = json_safe(value)
    try:
        text = json.dumps(safe)
    except (TypeError, ValueError):
        return short_repr(value, INPUT_ECHO_LIMIT)
    return safe if len(text) <= INPUT_ECHO_LIMIT else short_repr(value, INPUT_ECHO_LIMIT)


def unprocessable(loc: list[str | int], msg: str, value: object = None) -> HTTPException:
    """A 422 in FastAPI's own validation-error shape, naming the field."""
    return HTTPException(422, [{"loc": loc, "msg": msg, "type": "value_error", "input": clipped(value)}])


def validation_errors(errors: list[Any], prefix: list[str | int]) -> list[dict[str, Any]]:
    """Pydantic errors as 422 entries: the location (with the field a shared validator named),
    the message, and the input cut short."""
    out = []
    for error in errors:
        path, value = error_field(error)
        loc: list[str | int] = [*prefix, *(p for p in path.split(".") if p and p != "<root>")]
        out.append({"loc": loc, "msg": error_message(error), "type": error["type"], "input": clipped(value)})
    return out


def validation_to_422(exc: ValidationError, prefix: list[str | int]) -> HTTPException:
    return HTTPException(422, validation_errors(list(exc.errors()), prefix))


async def require_strict(request: Request, model: type[BaseModel]) -> None:
    """Re-validate the JSON body in strict mode: ``0`` is not ``false`` and ``"1"`` is not 1.

    FastAPI validates bodies in pydantic's lax mode; the shared configuration models stay lax
    for YAML files, and the API refuses what its schema does not allow.
    """
    try:
        model.model_validate_json(await request.body(), strict=True)
    except ValidationError as exc:
        raise validation_to_422(exc, ["body"]) from exc
