"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Response, status
from fastapi.responses import PlainTextResponse

from knapsack_lb.api import metrics
from knapsack_lb.api.context import ApiContext, context
from knapsack_lb.api.schemas import HealthOut, ReadyOut

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthOut)
async def healthz() -> HealthOut:
    """The process serves requests."""
    return HealthOut(status="ok")


@router.get("/readyz", response_model=ReadyOut,
            responses={503: {"model": ReadyOut, "description": "The store does not answer."}})
async def readyz(response: Response, ctx: ApiContext = Depends(context)) -> ReadyOut:
    """Ready when the latency store answers a ping."""
    try:
        ok = bool(await asyncio.wait_for(ctx.store.ping(), timeout=2.0))
    except Exception:  # any failure means not ready
        ok = False
    if not ok:
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    return ReadyOut(status="ready" if ok else "unavailable", store=ok)


@router.get(
    "/metrics", response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text."}},
)
async def metrics_endpoint(ctx: ApiContext = Depends(context)) -> Response:
    """Prometheus metrics built from the store on this scrape (see knapsack_lb.api.metrics)."""
    snapshot = await metrics.gather(ctx.store, ctx.wall())
    return Response(metrics.render(snapshot), media_type="text/plain; version=0.0.4; charset=utf-8")
