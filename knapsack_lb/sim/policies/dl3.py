"""DL3: a client-side load balancer aware of server load and network path delay.

Source: Prashanth P S et al., "DL3: Adaptive Load Balancing for Latency-critical Edge Cloud
Applications" (DL3 paper), section III (design) and IV (implementation).

Server side (the simulator's DIP model): every response and HTTP probe carries the server's
current in-flight request count (section III.A, "Monitoring"), ``Outcome.server_inflight``.

Client side (``Dl3Policy``):

* III.A: on a response, the server goes to the healthy list if ``load < T_load``, else to the
  unhealthy list. Retraction: an unhealthy server is probed with HTTP probes; before the next
  probe the client waits at least the average request completion time (RCT) times the number
  of requests above ``T_load`` seen in the previous probe (``load - T_load``; we wait at least
  one RCT). A probe that shows ``load < T_load`` makes the server healthy again.
* III.B: the client keeps ``RTT_avg = (1 - alpha) RTT_avg + alpha RTT_new`` with
  ``alpha = 0.125`` per path. Samples come from the kernel's RTT of connections with requests
  in flight, read every 2 ms in the paper (IV); here ``LbView.path_rtt(dip)`` read at every
  ``probe_targets`` call for DIPs with requests in flight, and the ``extra["rtt"]`` each
  response or probe carries. ``RTT_avg > T_RTT`` makes the server unhealthy. Retraction is
  reactive while requests are in flight to it (their RTT keeps being sampled) and proactive
  (TCP probes, ``probe_targets``) once none are; below ``T_RTT`` it is healthy again.
* III.C: P2C over the healthy list: two random healthy servers, the one with fewer of this
  client's in-flight requests wins.

The paper profiles ``T_load = 10`` requests and ``T_RTT = 10 ms`` (section V.A); they are the
defaults. The paper does not say what to do when every server is unhealthy; we fall back to
P2C over all servers (serving late beats not serving).

How it fails: load is only as fresh as the last response or probe; with low request rates the
piggybacked count is stale. A path delay shorter than one RTT sample is invisible.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from knapsack_lb.errors import InvalidInputError
from knapsack_lb.sim.policies.base import LbView, Outcome, Request
from knapsack_lb.sim.policies.registry import PolicyContext

RTT_ALPHA = 0.125  # section III.B


def rtt_ewma(previous: float | None, sample: float, alpha: float = RTT_ALPHA) -> float:
    """``RTT_avg = (1 - alpha) * RTT_avg + alpha * RTT_new``; the first sample seeds it."""
    if previous is None:
        return sample
    return (1.0 - alpha) * previous + alpha * sample


def probe_wait(average_rct: float, load: int, t_load: int) -> float:
    """Section III.A's waiting rule: average RCT times the requests above ``T_load`` (at least one RCT)."""
    return average_rct * max(1, load - t_load)


@dataclass
class _ServerState:
    load: int | None = None  # last piggybacked in-flight count
    load_unhealthy: bool = False
    next_load_probe: float = -math.inf
    rtt_avg: float | None = None
    rtt_unhealthy: bool = False
    rct_avg: float | None = None


