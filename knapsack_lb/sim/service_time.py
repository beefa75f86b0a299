"""Service-time samplers (seconds at speed 1): fixed, exponential, lognormal with a given mean."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from knapsack_lb.sim.spec import ServiceSpec


def sampler(spec: ServiceSpec, rng: random.Random) -> Callable[[], float]:
    mean = spec.mean
    if spec.kind == "fixed":
        return lambda: mean
    if spec.kind == "exponential":
        rate = 1.0 / mean
        uniform = rng.random
        log = math.log
        # random.Random.expovariate's own formula, without its extra Python call: the same draws
        return lambda: -log(1.0 - uniform()) / rate
    mu = math.log(mean) - spec.sigma**2 / 2.0  # so that E[X] = mean
    sigma = spec.sigma
    logn = rng.lognormvariate
    return lambda: logn(mu, sigma)
