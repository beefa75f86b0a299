"""A whole simulated run: clients -> LB instances (policy) -> network -> DIPs -> back.

``Simulation(scenario, policy_spec, seed).run()`` returns a ``SimResult``. The flow of one request
at layer 7: a client creates it; an LB instance asks its policy ``pick(request, view, rng)``; ``None``
drops it (counted as dropped); otherwise the instance's outstanding count for that DIP goes up, the
request crosses the network (base RTT/2 plus any active spike), queues at the DIP, and the answer
crosses back. The LB turns the answer into an ``Outcome`` (``server_inflight``, ``chip``,
``extra['rtt']`` and, with ``report_utilization``, ``extra['utilization']``/``extra['qps']``) and
calls ``policy.observe``. A failed attempt (error, timeout, 429) is retried on another DIP when
the policy's optional ``should_retry(request, outcome, view) -> bool`` says so (or, without that
method, when its status is in ``lb.retries.on``), up to ``lb.retries.max_attempts`` attempts, after
``lb.retries.backoff`` seconds, with ``Request.attempt`` + 1 and the failed DIP added to
``Request.excluded``. Every policy must skip excluded DIPs.

Layer 4 (``lb.layer: 4``): a session (client connection) reaches a random MUX, which places it once
with ``pick(Request(connection=...))``; all its requests go to that DIP; the MUX's view counts open
connections. A connection whose request fails is reset and the session reconnects (new placement).
Weights pushed with ``set_weights`` apply to new connections only (KnapsackLB section 4.7).

Probes: a policy with a ``probe_interval`` attribute (seconds) is asked ``probe_targets(view, rng)``
at that interval; each target gets a probe that the DIP answers at once without service (a health
check or load query) with its in-flight count; the answer reaches ``observe`` as an Outcome with
``probe=True`` (status ``timeout`` after ``probe_timeout``, default 1 s, if the DIP hangs).

Reproducibility: each random stream (arrivals, service, DIP-side draws, network, each LB) is a
``random.Random`` seeded from (seed, stream name); the engine breaks time ties by scheduling order.
"""

from __future__ import annotations

import itertools
import random
import time as _time
from collections.abc import Callable, Sequence
from heapq import heappush
from math import log as _log
from typing import Any

from knapsack_lb.sim.engine import Engine
from knapsack_lb.sim.lb import LbInstance
from knapsack_lb.sim.metrics import Recorder, SimResult, summarise
from knapsack_lb.sim.network import Network
from knapsack_lb.sim.policies.base import Outcome, Policy, Request
from knapsack_lb.sim.policies.registry import PolicyContext, make_policy
from knapsack_lb.sim.server import Answer, Job, SimDip
from knapsack_lb.sim.service_time import sampler
from knapsack_lb.sim.spec import PolicySpec, Scenario


def stream(seed: int, name: str) -> random.Random:
    """An independent, reproducible random stream."""
    return random.Random(f"{seed}/{name}")


def build_policy(spec: PolicySpec, ctx: PolicyContext) -> Policy:
    """The registry policy wrapped in sticky sessions, then health checks, then shedding (as asked)."""
    from knapsack_lb.sim.policies.health_check import HealthChecked
    from knapsack_lb.sim.policies.shedding import LoadShedding
    from knapsack_lb.sim.policies.sticky import StickySessions

    policy = make_policy(spec.name, ctx)
    if spec.sticky is not None:
        policy = StickySessions(policy, expiry=spec.sticky.expiry)
    if spec.health_check is not None:  # outside sticky: an unhealthy DIP breaks the session
        policy = HealthChecked(policy, interval=spec.health_check.interval, timeout=spec.health_check.timeout)
    if spec.shedding is not None:
        policy = LoadShedding(
            policy, threshold=spec.shedding.threshold, strategy=spec.shedding.strategy, k=spec.shedding.k
        )
    return policy


_NO_EXCLUSION: frozenset[int] = frozenset()


