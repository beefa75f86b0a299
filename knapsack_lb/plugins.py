"""The one extension idiom: plugins are found through Python entry points.

Load-balancer adapters (``knapsack_lb.adapters``), simulator policies (``knapsack_lb.policies``)
and curve models (``knapsack_lb.curves``) are each a group; a third party adds one with its own
distribution and no change to this repository. Settings of a plugin are a pydantic model,
validated by :func:`validate_settings` so that every error names the field and the value.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from knapsack_lb.errors import InvalidInputError

ADAPTERS = "knapsack_lb.adapters"
POLICIES = "knapsack_lb.policies"
CURVES = "knapsack_lb.curves"

Model = TypeVar("Model", bound=BaseModel)


def plugin_names(group: str) -> list[str]:
    """The names registered in ``group``, sorted."""
    return sorted({ep.name for ep in entry_points(group=group)})


def load_plugin(group: str, name: str, field: str) -> Any:
    """The object registered as ``name`` in ``group``; :class:`InvalidInputError` naming ``field``
    (and the installed names) when there is none."""
    for ep in entry_points(group=group):
        if ep.name == name:
            try:
                return ep.load()
            except ModuleNotFoundError as exc:
                raise InvalidInputError(
                    field, name, f"this plugin needs the package {exc.name!r}, which is not installed "
                    f"(install its extra, e.g. pip install 'knapsack-lb[{name}]')"
                ) from None
    raise InvalidInputError(field, name, f"no such plugin in {group!r}; installed: {plugin_names(group)}")


def validate_settings(model: type[Model], raw: object, prefix: str) -> Model:
    """``raw`` validated by ``model``; the first problem raised as :class:`InvalidInputError`
    whose field is ``prefix`` plus the pydantic location (``adapter.settings.servers.b1``)."""
    if not isinstance(raw, Mapping):
        raise InvalidInputError(prefix, raw, "must be a mapping of settings")
    try:
        return model.model_validate(dict(raw))
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(part) for part in first["loc"])
        field = f"{prefix}.{loc}" if loc else prefix
        value = first.get("input")
        message = str(first["msg"]).removeprefix("Value error, ")
        inner = (first.get("ctx") or {}).get("error")
        if isinstance(inner, InvalidInputError):  # a rule of knapsack_lb.names or a model validator
            field = f"{prefix}.{inner.field}" if not loc else field
            value, message = inner.value, inner.problem
        if first["type"] == "extra_forbidden":
            message = f"unknown setting; known: {sorted(model.model_fields)}"
        raise InvalidInputError(field, value, message) from None

