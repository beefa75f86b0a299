"""The admin API (FastAPI): read everything, write only configuration and operator overrides.

KnapsackLB (section 5) keeps every piece of state in the latency store;
this API is a window on it. Reads return VIPs, DIPs, the current plan with its reasons, the
plan history, fitted curves with their measurement points, recent probe rounds and the
status of controllers and probe workers. Writes change a VIP's stored ``VipConfig`` (add /
remove VIPs and DIPs, pause, dry run, pin, drain) or ask for a re-measurement; the
controller picks them up on its next step, so they survive a restart of any process.

Writes are serialised by a lock in this process (read-modify-write of one ``VipConfig``); two
API processes writing the same VIP at the same instant could lose one of the two updates.
Every write needs the bearer token (:mod:`knapsack_lb.api.auth`). Invalid input gets 422
with the field's location (FastAPI's ``HTTPValidationError`` shape), unknown names 404, a
duplicate 409, and a store outage 503.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Path, Query, Request, Response, status
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from adapters.base import make_adapter
from knapsack_lb.api import dashboard, metrics
from knapsack_lb.api.auth import token_checker
from knapsack_lb.api.schemas import (
    ControllerStateOut,
    CurveOut,
    DashboardOut,
    DryRunIn,
    HealthOut,
    MeasurementOut,
    PinIn,
    PlanOut,
    Problem,
    ReadyOut,
    RemeasureOut,
    StatusOut,
    VipSummary,
    json_safe,
)
from knapsack_lb.clock import SystemClock
from knapsack_lb.config import ApiSettings
from knapsack_lb.errors import InvalidInputError
from knapsack_lb.model import DipConfig, VipConfig
from knapsack_lb.names import NAME_PATTERN
from knapsack_lb.store import LatencyStore

log = logging.getLogger(__name__)

CONTROLLER_GROUP = "controller"
CONTROLLER_STATUS = "controller"
PROBE_STATUS = "probe"

NAME_RE = NAME_PATTERN.pattern
VipName = Annotated[str, Path(pattern=NAME_RE, max_length=63, description="VIP name.")]
DipName = Annotated[str, Path(pattern=NAME_RE, max_length=63, description="DIP name.")]

NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": Problem, "description": "Unknown VIP or DIP."}}
UNAVAILABLE: dict[int | str, dict[str, Any]] = {503: {"model": Problem, "description": "The store is unreachable."}}
WRITE: dict[int | str, dict[str, Any]] = {
    400: {"model": Problem, "description": "The body is not JSON (not UTF-8, or cut off)."},
    401: {"model": Problem, "description": "No bearer token sent."},
    403: {"model": Problem, "description": "Wrong token, or no token configured (read-only API)."},
}


class StoreUnavailable(Exception):
    """The latency store did not answer."""


def unprocessable(loc: list[str | int], msg: str, value: object = None) -> HTTPException:
    """A 422 in FastAPI's own validation-error shape, naming the field."""
    return HTTPException(
        422,
        [{"loc": loc, "msg": msg, "type": "value_error", "input": json_safe(value)}],
    )


def validation_to_422(exc: ValidationError, prefix: list[str | int]) -> HTTPException:
    from knapsack_lb.config import error_message

    errors = [
        {"loc": [*prefix, *e["loc"]], "msg": error_message(e), "type": e["type"], "input": json_safe(e.get("input"))}
        for e in exc.errors()
    ]
    return HTTPException(422, errors)


async def require_strict(request: Request, model: type[BaseModel]) -> None:
    """Re-validate the JSON body in strict mode: ``0`` is not ``false`` and ``"1"`` is not 1.

    FastAPI validates bodies in pydantic's lax mode; the shared configuration models stay lax
    for YAML files, and the API refuses what its schema does not allow.
    """
    try:
        model.model_validate_json(await request.body(), strict=True)
    except ValidationError as exc:
        raise validation_to_422(exc, ["body"]) from exc