class _Req:
    __slots__ = ("attempt", "client", "dip", "excluded", "id", "last_status", "lb", "session", "start")

    def __init__(
        self, rid: int, client: str, lb: LbInstance, start: float, session: _Session | None, dip: int = -1
    ) -> None:
        self.id = rid
        self.client = client
        self.lb = lb
        self.start = start
        self.attempt = 0
        self.excluded = _NO_EXCLUSION
        self.session = session
        self.last_status = "ok"
        self.dip = dip


class _Attempt(Job):
    """One attempt of a request (or a probe) on its way; it is also the ``Job`` the DIP queues (one
    object per attempt instead of two). ``result`` carries the answer (a status, or an ``Outcome``)
    from the DIP's side back to the LB."""

    __slots__ = ("dip", "finished", "fixed_size", "lb", "on_outcome", "out_delay", "probe", "req", "result",
                 "sent_at")

    def __init__(
        self,
        req: _Req | None,
        dip: int,
        sent_at: float,
        out_delay: float,
        lb: LbInstance,
        on_answer: Callable[[Job, Answer, int, bool], None],
    ) -> None:
        # Job's fields (the size is drawn when the attempt reaches the DIP)
        self.size = 0.0
        self.on_answer = on_answer
        self.dead = False
        self.fail_after = False
        self.tag = 0.0
        self.payload = None
        self.arrived = 0.0
        self.req = req
        self.dip = dip
        self.sent_at = sent_at
        self.out_delay = out_delay
        self.finished = False
        self.probe = False
        self.fixed_size = 0.0  # > 0: the work of a light request, not a draw of the service time
        self.lb = lb
        self.on_outcome: Callable[[Outcome], None] | None = None
        self.result: Outcome | str = "ok"


class _Session:
    __slots__ = ("client", "dip", "id", "lb", "open", "remaining")

    def __init__(self, sid: int, client: str, lb: LbInstance, remaining: int) -> None:
        self.id = sid
        self.client = client
        self.lb = lb
        self.dip = -1
        self.remaining = remaining
        self.open = False


def client_address(i: int) -> str:
    return f"10.{i // 62500 % 256}.{i // 250 % 250}.{i % 250 + 1}"


