"""The curves file ``klb solve`` reads (format documented in README.md, example in examples/curves.json).

```json
{"objective": "mean", "total": 1.0,
 "dips": [{"name": "dip-1", "curve": {"kind": "quadratic", "a": 0.001, "b": 0.0, "c": 0.05},
           "w_max": 0.6, "min_weight": 0.0, "max_weight": null, "pin": null}]}
```

``objective`` and ``total`` are optional (``mean``, 1.0); per DIP only ``name``, ``curve`` and
``w_max`` are required. Curves are anything ``knapsack_lb.curves.curve_from_dict`` reads.
Unknown keys are refused (a typo must not silently drop a bound).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from knapsack_lb.curves import curve_from_dict
from knapsack_lb.errors import InvalidInputError
from knapsack_lb.solver.api import Solution
from knapsack_lb.solver.inputs import OBJECTIVES, DipInput

DIP_KEYS = {"name", "curve", "w_max", "min_weight", "max_weight", "pin"}
TOP_KEYS = {"objective", "total", "dips"}


@dataclass(frozen=True)
class CurvesFile:
    dips: list[DipInput]
    objective: str
    total: float


def parse_curves(data: object) -> CurvesFile:
    """Validate the decoded JSON; errors name the DIP (or its position) and the field."""
    if not isinstance(data, Mapping):
        raise InvalidInputError("(top level)", type(data).__name__, "must be an object with a 'dips' list")
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise InvalidInputError(unknown[0], data[unknown[0]], f"unknown key; allowed: {sorted(TOP_KEYS)}")
    objective = data.get("objective", "mean")
    if objective not in OBJECTIVES:
        raise InvalidInputError("objective", objective, f"must be one of {list(OBJECTIVES)}")
    total = data.get("total", 1.0)
    if isinstance(total, bool) or not isinstance(total, (int, float)) or not total > 0:
        raise InvalidInputError("total", total, "must be a number > 0")
    raw = data.get("dips")
    if not isinstance(raw, list) or not raw:
        raise InvalidInputError("dips", raw, "must be a non-empty list")
    dips = []
    for position, item in enumerate(raw):
        dips.append(_dip(position, item))
    return CurvesFile(dips, str(objective), float(total))


def _dip(position: int, item: object) -> DipInput:
    if not isinstance(item, Mapping):
        raise InvalidInputError(f"dips[{position}]", item, "must be an object")
    name = item.get("name")
    label = name if isinstance(name, str) else f"dips[{position}]"
    unknown = sorted(set(item) - DIP_KEYS)
    if unknown:
        raise InvalidInputError(unknown[0], item[unknown[0]], f"unknown key; allowed: {sorted(DIP_KEYS)}", label)
    for key in ("name", "curve", "w_max"):
        if key not in item:
            raise InvalidInputError(key, None, "is required", label)
    curve = curve_from_dict(item["curve"], dip=label)
    return DipInput(
        name=item["name"],
        curve=curve,
        w_max=item["w_max"],
        min_weight=item.get("min_weight", 0.0) if item.get("min_weight") is not None else 0.0,
        max_weight=item.get("max_weight"),
        pin=item.get("pin"),
    )


def load_curves(path: Path) -> CurvesFile:
    """Read and validate a curves file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInputError("path", str(path), f"cannot be read: {exc.strerror}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInputError("path", str(path), f"is not JSON: {exc}") from exc
    return parse_curves(data)


def dump_dips(dips: list[DipInput], objective: str = "mean", total: float = 1.0) -> dict[str, Any]:
    """The curves-file form of ``dips`` (the inverse of ``parse_curves``)."""
    return {
        "objective": objective,
        "total": total,
        "dips": [
            {
                "name": d.name, "curve": d.curve.to_dict(), "w_max": d.w_max, "min_weight": d.min_weight,
                "max_weight": d.max_weight, "pin": d.pin,
            }
            for d in dips
        ],
    }


def solution_to_dict(solution: Solution) -> dict[str, Any]:
    return {
        "method": solution.method,
        "objective_kind": solution.objective_kind,
        "objective": solution.objective,
        "seconds": solution.seconds,
        "note": solution.note,
        "weights": solution.weights,
        "predicted_latency": solution.predicted_latency,
    }
