"""Writes on whole VIPs: create, replace, delete, pause, resume, dry run, re-measure all DIPs."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request, Response, status

from knapsack_lb.api.auth import require_token
from knapsack_lb.api.context import ApiContext, context, require_strict, unprocessable
from knapsack_lb.api.routers.common import NOT_FOUND, UNAVAILABLE, WRITE, VipName
from knapsack_lb.api.schemas import DryRunIn, Problem, RemeasureOut
from knapsack_lb.model import VipConfig

log = logging.getLogger(__name__)

router = APIRouter(prefix="/api/v1", dependencies=[Depends(require_token)], responses={**WRITE, **UNAVAILABLE},
                   tags=["write"])


def set_flag(name: str, value: bool) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        data[name] = value

    return change


@router.post("/vips", response_model=VipConfig, status_code=status.HTTP_201_CREATED,
             responses={409: {"model": Problem, "description": "The VIP exists."}})
async def create_vip(config: VipConfig, request: Request, ctx: ApiContext = Depends(context)) -> VipConfig:
    """Add a VIP at run time; its adapter must be one of the operator's load balancers."""
    await require_strict(request, VipConfig)
    ctx.check_vip(config, ["body"])
    async with ctx.write_lock:
        if await ctx.call(ctx.store.get_vip(config.name)) is not None:
            raise HTTPException(status.HTTP_409_CONFLICT, f"VIP {config.name!r} exists (PUT replaces it)")
        await ctx.call(ctx.store.put_vip(config))
    log.info("vip created", extra={"vip": config.name})
    return config


@router.put("/vips/{vip}", response_model=VipConfig)
async def replace_vip(
    vip: VipName, config: VipConfig, request: Request, ctx: ApiContext = Depends(context)
) -> VipConfig:
    """Create or replace a VIP's whole configuration."""
    await require_strict(request, VipConfig)
    if config.name != vip:
        raise unprocessable(["body", "name"], f"must equal the VIP in the path ({vip!r})", config.name)
    ctx.check_vip(config, ["body"])
    async with ctx.write_lock:
        await ctx.call(ctx.store.put_vip(config))
    log.info("vip replaced", extra={"vip": vip})
    return config


@router.delete("/vips/{vip}", status_code=status.HTTP_204_NO_CONTENT, responses=NOT_FOUND, response_class=Response)
async def delete_vip(vip: VipName, ctx: ApiContext = Depends(context)) -> Response:
    """Remove a VIP and everything stored about it."""
    async with ctx.write_lock:
        await ctx.load_vip(vip)
        await ctx.call(ctx.store.delete_vip(vip))
    log.info("vip deleted", extra={"vip": vip})
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/vips/{vip}/pause", response_model=VipConfig, responses=NOT_FOUND)
async def pause(vip: VipName, ctx: ApiContext = Depends(context)) -> VipConfig:
    """Stop computing plans for the VIP; the LB keeps its current weights."""
    return await ctx.update_vip(vip, set_flag("paused", True), ["path", "vip"])


@router.post("/vips/{vip}/resume", response_model=VipConfig, responses=NOT_FOUND)
async def resume(vip: VipName, ctx: ApiContext = Depends(context)) -> VipConfig:
    """Resume a paused VIP."""
    return await ctx.update_vip(vip, set_flag("paused", False), ["path", "vip"])


@router.put("/vips/{vip}/dry-run", response_model=VipConfig, responses=NOT_FOUND)
async def dry_run(vip: VipName, body: DryRunIn, ctx: ApiContext = Depends(context)) -> VipConfig:
    """Dry run on: plans are computed and stored but nothing is pushed to the LB."""
    return await ctx.update_vip(vip, set_flag("dry_run", body.enabled), ["body", "enabled"])


@router.post("/vips/{vip}/remeasure", response_model=RemeasureOut, status_code=status.HTTP_202_ACCEPTED,
             responses=NOT_FOUND)
async def remeasure_vip(vip: VipName, ctx: ApiContext = Depends(context)) -> RemeasureOut:
    """Ask the controller to re-measure every DIP of the VIP."""
    config = await ctx.load_vip(vip)
    names = [d.name for d in config.dips]
    for name in names:
        await ctx.call(ctx.store.request_remeasure(vip, name))
    log.info("remeasure requested", extra={"vip": vip, "dip": "*"})
    return RemeasureOut(vip=vip, dips=names)