class Simulation:
    """One run of one policy on one scenario with one seed."""

    def __init__(
        self,
        scenario: Scenario,
        policy: PolicySpec | str,
        seed: int | None = None,
        policy_factory: Callable[[PolicyContext], Policy] | None = None,
    ) -> None:
        self.scenario = scenario
        self.policy_spec = policy if isinstance(policy, PolicySpec) else scenario.policy(policy)
        self.seed = scenario.seed if seed is None else seed
        self.engine = Engine()
        engine = self.engine
        self.names = scenario.dip_names()
        groups = scenario.dip_groups()
        n = len(self.names)
        feats = self.policy_spec.server_features(scenario.server)
        dip_rng = stream(self.seed, "dips")
        self.dips = [
            SimDip(
                engine,
                i,
                self.names[i],
                workers=g.workers,
                discipline=g.discipline,
                speed=g.speed,
                capacity=g.capacity if g.capacity is not None else g.workers,
                error_probability=g.error_probability,
                error_latency=g.error_latency,
                rng=dip_rng,
                aqm=feats.aqm,
                chips=feats.chips,
            )
            for i, g in enumerate(groups)
        ]
        service_rng = stream(self.seed, "service")
        self._size = [sampler(g.service or scenario.service, service_rng) for g in groups]
        self.mean_size = [(g.service or scenario.service).mean for g in groups]
        self.network = Network(scenario, stream(self.seed, "network"))
        self.rng = stream(self.seed, "clients")
        weights = tuple(g.weight for g in groups)
        self.configured_weights = weights
        self.lbs: list[LbInstance] = []
        for i in range(scenario.lb.instances):
            ctx = PolicyContext(
                dip_names=tuple(self.names),
                weights=weights,
                lb_index=i,
                lb_count=scenario.lb.instances,
                seed=self.seed,
                params=dict(self.policy_spec.params),
            )
            pol = policy_factory(ctx) if policy_factory is not None else build_policy(self.policy_spec, ctx)
            self.lbs.append(LbInstance(i, pol, stream(self.seed, f"lb{i}"), self.names, weights, engine, self.network))
        self.recorder = Recorder(n)
        self._next_id = 0
        self._traffic_factor = 1.0
        self._capacity = scenario.total_capacity()
        self._stop = scenario.duration
        self._report_util = feats.report_utilization
        self._piggyback = feats.piggyback_inflight
        self._chips = feats.chips
        self.on_window: list[Callable[[float], None]] = []
        # what the LB sees of each client attempt (DIP, status, seconds from send to answer), at layer 7
        self.on_attempt: Callable[[int, str, float], None] | None = None
        self._closed_loop = scenario.clients.kind == "closed"
        self._worker_of: dict[int, int] = {}
        self._next_session = 0
        self._live_sessions = 0
        self._target_sessions = self._base_sessions = 0
        self._workers = scenario.clients.concurrency
        self._active = 0
        # constants of the per-request path, looked up once
        self._spikes = self.network.has_spikes
        self._one_way = self.network.one_way
        self._timeout_after = scenario.lb.timeout
        self._think = scenario.clients.think_time
        self._think_rate = 1.0 / self._think if self._think > 0 else 0.0
        self._client_random = self.rng.random
        # callbacks bound once (a bound method per push or per attempt was an allocation each)
        self._arrive_event = self._arrive
        self._receive_status_event = self._receive_status
        self._on_answer = self._answer
        self._on_answer_status = self._answer_status

    @property
    def requests_simulated(self) -> int:
        """Every client request issued so far (warm-up and drain included)."""
        return self._next_id

    # ----- weights ------------------------------------------------------------------------
    def set_weights(self, weights: Sequence[float]) -> None:
        """Push weights to every LB instance (a controller's plan, in DIP order)."""
        for lb in self.lbs:
            lb.set_weights(weights)

    # ----- requests -----------------------------------------------------------------------
    def _new_request(self, client_index: int, session: _Session | None = None) -> _Req:
        sc = self.scenario
        if session is not None:
            lb = session.lb
            client = session.client
        else:
            lb = (
                self.lbs[client_index % len(self.lbs)]
                if sc.lb.assignment == "by_client"
                else self.lbs[self.rng.randrange(len(self.lbs))]
                if len(self.lbs) > 1
                else self.lbs[0]
            )
            client = client_address(client_index)
        self._next_id += 1
        self._active += 1
        return _Req(self._next_id, client, lb, self.engine.now, session)

    def _dispatch(self, req: _Req) -> None:
        """Layer 7: ask the policy and send; or send on the session's connection (layer 4)."""
        lb = req.lb
        if req.session is not None:
            self._send(req, req.session.dip, count=False)
            return
        request = Request(req.id, req.client, self.engine.now, req.attempt, req.excluded, None)
        dip = lb.policy.pick(request, lb, lb.rng)
        if dip is None:
            self._final(req, "dropped" if req.attempt == 0 else req.last_status)
            return
        lb.counts[dip] += 1
        self._send(req, dip, count=True)

    def _send(self, req: _Req, dip: int, *, count: bool) -> None:
        engine = self.engine
        now = engine.now
        lb = req.lb
        delay = self.network.delay(lb.index, dip, now)
        att = _Attempt(req, dip, now, delay, lb, self._on_answer if lb.observes else self._on_answer_status)
        req.dip = dip
        if delay > 0:
            engine.after(delay, self._arrive, att)
        else:
            self._arrive(att)
        timeout = self.scenario.lb.timeout
        if timeout is not None:
            engine.after(timeout, self._timeout, att)

    def _arrive(self, att: _Attempt) -> None:
        dip = att.dip
        att.size = att.fixed_size or self._size[dip]()
        if att.probe:
            self.dips[dip].probe(att)
        else:
            self.dips[dip].arrive(att)

    def _answer_status(self, job: Job, status: Answer, inflight: int, chip: bool) -> None:
        """``on_answer`` of a client request whose policy never looks at outcomes (stateless, no retry
        hook): no ``Outcome`` is built, only the status travels back."""
        att: _Attempt = job  # type: ignore[assignment]
        att.result = status
        engine = self.engine
        back = self.network.delay(att.lb.index, att.dip, engine.now) if self._spikes else self._one_way
        if back > 0:
            heappush(engine.queue, (engine.now + back, next(engine.sequence), self._receive_status_event, att))
        else:
            self._receive_status(att)

    def _receive_status(self, att: _Attempt) -> None:
        """The status of a non-observing policy's request reaches the LB. The common case, a layer-4
        request answered ok, is ``_conclude`` + ``_final`` written out; everything else goes there."""
        if att.finished:
            return  # already timed out
        att.finished = True
        status = att.result
        req = att.req
        assert req is not None
        session = req.session
        if status != "ok" or session is None or self.on_attempt is not None:
            self._conclude(att, status)
            return
        self._active -= 1
        start = req.start
        dip = req.dip
        rec = self.recorder
        rec.ok(start, self.engine.now - start, dip, req.attempt + 1)
        rec.served[dip] += 1
        self._session_next(session)

    def _answer(self, job: Job, status: Answer, inflight: int, chip: bool) -> None:
        att: _Attempt = job  # type: ignore[assignment]
        now = self.engine.now
        back = self.network.delay(att.lb.index, att.dip, now)
        if not att.lb.observes and att.req is not None and att.on_outcome is None:
            self._answer_status(att, status, inflight, chip)
            return
        extra: dict[str, float] = {"rtt": att.out_delay + back}
        if self._report_util:
            dip = self.dips[att.dip]
            extra["utilization"] = dip.last_utilization
            extra["qps"] = dip.last_qps
            extra["eps"] = dip.last_eps
        if att.probe:
            extra["latency_estimate"] = self.dips[att.dip].latency_estimate
        show_inflight = self._piggyback or att.probe
        outcome = Outcome(
            request_id=att.req.id if att.req is not None else -1,
            dip=att.dip,
            sent_at=att.sent_at,
            finished_at=now + back,
            status=status,
            server_inflight=inflight if show_inflight else None,
            chip=chip,
            probe=att.probe,
            extra=extra,
        )
        att.result = outcome
        if back > 0:
            self.engine.after(back, self._receive, att)
        else:
            self._receive(att)

    def _receive(self, att: _Attempt) -> None:
        if att.finished:
            return  # already timed out
        att.finished = True
        self._conclude(att, att.result)

    def _timeout(self, att: _Attempt) -> None:
        if att.finished:
            return
        att.finished = True
        now = self.engine.now
        self._conclude(
            att,
            Outcome(
                request_id=att.req.id if att.req is not None else -1,
                dip=att.dip,
                sent_at=att.sent_at,
                finished_at=now,
                status="timeout",
                probe=att.probe,
            ),
        )

    def _conclude(self, att: _Attempt, outcome: Outcome | str) -> None:
        lb = att.lb
        if self.on_attempt is not None and att.req is not None and att.on_outcome is None:
            self.on_attempt(att.dip, outcome if isinstance(outcome, str) else outcome.status,
                            self.engine.now - att.sent_at)
        if isinstance(outcome, str):  # a policy that does not observe: only the status matters
            status = outcome
            req = att.req
            assert req is not None
            if req.session is None:
                lb.counts[att.dip] -= 1
        else:
            if att.on_outcome is not None:  # probes of the simulator itself (KnapsackLB's KLM)
                att.on_outcome(outcome)
                return
            maybe_req = att.req
            if maybe_req is None:  # a policy's probe
                lb.policy.observe(outcome, lb)
                return
            req = maybe_req
            if req.session is None:
                lb.counts[att.dip] -= 1
            if lb.observes:
                lb.policy.observe(outcome, lb)
            status = outcome.status
        session = req.session
        if status == "ok":
            self._final(req, "ok")
            return
        req.last_status = status
        if session is not None:
            # the connection is reset; the session reconnects for its remaining requests
            self._close_session(session)
            self._final(req, status)
            return
        retries = self.scenario.lb.retries
        if req.attempt + 1 < retries.max_attempts:
            decide = getattr(lb.policy, "should_retry", None)
            request = Request(req.id, req.client, req.start, req.attempt, req.excluded, None)
            if decide is not None and isinstance(outcome, Outcome):
                again = bool(decide(request, outcome, lb))
            else:
                again = status in retries.on
            if again:
                req.attempt += 1
                req.excluded = req.excluded | {att.dip}
                if retries.backoff > 0:
                    self.engine.after(retries.backoff, self._dispatch, req)
                else:
                    self._dispatch(req)
                return
        self._final(req, status)

    def _final(self, req: _Req, status: str) -> None:
        self._active -= 1
        now = self.engine.now
        self.recorder.request(req.start, now - req.start, status, req.dip if status == "ok" else -1, req.attempt + 1)
        if status == "ok":
            self.recorder.served[req.dip] += 1
        session = req.session
        if session is not None:
            self._session_next(session, failed=status != "ok")
        elif self._closed_loop:
            self._closed_next(req, failed=status != "ok")

    # ----- probes -------------------------------------------------------------------------
    def send_probe(
        self,
        lb: LbInstance,
        dip: int,
        *,
        timeout: float,
        serve: bool = False,
        on_outcome: Callable[[Outcome], None] | None = None,
        size: float = 0.0,
    ) -> None:
        """A probe from ``lb`` to ``dip``: answered at once (``serve=False``) or queued like a request,
        of ``size`` work (seconds at speed 1) when given, else of a service time drawn as a request's."""
        now = self.engine.now
        delay = self.network.delay(lb.index, dip, now)
        att = _Attempt(None, dip, now, delay, lb, self._answer)
        att.probe = not serve
        att.fixed_size = size
        att.on_outcome = on_outcome
        self.engine.after(delay, self._arrive, att)
        self.engine.after(timeout, self._timeout, att)

    def _start_probing(self) -> None:
        for lb in self.lbs:
            interval = getattr(lb.policy, "probe_interval", None)
            if not interval:
                continue
            timeout = float(getattr(lb.policy, "probe_timeout", None) or 1.0)

            def tick(_now: float, lb: LbInstance = lb, timeout: float = timeout) -> None:
                for dip in lb.policy.probe_targets(lb, lb.rng):
                    self.send_probe(lb, dip, timeout=timeout)

            self.engine.every(float(interval), tick, until=self._stop)

    # ----- clients ------------------------------------------------------------------------
    def _rate_at(self, t: float) -> float:
        """Offered requests per second at time t (ramp interpolated, times the traffic factor)."""
        c = self.scenario.clients
        if c.ramp:
            pts = [(p.at, p.rate if p.rate is not None else (p.load or 0.0) * self._capacity) for p in c.ramp]
            if t <= pts[0][0]:
                base = pts[0][1]
            elif t >= pts[-1][0]:
                base = pts[-1][1]
            else:
                base = pts[-1][1]
                for (t0, r0), (t1, r1) in itertools.pairwise(pts):
                    if t0 <= t <= t1:
                        base = r0 + (r1 - r0) * (t - t0) / (t1 - t0) if t1 > t0 else r1
                        break
        else:
            base = c.rate if c.rate is not None else (c.load or 0.0) * self._capacity
        return base * self._traffic_factor

    def _open_arrival(self, _: Any) -> None:
        now = self.engine.now
        if now >= self._stop:
            return
        req = self._new_request(self.rng.randrange(self.scenario.clients.count))
        self._dispatch(req)
        self._schedule_open()

    def _schedule_open(self) -> None:
        rate = self._rate_at(self.engine.now)
        if rate <= 0:
            self.engine.after(0.1, self._open_arrival_check)
            return
        self.engine.after(self.rng.expovariate(rate), self._open_arrival)

    def _open_arrival_check(self, _: Any) -> None:
        if self.engine.now < self._stop:
            self._schedule_open()

    def _closed_next(self, req: _Req, failed: bool = False) -> None:
        worker = self._worker_of.pop(req.id)
        clients = self.scenario.clients
        think = clients.think_time
        delay = self.rng.expovariate(1.0 / think) if think > 0 else 0.0
        if failed:
            delay = max(delay, clients.pause_after_failure)
        self.engine.after(delay, self._closed_issue, worker)

    def _closed_issue(self, worker: int) -> None:
        if self.engine.now >= self._stop or worker >= self._workers:
            return
        req = self._new_request(worker % self.scenario.clients.count)
        self._worker_of[req.id] = worker
        self._dispatch(req)

    # layer-4 sessions: a fixed population of client connections, each replaced after its requests
    def session_population(self) -> int:
        c = self.scenario.clients
        if c.load is not None:
            mean_service = self.scenario.mean_service()
            return max(1, round(c.load * self._capacity * (c.think_time + mean_service)))
        return c.concurrency

    def _spawn_session(self, _: Any = None) -> None:
        if self.engine.now >= self._stop:
            return
        c = self.scenario.clients
        ci = self.rng.randrange(c.count)
        lb = (
            self.lbs[ci % len(self.lbs)]
            if self.scenario.lb.assignment == "by_client"
            else self.lbs[self.rng.randrange(len(self.lbs))]
        )
        self._next_session += 1
        self._live_sessions += 1
        session = _Session(self._next_session, client_address(ci), lb, c.requests_per_session)
        self._open_session(session)

    def _session_ended(self) -> None:
        self._live_sessions -= 1
        if self._live_sessions < self._target_sessions:
            self._spawn_session()

    def _open_session(self, session: _Session) -> None:
        lb = session.lb
        request = Request(-session.id, session.client, self.engine.now, 0, frozenset(), session.id)
        dip = lb.policy.pick(request, lb, lb.rng)
        if dip is None:
            self.recorder.request(self.engine.now, 0.0, "dropped", -1, 1)
            session.remaining -= 1
            self._session_next(session, failed=True)
            return
        session.dip = dip
        session.open = True
        lb.counts[dip] += 1
        self._session_request(session)

    def _close_session(self, session: _Session) -> None:
        if session.open:
            session.open = False
            session.lb.counts[session.dip] -= 1

    def _session_request(self, session: _Session) -> None:
        session.remaining -= 1
        req = self._new_request(0, session)
        self._dispatch(req)

    def _session_next(self, session: _Session, failed: bool = False) -> None:
        if session.remaining <= 0:
            self._close_session(session)
            self._session_ended()
            return
        # rng.expovariate(1 / think) written out (its formula, the same draw, one Python call less)
        delay = -_log(1.0 - self._client_random()) / self._think_rate if self._think > 0 else 0.0
        if failed:
            delay = max(delay, self.scenario.clients.pause_after_failure)
        engine = self.engine
        if not session.open:
            engine.after(delay, self._session_continue, session)
            return
        # the connection stays on its DIP: send the next request straight at the end of the think time
        # (one event instead of two; the path delay is a function of the send time)
        send_at = engine.now + delay
        session.remaining -= 1
        self._next_id = rid = self._next_id + 1
        self._active += 1
        lb = session.lb
        dip = session.dip
        req = _Req(rid, session.client, lb, send_at, session, dip)
        out = self.network.delay(lb.index, dip, send_at) if self._spikes else self._one_way
        att = _Attempt(req, dip, send_at, out, lb, self._on_answer if lb.observes else self._on_answer_status)
        heappush(engine.queue, (send_at + out, next(engine.sequence), self._arrive_event, att))
        timeout = self._timeout_after
        if timeout is not None:
            engine.at(send_at + timeout, self._timeout, att)

    def _session_continue(self, session: _Session) -> None:
        if not session.open:
            self._open_session(session)
        else:
            self._session_request(session)

    # ----- scheduled events and windows ---------------------------------------------------
    def _schedule_events(self) -> None:
        for ev in self.scenario.events:
            self.engine.at(ev.at, self._apply_event, ev)

    def _apply_event(self, ev: Any) -> None:
        idx = self.scenario.resolve(ev.dips) if ev.dips else []
        if ev.kind == "fail":
            for i in idx:
                self.dips[i].fail(ev.mode)
        elif ev.kind == "restart":
            for i in idx:
                self.dips[i].restart()
        elif ev.kind == "capacity":
            for i in idx:
                self.dips[i].set_speed(ev.speed)
        elif ev.kind == "errors":
            for i in idx:
                self.dips[i].error_probability = ev.probability
                self.dips[i].error_latency = ev.latency
        elif ev.kind == "weights":
            self.set_weights(ev.weights)
        elif ev.kind == "traffic":
            self._traffic_factor = ev.factor
            if self.scenario.clients.kind == "sessions":
                self._target_sessions = round(self._base_sessions * ev.factor)
                for _ in range(self._target_sessions - self._live_sessions):
                    self._spawn_session()
            elif self.scenario.clients.kind == "closed":
                target = round(self.scenario.clients.concurrency * ev.factor)
                for w in range(self._workers, target):
                    self.engine.after(0.0, self._closed_issue, w)
                self._workers = target

    def _window(self, now: float) -> None:
        window = self.scenario.window
        self.recorder.window_times.append(now)
        self.recorder.utilization.append([d.roll_window(window) for d in self.dips])
        self.recorder.weights.append(list(self.lbs[0].weights))
        for fn in self.on_window:
            fn(now)

    # ----- run ----------------------------------------------------------------------------
    def run(self, progress: Callable[[float], None] | None = None) -> SimResult:
        """Run to the end; ``progress(fraction)`` is called 50 times along the way if given."""
        sc = self.scenario
        wall = _time.perf_counter()
        timeout = sc.lb.timeout
        self._drain = (
            timeout * sc.lb.retries.max_attempts + sc.lb.retries.backoff * sc.lb.retries.max_attempts
            if timeout is not None
            else max(5.0, 0.2 * sc.duration)
        )
        self._schedule_events()
        self.engine.every(sc.window, self._window, until=sc.duration + 1e-9)
        self._start_probing()
        if sc.clients.kind == "open":
            self._schedule_open()
        elif sc.clients.kind == "closed":
            for w in range(sc.clients.concurrency):
                self.engine.at(self.rng.uniform(0, 0.001), self._closed_issue, w)
        else:
            self._base_sessions = self._target_sessions = self.session_population()
            spread = sc.clients.think_time + self.scenario.mean_service()
            for _ in range(self._base_sessions):
                self.engine.at(self.rng.uniform(0, spread), self._spawn_session)
        end = sc.duration + self._drain
        if progress is None:
            self.engine.run(end)
        else:
            steps = 50
            for k in range(1, steps + 1):
                self.engine.run(end * k / steps)
                progress(k / steps)
        self._record_unfinished()
        return summarise(
            self.recorder,
            scenario=sc.name,
            policy=self.policy_spec.display,
            seed=self.seed,
            duration=sc.duration,
            warmup=sc.warmup,
            dip_names=self.names,
            wall_seconds=_time.perf_counter() - wall,
            events=self.engine.events_run,
        )

    def _record_unfinished(self) -> None:
        # requests issued but never concluded (lost on a hung DIP without timeout, or still queued when
        # the drain ended) did not succeed; they are counted at the end of the measured span
        for _ in range(max(0, self._active)):
            self.recorder.request(self.scenario.duration - 1e-9, 0.0, "unfinished", -1, 1)


def run(
    scenario: Scenario,
    policy: PolicySpec | str,
    seed: int | None = None,
    progress: Callable[[float], None] | None = None,
) -> SimResult:
    """One run; the KnapsackLB policy gets its controller attached (knapsack_lb.sim.knapsack)."""
    spec = policy if isinstance(policy, PolicySpec) else scenario.policy(policy)
    if spec.name == "knapsack":
        from knapsack_lb.sim.knapsack import run_knapsack

        return run_knapsack(scenario, spec, seed, progress=progress)
    return Simulation(scenario, spec, seed).run(progress)
