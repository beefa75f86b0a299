"""Property-based run of the whole API against its own OpenAPI schema (schemathesis).

A real uvicorn serves the app on a free loopback port over the real Redis store seeded with
one VIP; schemathesis generates requests for every operation (with the bearer token) and
checks every response: no 5xx, status code and content type declared in the schema, body
valid against the declared model, and writes refused without the token. Examples are
bounded and derandomized so the run is reproducible and short.

One check is left out: ``positive_data_acceptance`` (a schema-valid request must get 2xx).
A VipConfig has cross-field rules JSON Schema cannot state (pins and drained DIPs must be
DIPs of the VIP, pins sum to at most 1, DIP names unique), so schema-valid bodies can be
rightly refused with a 422 that names the field; the tests in test_write.py cover those.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance

from knapsack_lb.api import create_app
from knapsack_lb.lab.procs import RedisServer
from knapsack_lb.store import LatencyStore
from tests.api.conftest import AUTH, TOKEN, LiveServer, live_server

MAX_EXAMPLES = 15


@pytest.fixture(scope="module")
def live_api(redis_server: RedisServer) -> Iterator[LiveServer]:
    with live_server(redis_server.url, "schemathesis") as server:
        yield server


# The schema is the app's own; building it touches no store. Requests go to the live server.
schema = schemathesis.openapi.from_dict(create_app(cast(LatencyStore, object()), token=TOKEN).openapi())


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema(case: schemathesis.Case, live_api: LiveServer) -> None:
    case.call_and_validate(base_url=live_api.url, headers=AUTH, excluded_checks=[positive_data_acceptance])
