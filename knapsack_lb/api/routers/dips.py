"""Writes on one DIP of a VIP: add, remove, pin, drain, re-measure."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request, status

from knapsack_lb.api.auth import require_token
from knapsack_lb.api.context import ApiContext, context, require_dip, require_strict
from knapsack_lb.api.routers.common import NOT_FOUND, UNAVAILABLE, WRITE, DipName, VipName
from knapsack_lb.api.schemas import PinIn, Problem, RemeasureOut
from knapsack_lb.model import DipConfig, VipConfig

log = logging.getLogger(__name__)

router = APIRouter(prefix="/api/v1", dependencies=[Depends(require_token)], responses={**WRITE, **UNAVAILABLE},
                   tags=["write"])


@router.post("/vips/{vip}/dips", response_model=VipConfig, status_code=status.HTTP_201_CREATED,
             responses={**NOT_FOUND, 409: {"model": Problem, "description": "The DIP exists."}})
async def add_dip(vip: VipName, dip: DipConfig, request: Request, ctx: ApiContext = Depends(context)) -> VipConfig:
    """Add a DIP to a VIP at run time; the controller measures it before giving it a share."""
    await require_strict(request, DipConfig)
    ctx.check_dip_address(dip, ["body", "address"])
    config = await ctx.load_vip(vip)
    if dip.name in {d.name for d in config.dips}:
        raise HTTPException(status.HTTP_409_CONFLICT, f"DIP {dip.name!r} exists in VIP {vip!r}")

    def change(data: dict[str, Any]) -> None:
        data["dips"] = [*data["dips"], dip.model_dump()]

    return await ctx.update_vip(vip, change, ["body"])


@router.delete("/vips/{vip}/dips/{dip}", response_model=VipConfig, responses=NOT_FOUND)
async def remove_dip(vip: VipName, dip: DipName, ctx: ApiContext = Depends(context)) -> VipConfig:
    """Remove a DIP (and its pin and drain)."""
    require_dip(await ctx.load_vip(vip), dip)

    def change(data: dict[str, Any]) -> None:
        data["dips"] = [d for d in data["dips"] if d["name"] != dip]
        data["pins"] = {k: v for k, v in data["pins"].items() if k != dip}
        data["drained"] = [d for d in data["drained"] if d != dip]
        mapping = data["adapter"]["settings"]
        for key, value in list(mapping.items()):
            if isinstance(value, dict) and dip in value:  # the DIP's entry in the VIP's server mapping
                mapping[key] = {k: v for k, v in value.items() if k != dip}

    return await ctx.update_vip(vip, change, ["path", "dip"])


@router.put("/vips/{vip}/dips/{dip}/pin", response_model=VipConfig, responses=NOT_FOUND)
async def pin(vip: VipName, dip: DipName, body: PinIn, ctx: ApiContext = Depends(context)) -> VipConfig:
    """Hold a DIP at a fixed weight; the solver shares the rest among the others."""
    require_dip(await ctx.load_vip(vip), dip)

    def change(data: dict[str, Any]) -> None:
        data["pins"] = {**data["pins"], dip: body.weight}

    return await ctx.update_vip(vip, change, ["body", "weight"])


@router.delete("/vips/{vip}/dips/{dip}/pin", response_model=VipConfig, responses=NOT_FOUND)
async def unpin(vip: VipName, dip: DipName, ctx: ApiContext = Depends(context)) -> VipConfig:
    """Let the solver choose the DIP's weight again."""
    require_dip(await ctx.load_vip(vip), dip)

    def change(data: dict[str, Any]) -> None:
        data["pins"] = {k: v for k, v in data["pins"].items() if k != dip}

    return await ctx.update_vip(vip, change, ["path", "dip"])


@router.put("/vips/{vip}/dips/{dip}/drain", response_model=VipConfig, responses=NOT_FOUND)
async def drain(vip: VipName, dip: DipName, ctx: ApiContext = Depends(context)) -> VipConfig:
    """Hold a DIP at weight 0 (no new connections), e.g. before maintenance; a drain wins over a pin."""
    require_dip(await ctx.load_vip(vip), dip)

    def change(data: dict[str, Any]) -> None:
        if dip not in data["drained"]:
            data["drained"] = [*data["drained"], dip]

    return await ctx.update_vip(vip, change, ["path", "dip"])


@router.delete("/vips/{vip}/dips/{dip}/drain", response_model=VipConfig, responses=NOT_FOUND)
async def undrain(vip: VipName, dip: DipName, ctx: ApiContext = Depends(context)) -> VipConfig:
    """Return a drained DIP to service (the controller ramps it up)."""
    require_dip(await ctx.load_vip(vip), dip)

    def change(data: dict[str, Any]) -> None:
        data["drained"] = [d for d in data["drained"] if d != dip]

    return await ctx.update_vip(vip, change, ["path", "dip"])


@router.post("/vips/{vip}/dips/{dip}/remeasure", response_model=RemeasureOut, status_code=status.HTTP_202_ACCEPTED,
             responses=NOT_FOUND)
async def remeasure_dip(vip: VipName, dip: DipName, ctx: ApiContext = Depends(context)) -> RemeasureOut:
    """Ask the controller to re-measure one DIP's curve on its next step."""
    require_dip(await ctx.load_vip(vip), dip)
    await ctx.call(ctx.store.request_remeasure(vip, dip))
    log.info("remeasure requested", extra={"vip": vip, "dip": dip})
    return RemeasureOut(vip=vip, dips=[dip])
