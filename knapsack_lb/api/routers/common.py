"""Path parameters and documented error responses shared by the routers."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path

from knapsack_lb.api.schemas import Problem
from knapsack_lb.names import NAME_PATTERN

NAME_RE = NAME_PATTERN.pattern
VipName = Annotated[str, Path(pattern=NAME_RE, max_length=63, description="VIP name.")]
DipName = Annotated[str, Path(pattern=NAME_RE, max_length=63, description="DIP name.")]

NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": Problem, "description": "Unknown VIP or DIP."}}
UNAVAILABLE: dict[int | str, dict[str, Any]] = {503: {"model": Problem, "description": "The store is unreachable."}}
WRITE: dict[int | str, dict[str, Any]] = {
    400: {"model": Problem, "description": "The body is not JSON (not UTF-8, or cut off)."},
    401: {"model": Problem, "description": "No bearer token sent."},
    403: {"model": Problem, "description": "Wrong token, or no token configured (read-only API)."},
    413: {"model": Problem, "description": "The body is larger than api.max_body_bytes."},
}
