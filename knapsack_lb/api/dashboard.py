"""The dashboard: per DIP its weight-latency curve (section 4.2) with the measured points and
the current operating point, and weights and probe latency over time.

The page is one HTML template (``knapsack_lb/templates/dashboard.html``) with the data of
the chosen VIP embedded as JSON, drawn by plotly.js. plotly.js is served by the API itself
from the ``plotly`` Python package (``/static/plotly.min.js``), so the page fetches nothing
from the internet; the browser refreshes the data from ``/api/v1/vips/{vip}/dashboard``.
"""

from __future__ import annotations

import functools
import html
import json
from importlib import resources
from string import Template

from knapsack_lb.api.metrics import apply_failures, dip_states
from knapsack_lb.api.schemas import CurveOut, DashboardOut, DipView, PlanOut, SeriesPoint, finite_or_none
from knapsack_lb.model import VipConfig
from knapsack_lb.store import LatencyStore


@functools.cache
def plotly_js() -> bytes:
    """plotly.js as shipped inside the plotly wheel (about 4.8 MB, read once)."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs().encode()


@functools.cache
def _template() -> Template:
    text = resources.files("knapsack_lb").joinpath("templates/dashboard.html").read_text()
    return Template(text)


async def build(store: LatencyStore, config: VipConfig, limit: int) -> DashboardOut:
    """Gather one VIP's dashboard data from the store."""
    vip = config.name
    snap = await store.snapshot(vip)
    history = await store.plan_history(vip, limit=limit)
    plan = snap.current_plan
    state = snap.controller_state or {}
    known = dip_states(state)
    in_force = snap.in_force
    views = []
    for dip in config.dips:
        name = dip.name
        rounds = await store.measurements(vip, name, None, limit)
        latest = snap.latest.get(name) or (rounds[-1] if rounds else None)
        record = snap.curves.get(name)
        views.append(
            DipView(
                name=name,
                weight=None if plan is None else finite_or_none(plan.weights.get(name)),
                predicted_latency=None if plan is None else finite_or_none(plan.predicted_latency.get(name)),
                measured_latency=None if latest is None else finite_or_none(latest.latency_mean),
                measured_weight=None if latest is None else finite_or_none(latest.weight),
                pinned=finite_or_none(config.pins.get(name)),
                drained=name in config.drained,
                lb_weight=None if in_force is None else finite_or_none(in_force.weights.get(name, 0.0)),
                probe_errors=0 if latest is None else latest.errors + latest.timeouts,
                probe_sent=0 if latest is None else latest.sent,
                learning=known.get(name, {}).get("learning", record is None),
                overloaded=known.get(name, {}).get("overloaded", False),
                curve=None if record is None else CurveOut.of(record),
                weight_series=[
                    SeriesPoint(time=p.computed_at, value=finite_or_none(p.weights.get(name))) for p in history
                ],
                latency_series=[SeriesPoint(time=m.time, value=finite_or_none(m.latency_mean)) for m in rounds],
            )
        )
    failures = apply_failures(state)
    return DashboardOut(
        vip=vip, plan=None if plan is None else PlanOut.of(plan), dips=views, paused=config.paused,
        dry_run=config.dry_run, lb_version=None if in_force is None else in_force.version,
        apply_error=str(state.get("apply_error") or ""), apply_failures=int(failures or 0))


def _json_for_script(value: object) -> str:
    """JSON safe inside a <script> element (no '</' or '<!--' can end it)."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_page(vips: list[str], chosen: str | None, data: DashboardOut | None, refresh: float) -> str:
    """The dashboard HTML for ``chosen`` with its data embedded."""
    links = " ".join(
        f'<a class="{"vip current" if v == chosen else "vip"}" href="/dashboard?vip={html.escape(v)}">'
        f"{html.escape(v)}</a>"
        for v in vips
    ) or "<em>no VIP configured</em>"
    return _template().substitute(
        vip_links=links,
        vip_title=html.escape(chosen or "-"),
        data_json=_json_for_script(None if data is None else data.model_dump(mode="json")),
        refresh_ms=str(int(refresh * 1000)),
    )
