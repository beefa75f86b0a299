"""A DIP's capacity from the share of light probes that waited.

Rounds of the application's requests (KnapsackLB (NSDI), section 5, "KLM": the admins' URL,
averaged over the round) say little about a DIP with many workers until it is nearly full: at 70 %
of its capacity a 16-worker DIP answers 2.7 % slower than idle, thousands of probes' worth of
noise, and its latency rises 5x only at 98.5 % busy (docs/decisions/controller.md, "What a round
can tell of a many-worker DIP's capacity"). The share of requests that *wait* moves early: 13 % at
70 % on 16 workers. A light probe of fixed, tiny work shows it one request at a time: behind a
worker pool it waits exactly when every worker is busy, under processor sharing it is stretched
exactly when more requests than cores are in service, and any time above its own unloaded
latency is queueing, never a long request of its own.

The model. A DIP of ``c`` workers, each serving the application's requests in ``S`` seconds on
average, carrying ``rate`` requests/s, has ``a = rate x S`` erlangs offered; an arrival finds every
worker busy with probability ``C(c, a)``, Erlang's C formula, which is exact for M/M/c and, by the
insensitivity of processor sharing, for any service distribution under processor sharing over
``c`` cores (with FCFS and less variable service, fewer arrivals wait: M/D/c about 5 % fewer).
:func:`erlang_c` takes a real ``c`` (Jagerman's continuous extension of Erlang B through the
incomplete gamma function), so :func:`servers_from_waited_share` inverts it: the number of workers
the DIP behaves as, and its capacity ``c / S`` requests/s. A binomial confidence interval of the
waited share (Wilson's) maps through the inversion, which is decreasing (more waiting, fewer
workers), to bounds on the capacity.

How it fails: the estimate is a statement about the DIP at the rate it carried while probed; with
no probe waited it bounds the capacity from below only, with every probe waited it cannot exclude
a DIP past its capacity (no lower bound; the estimate is then the rate it carried). ``S`` is the
unloaded service time of the application's requests: an error in it moves the capacity far less
than itself, because the waited share fixes mostly ``rate x S / c`` (a 10 % error in ``S``: 1.5-3 %
in the capacity). Bad input raises :class:`~knapsack_lb.errors.InvalidInputError` naming the field.

Without the rate. A layer-4 LB counts connections, not requests, so the rate a DIP carries is often
unknown. The probes that waited tell it too: in M/M/c a wait, once it happens, is exponential with
mean ``S / (c - a)``, and under processor sharing a light probe of work ``w`` that finds ``n >= c``
others is stretched to ``w (n + 1) / c``, whose excess over ``w`` has mean ``w / (c - a)`` given that
it waited (``n - c`` is geometric). So the mean excess of the probes that waited, in units of ``S``
behind a worker pool or of ``w`` under processor sharing, is the reciprocal of the DIP's spare
workers ``g = c - a``, and with the waited share ``C(c, c - g)`` it fixes ``c`` and the utilisation
``1 - g / c`` (:func:`load_from_light_probes`; its two statistics are the maximum-likelihood ones for
M/M/c). The DIP saturates at its carried share over that utilisation, whatever the rate. How it
fails: the unit is the caller's: the discipline must be known (a worker pool's waits are a service
time long, processor sharing's stretches a probe's own work); behind FCFS workers the waits follow
the service's spread (M/D/c's about half as long), so fixed service reads as a busier DIP (the
capacity it implies 0.68-0.94 of the truth in ``klb bench light-probes``, the safe side) and more
variable service as an idler one (lognormal, sigma 1: 1.02-1.09 on 4 and 16 workers); under
processor sharing it holds for any service distribution (0.85-1.02, the lowest where almost no
probe waits). One round is a few waits: from 50 probes its median error is 1.1-5 times (typically
2.3 times) that of the estimate with the rate, so it is a statistic to pool over rounds at one load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy.optimize import brentq
from scipy.special import gammaincc, gammaln
from scipy.stats import chi2, norm

from knapsack_lb.errors import InvalidInputError


def erlang_c(servers: float, offered: float) -> float:
    """Probability that an arrival waits with ``servers`` (any real > 0) and ``offered`` erlangs;
    1 at or beyond saturation (``offered >= servers``), 0 with nothing offered."""
    if offered <= 0:
        return 0.0
    if offered >= servers:
        return 1.0
    # Erlang B = a^c e^-a / Gamma(c + 1, a), in logs: the terms overflow separately for large c
    upper_tail = gammaincc(servers + 1, offered)
    if upper_tail <= 0:
        return 0.0
    blocking = math.exp(servers * math.log(offered) - offered - gammaln(servers + 1)) / upper_tail
    return float(servers * blocking / (servers - offered * (1 - blocking)))


def servers_from_waited_share(waited: float, offered: float) -> float:
    """The (real) number of workers at which ``erlang_c`` gives ``waited`` for ``offered`` erlangs;
    ``waited`` strictly between 0 and 1, ``offered`` > 0."""
    if not 0 < waited < 1:
        raise InvalidInputError("waited", waited, "must be a share strictly between 0 and 1")
    if not math.isfinite(offered) or offered <= 0:
        raise InvalidInputError("offered", offered, "must be erlangs > 0")
    low = offered
    high = offered + 1.0
    while erlang_c(high, offered) > waited:
        low, high = high, offered + 2 * (high - offered)
    return float(brentq(lambda servers: erlang_c(servers, offered) - waited, low, high, xtol=1e-12, rtol=1e-12))


def utilisation_from_waited_share(waited: float, servers: float) -> float:
    """The utilisation at which ``servers`` workers have ``waited`` of their arrivals wait (``erlang_c``
    inverted in the load); ``waited`` strictly between 0 and 1, ``servers`` > 0."""
    if not 0 < waited < 1:
        raise InvalidInputError("waited", waited, "must be a share strictly between 0 and 1")
    if not math.isfinite(servers) or servers <= 0:
        raise InvalidInputError("servers", servers, "must be workers > 0")
    return float(brentq(lambda u: erlang_c(servers, servers * u) - waited, 0.0, 1.0, xtol=1e-12, rtol=1e-12))


@dataclass(frozen=True)
class WaitedCapacity:
    """A DIP's capacity (requests/s) read from ``waited`` of ``probes`` light probes.

    ``capacity``: the best estimate (``None``: no probe waited, any capacity above ``low`` fits);
    ``low`` / ``high``: the confidence bounds (``None``: unbounded that side; ``low`` is ``None``
    when every probe waited, the DIP may be past its capacity); ``servers``: the workers it behaves
    as (``None`` with ``capacity``)."""

    waited: int
    probes: int
    rate: float
    capacity: float | None
    low: float | None
    high: float | None
    servers: float | None


def wilson_interval(waited: int, probes: int, z: float) -> tuple[float, float]:
    """Wilson's score interval of the share ``waited / probes`` at ``z`` standard errors."""
    share = waited / probes
    spread = z * z / probes
    centre = (share + spread / 2) / (1 + spread)
    half = z / (1 + spread) * math.sqrt(share * (1 - share) / probes + spread / (4 * probes))
    return max(0.0, centre - half), min(1.0, centre + half)


