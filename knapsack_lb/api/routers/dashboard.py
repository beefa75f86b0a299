"""The dashboard page and the plotly.js it loads (served locally: nothing is fetched from the internet)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response
from fastapi.responses import HTMLResponse

from knapsack_lb.api import dashboard
from knapsack_lb.api.context import ApiContext, context

router = APIRouter(include_in_schema=False)


@router.get("/dashboard", response_class=HTMLResponse)
async def dashboard_page(vip: str | None = None, ctx: ApiContext = Depends(context)) -> HTMLResponse:
    names = sorted(await ctx.call(ctx.store.list_vips()))
    chosen = vip if vip in names else (names[0] if names else None)
    data = None
    if chosen is not None:
        config = await ctx.call(ctx.store.get_vip(chosen))
        if config is not None:
            data = await ctx.call(dashboard.build(ctx.store, config, ctx.settings.history_limit))
    return HTMLResponse(dashboard.render_page(names, chosen, data, ctx.settings.dashboard_refresh))


@router.get("/static/plotly.min.js")
async def plotly_js() -> Response:
    return Response(dashboard.plotly_js(), media_type="application/javascript",
                    headers={"Cache-Control": "public, max-age=86400"})


@router.get("/")
async def root() -> Response:
    return Response(status_code=307, headers={"Location": "/dashboard"})