def check_adapter(config: VipConfig) -> None:
    """The VIP's adapter must exist and accept its settings (nothing is contacted)."""
    try:
        make_adapter(config.adapter.name, config.adapter.settings)
    except InvalidInputError as exc:
        field = exc.field.removeprefix("adapter.")
        raise unprocessable(["body", "adapter", *field.split(".")], exc.problem, exc.value) from exc
    except Exception as exc:  # any refusal by a third-party adapter is bad input
        raise unprocessable(["body", "adapter", "settings"], f"adapter refused its settings: {exc}") from exc


def allowed_methods(app: FastAPI, path: str) -> list[str]:
    """Every method some route serves at ``path``."""
    methods: set[str] = set()
    for route in app.routes:
        if isinstance(route, APIRoute) and route.path_regex.match(path):
            methods |= set(route.methods or ())
    return sorted(methods)


# The model validators check names and addresses in code (knapsack_lb.names); the same rules as
# JSON-schema patterns make the OpenAPI schema say what is accepted.
PORT_RE = r"([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
LABEL_RE = r"[A-Za-z0-9]([A-Za-z0-9-]{0,20}[A-Za-z0-9])?"
ADDRESS_RE = rf"^({LABEL_RE}(\.{LABEL_RE}){{0,3}}|\[::1\]):{PORT_RE}$"