def capacity_from_waited_share(waited: int, probes: int, *, rate: float, unloaded: float,
                               z: float = 2.0) -> WaitedCapacity:
    """Capacity of a DIP that carried ``rate`` requests/s while ``waited`` of ``probes`` light probes
    waited, its application requests taking ``unloaded`` seconds of service; bounds at ``z``
    standard errors (Wilson's interval of the share, mapped through Erlang's formula)."""
    if not isinstance(probes, int) or probes < 1:
        raise InvalidInputError("probes", probes, "must be an integer >= 1")
    if not isinstance(waited, int) or not 0 <= waited <= probes:
        raise InvalidInputError("waited", waited, f"must be an integer from 0 to probes ({probes})")
    if not math.isfinite(rate) or rate <= 0:
        raise InvalidInputError("rate", rate, "must be requests/s > 0")
    if not math.isfinite(unloaded) or unloaded <= 0:
        raise InvalidInputError("unloaded", unloaded, "must be seconds > 0")
    if not math.isfinite(z) or z <= 0:
        raise InvalidInputError("z", z, "must be a number of standard errors > 0")
    offered = rate * unloaded
    share_low, share_high = wilson_interval(waited, probes, z)

    def capacity_at(share: float) -> float | None:
        if share <= 0:
            return None
        if share >= 1:
            return rate
        return servers_from_waited_share(share, offered) / unloaded

    best = capacity_at(waited / probes)
    return WaitedCapacity(waited=waited, probes=probes, rate=rate, capacity=best,
                          low=None if share_high >= 1 else capacity_at(share_high),
                          high=capacity_at(share_low), servers=None if best is None else best * unloaded)


@dataclass(frozen=True)
class LightProbeLoad:
    """How busy a DIP was while ``waited`` of ``probes`` light probes waited, their excess latencies
    summing to ``excess`` (in the caller's unit, see the module docstring), without the rate it carried.

    ``spare``: the workers it had free on average, ``c - a`` (``None``: no probe waited);
    ``servers``: the workers it behaves as; ``utilisation``: the best estimate, ``low`` / ``high`` its
    bounds (``high`` is 1 when every probe waited, ``low`` 0 and the rest ``None`` when none did)."""

    waited: int
    probes: int
    spare: float | None
    servers: float | None
    utilisation: float | None
    low: float
    high: float | None