class Dl3Policy:
    """DL3's client load balancer (sections III.A-C).

    ``t_load`` [10 requests], ``t_rtt`` [0.010 s], ``alpha`` [0.125], ``probe_interval`` [0.002 s]:
    how often the caller calls ``probe_targets`` (RTT sampling of in-flight requests and
    probes); ``rct_alpha`` [0.125] smooths the average request completion time.
    """

    name = "dl3"

    def __init__(self, *, t_load: int = 10, t_rtt: float = 0.010, alpha: float = RTT_ALPHA,
                 rct_alpha: float = 0.125, probe_interval: float = 0.002) -> None:
        if t_load < 1:
            raise InvalidInputError("t_load", t_load, "must be >= 1 request")
        if not t_rtt > 0:
            raise InvalidInputError("t_rtt", t_rtt, "must be > 0 seconds")
        if not 0 < alpha <= 1:
            raise InvalidInputError("alpha", alpha, "must be in (0, 1]")
        if not probe_interval > 0:
            raise InvalidInputError("probe_interval", probe_interval, "must be > 0 seconds")
        self.probe_interval = probe_interval  # the RTT daemon's period (2 ms in section IV)
        self.t_load = t_load
        self.t_rtt = t_rtt
        self.alpha = alpha
        self.rct_alpha = rct_alpha
        self.servers: dict[int, _ServerState] = {}

    def _server(self, dip: int) -> _ServerState:
        state = self.servers.get(dip)
        if state is None:
            state = self.servers[dip] = _ServerState()
        return state

    def healthy(self, dip: int) -> bool:
        state = self.servers.get(dip)
        return state is None or not (state.load_unhealthy or state.rtt_unhealthy)

    def healthy_list(self, view: LbView) -> list[int]:
        return [d for d in range(len(view.dip_names)) if self.healthy(d)]

    def record_rtt(self, dip: int, sample: float) -> None:
        """One RTT sample of the path to ``dip``: update the EWMA and the RTT health."""
        state = self._server(dip)
        state.rtt_avg = rtt_ewma(state.rtt_avg, sample, self.alpha)
        state.rtt_unhealthy = state.rtt_avg > self.t_rtt

    def record_load(self, dip: int, load: int, now: float) -> None:
        """A piggybacked in-flight count: healthy iff ``load < T_load``; schedule the next probe."""
        state = self._server(dip)
        state.load = load
        state.load_unhealthy = load >= self.t_load
        if state.load_unhealthy:
            rct = state.rct_avg if state.rct_avg is not None else self._mean_rct()
            state.next_load_probe = now + probe_wait(rct, load, self.t_load)

    def _mean_rct(self) -> float:
        known = [s.rct_avg for s in self.servers.values() if s.rct_avg is not None]
        return sum(known) / len(known) if known else 0.0

    def pick(self, request: Request, view: LbView, rng: random.Random) -> int | None:
        candidates = [d for d in self.healthy_list(view) if d not in request.excluded]
        if not candidates:
            candidates = [d for d in range(len(view.dip_names)) if d not in request.excluded]
        if not candidates:
            return None
        if len(candidates) == 1:
            return candidates[0]
        a, b = rng.sample(candidates, 2)
        oa, ob = view.outstanding(a), view.outstanding(b)
        if oa == ob:
            return a if rng.random() < 0.5 else b
        return a if oa < ob else b

    def observe(self, outcome: Outcome, view: LbView) -> None:
        dip = outcome.dip
        state = self._server(dip)
        rtt = outcome.extra.get("rtt")
        if rtt is not None:
            self.record_rtt(dip, rtt)
        if outcome.status == "ok" and not outcome.probe:
            state.rct_avg = outcome.latency if state.rct_avg is None else \
                (1 - self.rct_alpha) * state.rct_avg + self.rct_alpha * outcome.latency
        if outcome.server_inflight is not None:
            self.record_load(dip, outcome.server_inflight, outcome.finished_at)

    def probe_targets(self, view: LbView, rng: random.Random) -> Sequence[int]:
        """Sample in-flight RTTs, then name the unhealthy servers due for a probe.

        RTT-unhealthy servers with requests in flight are watched reactively (no probe);
        without, they get periodic probes. Load-unhealthy servers get a probe once the
        waiting rule allows.
        """
        now = view.now
        path_rtt: Callable[[int], float | None] | None = getattr(view, "path_rtt", None)
        outstanding = view.outstanding
        servers = self.servers
        targets = []
        for dip in range(len(view.dip_names)):
            in_flight = outstanding(dip) > 0
            if in_flight and path_rtt is not None:
                sample = path_rtt(dip)
                if sample is not None:
                    self.record_rtt(dip, sample)
            state = servers.get(dip)
            if state is None or not (state.rtt_unhealthy or state.load_unhealthy):
                continue
            rtt_probe = state.rtt_unhealthy and not in_flight
            load_probe = state.load_unhealthy and now >= state.next_load_probe
            if rtt_probe or load_probe:
                targets.append(dip)
                if load_probe:
                    # Until the probe answers, do not probe again sooner than one RCT.
                    rct = state.rct_avg if state.rct_avg is not None else self._mean_rct()
                    state.next_load_probe = now + max(rct, 1e-3)
        return targets


def make_dl3(ctx: PolicyContext) -> Dl3Policy:
    """DL3: piggybacked server load (T_load) + RTT EWMA (T_RTT), healthy list, probe retraction, P2C."""
    return Dl3Policy(**dict(ctx.params))