def openapi_with_name_rules(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema plus the name and address rules of VipConfig and DipConfig."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = schema.get("components", {}).get("schemas", {})
    for key, model in components.items():
        props = model.get("properties", {})
        if not key.startswith(("VipConfig", "DipConfig")):
            continue
        if "name" in props:
            props["name"].update(pattern=NAME_RE, maxLength=63)
        if key.startswith("DipConfig") and "address" in props:
            props["address"].update(pattern=ADDRESS_RE, maxLength=120)
        if key.startswith("VipConfig") and "drained" in props:
            props["drained"].setdefault("items", {}).update(pattern=NAME_RE)
        if key.startswith("VipConfig") and "pins" in props:
            props["pins"]["propertyNames"] = {"pattern": NAME_RE}
    app.openapi_schema = schema
    return schema


def create_app(
    store: LatencyStore,
    settings: ApiSettings | None = None,
    *,
    token: str | None = None,
    wall: Callable[[], float] | None = None,
    validate_adapters: bool = True,
) -> FastAPI:
    """The admin API over ``store``. ``token`` guards every write (None: read-only API);
    ``wall`` gives the wall-clock time used for ages in metrics (seconds since the epoch)."""
    settings = settings or ApiSettings()
    now = wall or SystemClock().wall
    write_lock = asyncio.Lock()
    app = FastAPI(
        title="knapsack-lb admin API",
        version="1",
        description="Read the controller's state (plans, curves, probe rounds); change VIPs and operator overrides. "
        "Writes need `Authorization: Bearer <token>`.",
    )
    app.state.store = store
    app.state.settings = settings
    require_token = Depends(token_checker(token))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        headers = dict(exc.headers or {})
        if exc.status_code == status.HTTP_405_METHOD_NOT_ALLOWED:
            # One path served by several routes (GET and PUT ...): Allow lists them all.
            headers["Allow"] = ", ".join(allowed_methods(app, request.url.path))
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(StoreUnavailable)
    async def _store_down(request: Request, exc: StoreUnavailable) -> JSONResponse:
        return JSONResponse({"detail": f"the latency store is unreachable: {exc}"}, status_code=503)

    async def call(coro: Any) -> Any:
        try:
            return await coro
        except (OSError, ConnectionError, TimeoutError) as exc:
            raise StoreUnavailable(str(exc)) from exc
        except Exception as exc:
            if type(exc).__module__.startswith("redis"):
                raise StoreUnavailable(str(exc)) from exc
            raise

    async def load_vip(vip: str) -> VipConfig:
        config: VipConfig | None = await call(store.get_vip(vip))
        if config is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"VIP {vip!r} not found")
        return config

    def require_dip(config: VipConfig, dip: str) -> None:
        if dip not in {d.name for d in config.dips}:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"DIP {dip!r} not found in VIP {config.name!r}")

    async def update_vip(vip: str, change: Callable[[dict[str, Any]], None], loc: list[str | int]) -> VipConfig:
        async with write_lock:
            config = await load_vip(vip)
            data = config.model_dump()
            change(data)
            try:
                updated = VipConfig.model_validate(data)
            except ValidationError as exc:
                raise validation_to_422(exc, loc) from exc
            await call(store.put_vip(updated))
        log.info("vip updated", extra={"vip": vip})
        return updated

    # --- health ---------------------------------------------------------------------------
    @app.get("/healthz", response_model=HealthOut, tags=["health"])
    async def healthz() -> HealthOut:
        """The process serves requests."""
        return HealthOut(status="ok")

    @app.get(
        "/readyz", response_model=ReadyOut, tags=["health"],
        responses={503: {"model": ReadyOut, "description": "The store does not answer."}},
    )
    async def readyz(response: Response) -> ReadyOut:
        """Ready when the latency store answers a ping."""
        try:
            ok = bool(await asyncio.wait_for(store.ping(), timeout=2.0))
        except Exception:  # any failure means not ready
            ok = False
        if not ok:
            response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
        return ReadyOut(status="ready" if ok else "unavailable", store=ok)

    @app.get(
        "/metrics", response_class=PlainTextResponse, tags=["health"],
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text."}},
    )
    async def metrics_endpoint() -> Response:
        """Prometheus metrics built from the store on this scrape (see knapsack_lb.api.metrics)."""
        snapshot = await metrics.gather(store, now())
        return Response(metrics.render(snapshot), media_type="text/plain; version=0.0.4; charset=utf-8")

    # --- reads ------------------------------------------------------------------------------
    api = APIRouter(prefix="/api/v1", responses={**UNAVAILABLE})

    @api.get("/vips", response_model=list[VipSummary], tags=["read"])
    async def list_vips() -> list[VipSummary]:
        """Every configured VIP with its overrides and current plan version."""
        out = []
        for name in sorted(await call(store.list_vips())):
            config = await call(store.get_vip(name))
            if config is None:
                continue
            plan = await call(store.current_plan(name))
            out.append(
                VipSummary(
                    name=name, dips=[d.name for d in config.dips], paused=config.paused, dry_run=config.dry_run,
                    pins=dict(config.pins), drained=list(config.drained), adapter=config.adapter.name,
                    plan_version=None if plan is None else plan.version,
                )
            )
        return out

    @api.get("/vips/{vip}", response_model=VipConfig, responses=NOT_FOUND, tags=["read"])
    async def get_vip(vip: VipName) -> VipConfig:
        """A VIP's stored configuration, overrides included."""
        return await load_vip(vip)

    @api.get("/vips/{vip}/dips", response_model=list[DipConfig], responses=NOT_FOUND, tags=["read"])
    async def list_dips(vip: VipName) -> list[DipConfig]:
        """The VIP's DIPs."""
        return list((await load_vip(vip)).dips)

    @api.get("/vips/{vip}/plan", response_model=PlanOut, responses=NOT_FOUND, tags=["read"])
    async def current_plan(vip: VipName) -> PlanOut:
        """The plan in force: weights, predicted latency, solver, reasons."""
        await load_vip(vip)
        plan = await call(store.current_plan(vip))
        if plan is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"VIP {vip!r} has no plan yet")
        return PlanOut.of(plan)

    @api.get("/vips/{vip}/plans", response_model=list[PlanOut], responses=NOT_FOUND, tags=["read"])
    async def plan_history(
        vip: VipName, limit: Annotated[int, Query(ge=1, le=10_000, description="Most plans returned.")] = 50
    ) -> list[PlanOut]:
        """Recent plans (as the store keeps them, oldest first)."""
        await load_vip(vip)
        plans = await call(store.plan_history(vip, limit=min(limit, settings.history_limit)))
        return [PlanOut.of(p) for p in plans]

    @api.get("/vips/{vip}/curves", response_model=list[CurveOut], responses=NOT_FOUND, tags=["read"])
    async def curves(vip: VipName) -> list[CurveOut]:
        """Fitted weight-latency curves with the points they were fitted on (section 4.2)."""
        await load_vip(vip)
        records = await call(store.curves(vip))
        return [CurveOut.of(records[d]) for d in sorted(records)]

    @api.get("/vips/{vip}/measurements", response_model=list[MeasurementOut], responses=NOT_FOUND, tags=["read"])
    async def measurements(
        vip: VipName,
        dip: Annotated[str | None, Query(pattern=NAME_RE, max_length=63, description="Only this DIP.")] = None,
        since: Annotated[float | None, Query(allow_inf_nan=False, description="Rounds from this time on (s).")] = None,
        limit: Annotated[int, Query(ge=1, le=10_000, description="Most rounds returned.")] = 100,
    ) -> list[MeasurementOut]:
        """Recent probe rounds, oldest first (latencies in seconds)."""
        config = await load_vip(vip)
        if dip is not None:
            require_dip(config, dip)
        rows = await call(store.measurements(vip, dip, since, min(limit, settings.history_limit)))
        return [MeasurementOut.of(m) for m in rows]

    @api.get("/vips/{vip}/controller", response_model=ControllerStateOut, responses=NOT_FOUND, tags=["read"])
    async def controller_state(vip: VipName) -> ControllerStateOut:
        """What the controller stored about the VIP, and which controller holds it."""
        await load_vip(vip)
        snap = await call(store.snapshot(vip))
        owner = await call(store.lease_owner(CONTROLLER_GROUP, vip))
        state = None if snap.controller_state is None else json_safe(dict(snap.controller_state))
        return ControllerStateOut(vip=vip, lease_owner=owner, remeasure_pending=bool(snap.remeasure), state=state)

    @api.get("/status", response_model=StatusOut, tags=["read"])
    async def service_status() -> StatusOut:
        """Live controllers and probe workers, as they last reported themselves."""
        controllers = await call(store.statuses(CONTROLLER_STATUS))
        probes = await call(store.statuses(PROBE_STATUS))
        vips = sorted(await call(store.list_vips()))
        return StatusOut(controllers=json_safe(controllers), probes=json_safe(probes), vips=vips)

    @api.get("/vips/{vip}/dashboard", response_model=DashboardOut, responses=NOT_FOUND, tags=["read"])
    async def dashboard_data(vip: VipName) -> DashboardOut:
        """What the dashboard draws: per DIP its curve, points, operating point and time series."""
        config = await load_vip(vip)
        return await call(dashboard.build(store, config, settings.history_limit))

    # --- writes -----------------------------------------------------------------------------
    write = APIRouter(prefix="/api/v1", dependencies=[require_token], responses={**WRITE, **UNAVAILABLE})

    @write.post(
        "/vips", response_model=VipConfig, status_code=status.HTTP_201_CREATED, tags=["write"],
        responses={409: {"model": Problem, "description": "The VIP exists."}},
    )
    async def create_vip(config: VipConfig, request: Request) -> VipConfig:
        """Add a VIP at run time."""
        await require_strict(request, VipConfig)
        if validate_adapters:
            check_adapter(config)
        async with write_lock:
            if await call(store.get_vip(config.name)) is not None:
                raise HTTPException(status.HTTP_409_CONFLICT, f"VIP {config.name!r} exists (PUT replaces it)")
            await call(store.put_vip(config))
        log.info("vip created", extra={"vip": config.name})
        return config

    @write.put("/vips/{vip}", response_model=VipConfig, tags=["write"])
    async def replace_vip(vip: VipName, config: VipConfig, request: Request) -> VipConfig:
        """Create or replace a VIP's whole configuration."""
        await require_strict(request, VipConfig)
        if config.name != vip:
            raise unprocessable(["body", "name"], f"must equal the VIP in the path ({vip!r})", config.name)
        if validate_adapters:
            check_adapter(config)
        async with write_lock:
            await call(store.put_vip(config))
        log.info("vip replaced", extra={"vip": vip})
        return config

    @write.delete(
        "/vips/{vip}", status_code=status.HTTP_204_NO_CONTENT, responses=NOT_FOUND, tags=["write"],
        response_class=Response,
    )
    async def delete_vip(vip: VipName) -> Response:
        """Remove a VIP and everything stored about it."""
        async with write_lock:
            await load_vip(vip)
            await call(store.delete_vip(vip))
        log.info("vip deleted", extra={"vip": vip})
        return Response(status_code=status.HTTP_204_NO_CONTENT)

    @write.post(
        "/vips/{vip}/dips", response_model=VipConfig, status_code=status.HTTP_201_CREATED, tags=["write"],
        responses={**NOT_FOUND, 409: {"model": Problem, "description": "The DIP exists."}},
    )
    async def add_dip(vip: VipName, dip: DipConfig, request: Request) -> VipConfig:
        """Add a DIP to a VIP at run time; the controller measures it (Algorithm 1) before using it."""
        await require_strict(request, DipConfig)
        config = await load_vip(vip)
        if dip.name in {d.name for d in config.dips}:
            raise HTTPException(status.HTTP_409_CONFLICT, f"DIP {dip.name!r} exists in VIP {vip!r}")

        def change(data: dict[str, Any]) -> None:
            data["dips"] = [*data["dips"], dip.model_dump()]

        return await update_vip(vip, change, ["body"])

    @write.delete("/vips/{vip}/dips/{dip}", response_model=VipConfig, responses=NOT_FOUND, tags=["write"])
    async def remove_dip(vip: VipName, dip: DipName) -> VipConfig:
        """Remove a DIP (and its pin and drain)."""
        require_dip(await load_vip(vip), dip)

        def change(data: dict[str, Any]) -> None:
            data["dips"] = [d for d in data["dips"] if d["name"] != dip]
            data["pins"] = {k: v for k, v in data["pins"].items() if k != dip}
            data["drained"] = [d for d in data["drained"] if d != dip]

        return await update_vip(vip, change, ["path", "dip"])

    def flag(name: str, value: bool) -> Callable[[dict[str, Any]], None]:
        def change(data: dict[str, Any]) -> None:
            data[name] = value

        return change

    @write.post("/vips/{vip}/pause", response_model=VipConfig, responses=NOT_FOUND, tags=["write"])
    async def pause(vip: VipName) -> VipConfig:
        """Stop computing plans for the VIP; the LB keeps its current weights."""
        return await update_vip(vip, flag("paused", True), ["path", "vip"])

    @write.post("/vips/{vip}/resume", response_model=VipConfig, responses=NOT_FOUND, tags=["write"])
    async def resume(vip: VipName) -> VipConfig:
        """Resume a paused VIP."""
        return await update_vip(vip, flag("paused", False), ["path", "vip"])

    @write.put("/vips/{vip}/dry-run", response_model=VipConfig, responses=NOT_FOUND, tags=["write"])
    async def dry_run(vip: VipName, body: DryRunIn) -> VipConfig:
        """Dry run on: plans are computed and stored but nothing is pushed to the LB."""
        return await update_vip(vip, flag("dry_run", body.enabled), ["body", "enabled"])

    @write.put("/vips/{vip}/dips/{dip}/pin", response_model=VipConfig, responses=NOT_FOUND, tags=["write"])
    async def pin(vip: VipName, dip: DipName, body: PinIn) -> VipConfig:
        """Hold a DIP at a fixed weight; the solver shares the rest among the others."""
        require_dip(await load_vip(vip), dip)

        def change(data: dict[str, Any]) -> None:
            data["pins"] = {**data["pins"], dip: body.weight}

        return await update_vip(vip, change, ["body", "weight"])

    @write.delete("/vips/{vip}/dips/{dip}/pin", response_model=VipConfig, responses=NOT_FOUND, tags=["write"])
    async def unpin(vip: VipName, dip: DipName) -> VipConfig:
        """Let the solver choose the DIP's weight again."""
        require_dip(await load_vip(vip), dip)

        def change(data: dict[str, Any]) -> None:
            data["pins"] = {k: v for k, v in data["pins"].items() if k != dip}

        return await update_vip(vip, change, ["path", "dip"])

    @write.put("/vips/{vip}/dips/{dip}/drain", response_model=VipConfig, responses=NOT_FOUND, tags=["write"])
    async def drain(vip: VipName, dip: DipName) -> VipConfig:
        """Hold a DIP at weight 0 (no new connections), e.g. before maintenance."""
        require_dip(await load_vip(vip), dip)

        def change(data: dict[str, Any]) -> None:
            if dip not in data["drained"]:
                data["drained"] = [*data["drained"], dip]

        return await update_vip(vip, change, ["path", "dip"])

    @write.delete("/vips/{vip}/dips/{dip}/drain", response_model=VipConfig, responses=NOT_FOUND, tags=["write"])
    async def undrain(vip: VipName, dip: DipName) -> VipConfig:
        """Return a drained DIP to service (the controller ramps it up)."""
        require_dip(await load_vip(vip), dip)

        def change(data: dict[str, Any]) -> None:
            data["drained"] = [d for d in data["drained"] if d != dip]

        return await update_vip(vip, change, ["path", "dip"])

    @write.post(
        "/vips/{vip}/dips/{dip}/remeasure", response_model=RemeasureOut, status_code=status.HTTP_202_ACCEPTED,
        responses=NOT_FOUND, tags=["write"],
    )
    async def remeasure_dip(vip: VipName, dip: DipName) -> RemeasureOut:
        """Ask the controller to re-measure one DIP's curve (Algorithm 1) on its next step."""
        require_dip(await load_vip(vip), dip)
        await call(store.request_remeasure(vip, dip))
        log.info("remeasure requested", extra={"vip": vip, "dip": dip})
        return RemeasureOut(vip=vip, dips=[dip])

    @write.post(
        "/vips/{vip}/remeasure", response_model=RemeasureOut, status_code=status.HTTP_202_ACCEPTED,
        responses=NOT_FOUND, tags=["write"],
    )
    async def remeasure_vip(vip: VipName) -> RemeasureOut:
        """Ask the controller to re-measure every DIP of the VIP."""
        config = await load_vip(vip)
        names = [d.name for d in config.dips]
        for name in names:
            await call(store.request_remeasure(vip, name))
        log.info("remeasure requested", extra={"vip": vip, "dip": "*"})
        return RemeasureOut(vip=vip, dips=names)

    app.include_router(api)
    app.include_router(write)
    app.openapi = lambda: openapi_with_name_rules(app)  # type: ignore[method-assign]

    # --- dashboard ------------------------------------------------------------------------------
    @app.get("/dashboard", response_class=HTMLResponse, include_in_schema=False)
    async def dashboard_page(vip: str | None = None) -> HTMLResponse:
        names = sorted(await call(store.list_vips()))
        chosen = vip if vip in names else (names[0] if names else None)
        data = None
        if chosen is not None:
            config = await call(store.get_vip(chosen))
            if config is not None:
                data = await call(dashboard.build(store, config, settings.history_limit))
        return HTMLResponse(dashboard.render_page(names, chosen, data, settings.dashboard_refresh))

    @app.get("/static/plotly.min.js", include_in_schema=False)
    async def plotly_js() -> Response:
        return Response(
            dashboard.plotly_js(), media_type="application/javascript",
            headers={"Cache-Control": "public, max-age=86400"},
        )

    @app.get("/", include_in_schema=False)
    async def root() -> Response:
        return Response(status_code=307, headers={"Location": "/dashboard"})

    return app
