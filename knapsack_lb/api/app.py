"""The admin API (FastAPI): read everything, write only configuration and operator overrides.

KnapsackLB (section 5) keeps every piece of state in the latency store; this API is a window on
it. Reads return VIPs, DIPs, the current plan with its reasons, the plan history, fitted curves
with their measurement points, recent probe rounds and the status of controllers and probe
workers. Writes change a VIP's stored ``VipConfig`` (add / remove VIPs and DIPs, pause, dry run,
pin, drain) or ask for a re-measurement; the controller picks them up on its next step, so they
survive a restart of any process.

What the token can and cannot do (docs/security.md): a VIP may only select one of the operator's
load balancers (``load_balancers`` in the configuration file) and set that adapter's few
per-VIP fields; nothing written here can name a binary, a file, a socket, a listen address, a
URL or an environment variable, and validating a write builds nothing. Every write needs the
bearer token (:mod:`knapsack_lb.api.auth`); bodies are limited in size (413) and 422 bodies name
the field without echoing large input. Unknown names get 404, a duplicate 409, a store outage 503.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from knapsack_lb.api.context import ApiContext, StoreUnavailable, validation_errors
from knapsack_lb.api.limits import RequestLimits
from knapsack_lb.api.routers import dashboard, dips, health, state, vips
from knapsack_lb.api.routers.common import NAME_RE
from knapsack_lb.clock import SystemClock
from knapsack_lb.config import ApiSettings, LoadBalancerConfig
from knapsack_lb.store import LatencyStore

# The model validators check names and addresses in code (knapsack_lb.names); the same rules as
# JSON-schema patterns make the OpenAPI schema say what is accepted.
PORT_RE = r"([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
LABEL_RE = r"[A-Za-z0-9]([A-Za-z0-9-]{0,20}[A-Za-z0-9])?"
ADDRESS_RE = rf"^({LABEL_RE}(\.{LABEL_RE}){{0,3}}|\[::1\]):{PORT_RE}$"


def allowed_methods(app: FastAPI, path: str) -> list[str]:
    """Every method some route serves at ``path``."""
    methods: set[str] = set()
    for route in app.routes:
        if isinstance(route, APIRoute) and route.path_regex.match(path):
            methods |= set(route.methods or ())
    return sorted(methods)


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
    load_balancers: Mapping[str, LoadBalancerConfig] | None = None,
    validate_adapters: bool = True,
) -> FastAPI:
    """The admin API over ``store``. ``token`` guards every write (None: read-only API);
    ``load_balancers`` are the operator's (a VIP may select one of them); ``wall`` gives the
    wall-clock time used for ages in metrics (seconds since the epoch)."""
    settings = settings or ApiSettings()
    app = FastAPI(
        title="knapsack-lb admin API",
        version="1",
        description="Read the controller's state (plans, curves, probe rounds); change VIPs and operator overrides. "
        "Writes need `Authorization: Bearer <token>`.",
    )
    app.state.context = ApiContext(store, settings, wall or SystemClock().wall, dict(load_balancers or {}),
                                   validate_adapters)
    app.state.token = token
    app.add_middleware(RequestLimits, max_body=settings.max_body_bytes, max_headers=settings.max_header_bytes)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        headers = dict(exc.headers or {})
        if exc.status_code == status.HTTP_405_METHOD_NOT_ALLOWED:
            # One path served by several routes (GET and PUT ...): Allow lists them all.
            headers["Allow"] = ", ".join(allowed_methods(app, request.url.path))
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        return JSONResponse({"detail": validation_errors(list(exc.errors()), [])}, status_code=422)

    @app.exception_handler(StoreUnavailable)
    async def _store_down(request: Request, exc: StoreUnavailable) -> JSONResponse:
        return JSONResponse({"detail": f"the latency store is unreachable: {exc}"}, status_code=503)

    for router in (health.router, state.router, vips.router, dips.router, dashboard.router):
        app.include_router(router)
    app.openapi = lambda: openapi_with_name_rules(app)  # type: ignore[method-assign]
    return app
