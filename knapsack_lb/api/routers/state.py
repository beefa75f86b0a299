"""Reads: VIPs, DIPs, plans, curves, probe rounds, controller state and service status."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, status

from knapsack_lb.api import dashboard
from knapsack_lb.api.context import ApiContext, context, require_dip
from knapsack_lb.api.routers.common import NAME_RE, NOT_FOUND, UNAVAILABLE, VipName
from knapsack_lb.api.schemas import (
    ControllerStateOut,
    CurveOut,
    DashboardOut,
    MeasurementOut,
    PlanOut,
    StatusOut,
    VipSummary,
    json_safe,
)
from knapsack_lb.model import DipConfig, VipConfig
from knapsack_lb.store import CONTROLLER_LEASES, CONTROLLER_STATUS, PROBE_STATUS

router = APIRouter(prefix="/api/v1", responses={**UNAVAILABLE}, tags=["read"])


@router.get("/vips", response_model=list[VipSummary])
async def list_vips(ctx: ApiContext = Depends(context)) -> list[VipSummary]:
    """Every configured VIP with its overrides and current plan version."""
    out = []
    for name in sorted(await ctx.call(ctx.store.list_vips())):
        config = await ctx.call(ctx.store.get_vip(name))
        if config is None:
            continue
        plan = await ctx.call(ctx.store.current_plan(name))
        out.append(
            VipSummary(
                name=name, dips=[d.name for d in config.dips], paused=config.paused, dry_run=config.dry_run,
                pins=dict(config.pins), drained=list(config.drained), adapter=config.adapter.lb,
                plan_version=None if plan is None else plan.version,
            )
        )
    return out


@router.get("/vips/{vip}", response_model=VipConfig, responses=NOT_FOUND)
async def get_vip(vip: VipName, ctx: ApiContext = Depends(context)) -> VipConfig:
    """A VIP's stored configuration, overrides included."""
    return await ctx.load_vip(vip)


@router.get("/vips/{vip}/dips", response_model=list[DipConfig], responses=NOT_FOUND)
async def list_dips(vip: VipName, ctx: ApiContext = Depends(context)) -> list[DipConfig]:
    """The VIP's DIPs."""
    return list((await ctx.load_vip(vip)).dips)


@router.get("/vips/{vip}/plan", response_model=PlanOut, responses=NOT_FOUND)
async def current_plan(vip: VipName, ctx: ApiContext = Depends(context)) -> PlanOut:
    """The plan in force: weights, predicted latency, solver, reasons."""
    await ctx.load_vip(vip)
    plan = await ctx.call(ctx.store.current_plan(vip))
    if plan is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"VIP {vip!r} has no plan yet")
    return PlanOut.of(plan)


@router.get("/vips/{vip}/plans", response_model=list[PlanOut], responses=NOT_FOUND)
async def plan_history(
    vip: VipName,
    limit: Annotated[int, Query(ge=1, le=10_000, description="Most plans returned.")] = 50,
    ctx: ApiContext = Depends(context),
) -> list[PlanOut]:
    """Recent plans (as the store keeps them, oldest first)."""
    await ctx.load_vip(vip)
    plans = await ctx.call(ctx.store.plan_history(vip, limit=min(limit, ctx.settings.history_limit)))
    return [PlanOut.of(p) for p in plans]


@router.get("/vips/{vip}/curves", response_model=list[CurveOut], responses=NOT_FOUND)
async def curves(vip: VipName, ctx: ApiContext = Depends(context)) -> list[CurveOut]:
    """Fitted weight-latency curves with the points they were fitted on (KnapsackLB paper, section 4.2)."""
    config = await ctx.load_vip(vip)
    records = await ctx.call(ctx.store.curves(vip))
    current = {d.name for d in config.dips}
    return [CurveOut.of(records[d]) for d in sorted(records) if d in current]


@router.get("/vips/{vip}/measurements", response_model=list[MeasurementOut], responses=NOT_FOUND)
async def measurements(
    vip: VipName,
    dip: Annotated[str | None, Query(pattern=NAME_RE, max_length=63, description="Only this DIP.")] = None,
    since: Annotated[float | None, Query(allow_inf_nan=False, description="Rounds from this time on (s).")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000, description="Most rounds returned.")] = 100,
    ctx: ApiContext = Depends(context),
) -> list[MeasurementOut]:
    """Recent probe rounds, oldest first (latencies in seconds)."""
    config = await ctx.load_vip(vip)
    if dip is not None:
        require_dip(config, dip)
    rows = await ctx.call(ctx.store.measurements(vip, dip, since, min(limit, ctx.settings.history_limit)))
    return [MeasurementOut.of(m) for m in rows]


@router.get("/vips/{vip}/controller", response_model=ControllerStateOut, responses=NOT_FOUND)
async def controller_state(vip: VipName, ctx: ApiContext = Depends(context)) -> ControllerStateOut:
    """What the controller stored about the VIP, and which controller holds it."""
    await ctx.load_vip(vip)
    snap = await ctx.call(ctx.store.snapshot(vip))
    owner = await ctx.call(ctx.store.lease_owner(CONTROLLER_LEASES, vip))
    state = None if snap.controller_state is None else json_safe(dict(snap.controller_state))
    return ControllerStateOut(vip=vip, lease_owner=owner, remeasure_pending=bool(snap.remeasure), state=state)


@router.get("/status", response_model=StatusOut)
async def service_status(ctx: ApiContext = Depends(context)) -> StatusOut:
    """Live controllers and probe workers, as they last reported themselves."""
    controllers = await ctx.call(ctx.store.statuses(CONTROLLER_STATUS))
    probes = await ctx.call(ctx.store.statuses(PROBE_STATUS))
    vips = sorted(await ctx.call(ctx.store.list_vips()))
    return StatusOut(controllers=json_safe(controllers), probes=json_safe(probes), vips=vips)


@router.get("/vips/{vip}/dashboard", response_model=DashboardOut, responses=NOT_FOUND)
async def dashboard_data(vip: VipName, ctx: ApiContext = Depends(context)) -> DashboardOut:
    """What the dashboard draws: per DIP its curve, points, operating point and time series."""
    config = await ctx.load_vip(vip)
    return await ctx.call(dashboard.build(ctx.store, config, ctx.settings.history_limit))