def servers_from_spare(waited: float, spare: float) -> float:
    """The (real) number of workers ``c`` at which ``erlang_c(c, c - spare)`` gives ``waited``;
    ``waited`` strictly between 0 and 1, ``spare`` > 0 (the wait grows with ``c`` at fixed spare).
    At least one worker: where one worker would wait more than ``waited`` (more waiting than spare
    allows, a sign of jitter or of waits longer than the model's), the answer is 1."""
    if not 0 < waited < 1:
        raise InvalidInputError("waited", waited, "must be a share strictly between 0 and 1")
    if not math.isfinite(spare) or spare <= 0:
        raise InvalidInputError("spare", spare, "must be erlangs > 0")
    if spare < 1 and erlang_c(1.0, 1.0 - spare) >= waited:
        return 1.0
    low = max(1.0, spare)
    high = 2 * low
    while erlang_c(high, high - spare) < waited:
        low, high = high, 2 * high
    return float(brentq(lambda servers: erlang_c(servers, servers - spare) - waited, low, high,
                        xtol=1e-12, rtol=1e-12))


def _utilisation(waited: float, spare: float) -> float:
    if waited <= 0:
        return 0.0
    if waited >= 1:
        return 1.0
    return 1 - spare / servers_from_spare(waited, spare)


def load_from_light_probes(waited: int, probes: int, excess: float, *, threshold: float = 0.0,
                           z: float = 2.0) -> LightProbeLoad:
    """The utilisation a DIP ran at while probed, from the share of light probes that waited and the
    summed ``excess`` of those that did; bounds at ``z`` standard errors (Wilson's interval of the
    share and the chi-square interval of an exponential rate, the utilisation taken at its least and
    greatest over that box, on a 5 x 5 grid).

    ``threshold``: where the probe's own timing jitter is not negligible, a probe counts as waited
    only when its excess passed ``threshold`` (the same unit), and ``excess`` sums what lies beyond
    it. A wait is memoryless, so those that passed exceed it by the same mean, and the share that
    waited at all is the counted share times ``exp(threshold x spare)`` (for processor sharing's
    stretches, geometric in steps of ``1 / c``, approximately), restored at most e-fold: waits whose
    mean excess is below the threshold are not the tail of the model's exponential waits (a threshold
    past their mean would have cut most of them), and a few such, a fraction of the threshold long,
    would otherwise restore to every request having waited."""
    if not isinstance(probes, int) or probes < 1:
        raise InvalidInputError("probes", probes, "must be an integer >= 1")
    if not isinstance(waited, int) or not 0 <= waited <= probes:
        raise InvalidInputError("waited", waited, f"must be an integer from 0 to probes ({probes})")
    if not math.isfinite(excess) or excess < 0 or (waited > 0 and excess == 0):
        raise InvalidInputError("excess", excess, "must be a finite sum > 0 over the probes that waited")
    if not math.isfinite(threshold) or threshold < 0:
        raise InvalidInputError("threshold", threshold, "must be a finite excess >= 0")
    if not math.isfinite(z) or z <= 0:
        raise InvalidInputError("z", z, "must be a number of standard errors > 0")
    if waited == 0:
        return LightProbeLoad(waited=0, probes=probes, spare=None, servers=None, utilisation=None, low=0.0, high=None)
    share_low, share_high = wilson_interval(waited, probes, z)
    tail = float(norm.sf(z))
    spare = waited / excess
    spare_low = float(chi2.ppf(tail, 2 * waited)) / (2 * excess)
    spare_high = float(chi2.ppf(1 - tail, 2 * waited)) / (2 * excess)

    def uncensored(share: float, rate: float) -> float:
        return min(1.0, share * math.exp(min(threshold * rate, 1.0)))

    shares = [share_low + (share_high - share_low) * i / 4 for i in range(5)]
    spares = [spare_low + (spare_high - spare_low) * j / 4 for j in range(5)]
    grid = [_utilisation(uncensored(counted, rate), rate) for counted in shares for rate in spares]
    share = uncensored(waited / probes, spare)
    if share >= 1:
        return LightProbeLoad(waited=waited, probes=probes, spare=spare, servers=None, utilisation=None,
                              low=min(grid), high=1.0)
    servers = servers_from_spare(share, spare)
    return LightProbeLoad(waited=waited, probes=probes, spare=spare, servers=servers,
                          utilisation=1 - spare / servers, low=min(grid), high=max(grid))
