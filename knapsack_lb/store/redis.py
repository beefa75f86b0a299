"""The latency store on Redis (KnapsackLB section 5 "Latency store", section 6.7).

The paper keeps, per VIP, a list of ``<DIP, latency, time>`` tuples in Redis. This store
keeps every field of a :class:`~knapsack_lb.model.Measurement` and everything else the
processes share (VIP configuration, current plan, plan history, fitted curves,
controller state, remeasure requests, leases, heartbeats, statuses), so that one Redis
is the single source of truth and a restart of any process loses nothing.

Key layout (``ns`` = namespace, default ``klb``). One VIP's keys carry the hash tag
``{vip}`` and so live in one Redis Cluster slot; keys that span VIPs have their own tag (or,
``ns:vips``, hash as a whole: one slot of their own)::

    ns:{vip}:config          string   VipConfig JSON
    ns:{vip}:m:<dip>         zset     Measurement JSON, score = measurement time
    ns:{vip}:mdips           set      DIPs that have measurements
    ns:{vip}:latest          hash     dip -> newest Measurement JSON
    ns:{vip}:plan            string   current WeightPlan JSON
    ns:{vip}:plans           list     plan history (oldest first), bounded
    ns:{vip}:curves          hash     dip -> CurveRecord JSON
    ns:{vip}:state           string   controller state JSON
    ns:{vip}:lb              string   weights the load balancer confirmed (InForce JSON)
    ns:{vip}:remeasure       set      DIPs the operator asked to re-measure
    ns:{vip}:budget          string   probe requests per DIP per round (JSON), with a PX TTL
    ns:vips                  set      VIP names with a configuration (an index, see below)
    ns:{members:<group>}     zset     member -> expiry (ms, Redis server time)
    ns:{lease:<group>}:<res> string   owner, with a PX TTL
    ns:{status:<comp>}:data  hash     member -> status JSON
    ns:{status:<comp>}:exp   zset     member -> expiry (ms, Redis server time)

Single slot, so atomic on a Redis Cluster as on one Redis: every Lua script (plan fencing
touches ``plan`` and ``plans`` of one VIP; a status touches ``data`` and ``exp`` of one
component; leases and heartbeats one key each), the one MULTI/EXEC (``put_curves``, on one
key) and every multi-key command. Pipelines that span slots are never transactions: a
probe round (any VIPs) and ``snapshot`` are plain pipelines, which the cluster client splits
by node. The ``ns:vips`` index is the one relation across slots: ``put_vip`` adds the name
before it writes the configuration and ``delete_vip`` removes the name after it deleted the
VIP's keys, so every configured VIP is listed, and a listed VIP without configuration (a
writer that died between the two steps) is skipped by every reader.

Retention: each DIP's measurement zset is trimmed by age (older than
``retention_seconds`` before ``now``) and by count (newest ``retention_count``) in the
same pipeline that writes the round; the key also expires ``retention_seconds`` after its
last write, so a removed DIP's data goes away. ``now`` comes from the injected ``now``
function, else the newest measurement of the DIP in the round (the measurements' own
time line). The plan history keeps the last ``plan_history_limit`` plans.

Leases, heartbeats and statuses expire on Redis server time (``PX`` and ``TIME`` in Lua),
so workers on different hosts need no synchronised clocks. ``acquire_lease`` is a
compare-and-set / compare-and-renew script: it succeeds when the lease is free, expired
or already the caller's.

Plans are fenced: ``put_plan`` refuses a versioned plan that is not newer than the stored one
(:class:`~knapsack_lb.errors.StalePlanError`), so a controller that was paused or cut off while
another took its VIP over can never overwrite the newer plan.

Round trips: ``put_measurements`` is one pipeline whatever the number of DIPs and VIPs (on a
cluster, one per node it touches, sent concurrently); ``snapshot`` is one pipeline of seven reads
of one slot. Clients: :func:`create_redis_client` builds the plain asyncio client or, with
``cluster=True``, redis-py's ``RedisCluster`` (slot map, MOVED/ASK redirections, failover);
:meth:`RedisLatencyStore.from_settings` is how every process opens the store.

Failures: every method raises :class:`~knapsack_lb.errors.StoreUnavailableError` when Redis is
unreachable, times out or is still loading, and on a cluster also when a slot has moved or is
migrating beyond the store's retries (see :func:`create_redis_client`), a node is down or the
cluster is down (``CLUSTERDOWN``, ``MASTERDOWN``, ``TRYAGAIN``, slots not covered); callers decide
(the probe worker buffers, see :mod:`probes.worker`; the controller backs off and keeps the load
balancer's weights). A cross-slot transaction would be a programming error and is not mapped.
:meth:`RedisLatencyStore.verify` tells a store that is down apart from one that is misconfigured (a
plain Redis configured as a cluster, or a cluster node configured as a plain Redis).
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ParamSpec, Protocol, TypeAlias, TypeVar
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis import exceptions as redis_errors
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import EqualJitterBackoff

from knapsack_lb.errors import InvalidInputError, StalePlanError, StoreUnavailableError
from knapsack_lb.model import Measurement, VipConfig, WeightPlan
from knapsack_lb.names import validate_name
from knapsack_lb.store import (
    DEFAULT_PLAN_HISTORY,
    DEFAULT_RETENTION_COUNT,
    DEFAULT_RETENTION_SECONDS,
    CurveRecord,
    InForce,
    VipSnapshot,
    check_probe_budget,
)

RESOURCE_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$")

# The store's own retry policy (see create_redis_client): retries of a failed call, and the base
# and cap in seconds of the jittered exponential wait before each of them
STORE_RETRIES = 2
STORE_BACKOFF_BASE = 0.05
STORE_BACKOFF_CAP = 0.5

_PUT_LATEST = """
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then
  local ok, decoded = pcall(cjson.decode, old)
  if ok and tonumber(decoded['time']) and tonumber(decoded['time']) > tonumber(ARGV[2]) then return 0 end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
"""

_SERVER_NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

_HEARTBEAT = _SERVER_NOW_MS + """
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return 1
"""

_LIVE_MEMBERS = _SERVER_NOW_MS + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""

_ACQUIRE = """
local current = redis.call('GET', KEYS[1])
if (not current) or current == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""

_PUT_PLAN = """
local current = redis.call('GET', KEYS[1])
local version = tonumber(ARGV[2])
if version > 0 and current then
  local ok, decoded = pcall(cjson.decode, current)
  local stored = ok and tonumber(decoded['version']) or 0
  if stored >= version then return stored end
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[3]), -1)
return -1
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

_PUT_STATUS = _SERVER_NOW_MS + """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, member in ipairs(expired) do redis.call('HDEL', KEYS[1], member) end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
return 1
"""

_TAKE_SET = """
local members = redis.call('SMEMBERS', KEYS[1])
redis.call('DEL', KEYS[1])
return members
"""

_STATUSES = _SERVER_NOW_MS + """
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, member in ipairs(expired) do redis.call('HDEL', KEYS[1], member) end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
return redis.call('HGETALL', KEYS[1])
"""


def curve_record_to_dict(record: CurveRecord) -> dict[str, Any]:
    return {
        "vip": record.vip, "dip": record.dip, "curve": dict(record.curve), "w_max": record.w_max,
        "points": [list(p) for p in record.points], "model": record.model, "fit_error": record.fit_error,
        "fitted_at": record.fitted_at, "extra": dict(record.extra),
    }


def curve_record_from_dict(data: Mapping[str, Any]) -> CurveRecord:
    return CurveRecord(
        vip=str(data["vip"]), dip=str(data["dip"]), curve=dict(data["curve"]), w_max=float(data["w_max"]),
        points=tuple((float(p[0]), float(p[1])) for p in data.get("points", ())),
        model=str(data.get("model", "quadratic")),
        fit_error=None if data.get("fit_error") is None else float(data["fit_error"]),
        fitted_at=float(data.get("fitted_at", 0.0)), extra=dict(data.get("extra", {})),
    )


def _dumps(value: Any, field: str) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as bad:
        raise InvalidInputError(field, value, f"must be JSON-serialisable without NaN/inf: {bad}") from bad


def _plan_json(plan: WeightPlan) -> str:
    data = plan.to_dict()
    data["predicted_latency"] = {k: (v if math.isfinite(v) else None) for k, v in data["predicted_latency"].items()}
    return _dumps(data, "plan")


def _plan_from_json(text: str | bytes) -> WeightPlan:
    data = json.loads(text)
    data["predicted_latency"] = {
        k: (math.nan if v is None else v) for k, v in data.get("predicted_latency", {}).items()
    }
    return WeightPlan.from_dict(data)


def _measurement_json(m: Measurement) -> str:
    return _dumps(m.to_dict(), "measurement")


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _validate_resource(resource: str) -> str:
    if not isinstance(resource, str) or not RESOURCE_PATTERN.fullmatch(resource):
        raise InvalidInputError("resource", resource, "must be 1-200 characters of letters, digits, '.', '_', '-', ':'")
    return resource


P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
RedisClient: TypeAlias = "aioredis.Redis | RedisCluster"


class StoreSettings(Protocol):
    """What :meth:`RedisLatencyStore.from_settings` reads: the fields of the configuration file's
    ``redis`` block (:class:`knapsack_lb.config.RedisSettings`, which the store does not import)."""

    @property
    def url(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def cluster(self) -> bool: ...
    @property
    def measurement_retention_count(self) -> int: ...
    @property
    def measurement_retention_age(self) -> float: ...
    @property
    def plan_history(self) -> int: ...
    def startup_node_addresses(self) -> tuple[tuple[str, int], ...]: ...


UNAVAILABLE = (
    aioredis.ConnectionError, aioredis.TimeoutError, OSError,
    # Redis Cluster: down or failing over (CLUSTERDOWN, MASTERDOWN), a slot moved or migrating beyond the
    # client's retries (MOVED, ASK, TRYAGAIN), no reachable node or slots not covered
    redis_errors.ClusterError, redis_errors.AskError, redis_errors.TryAgainError, redis_errors.RedisClusterException,
)
# Programming errors a cluster client raises as RedisClusterException: never an outage
NOT_UNAVAILABLE = (redis_errors.CrossSlotTransactionError, redis_errors.InvalidPipelineStack)
CLUSTER_MODE_DISABLED = "Cluster mode is not enabled"


def _unavailable(exc: BaseException) -> bool:
    """True for the client errors that mean "the store does not answer now" (see the module
    docstring); False for a :class:`StoreUnavailableError` already raised (a ``ConnectionError``
    too), which passes through as it is."""
    return isinstance(exc, UNAVAILABLE) and not isinstance(exc, (*NOT_UNAVAILABLE, StoreUnavailableError))


def _store_errors(method: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    @functools.wraps(method)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await method(*args, **kwargs)
        except UNAVAILABLE as exc:
            if not _unavailable(exc):
                raise
            raise StoreUnavailableError(f"redis: {type(exc).__name__}: {exc}") from exc

    return wrapper


def _unavailable_as_store_errors(cls: type[T]) -> type[T]:
    """Every public coroutine method of ``cls`` raises :class:`StoreUnavailableError` for an
    unreachable Redis (private ones are steps of a public one, which maps their errors)."""
    for name, member in list(vars(cls).items()):
        if inspect.iscoroutinefunction(member) and not name.startswith("_") and name not in ("ping", "close"):
            setattr(cls, name, _store_errors(member))
    return cls


def create_redis_client(
    url: str, *, cluster: bool = False, startup_nodes: Sequence[tuple[str, int]] = (), socket_timeout: float = 2.0,
    **connection_options: Any,
) -> RedisClient:
    """The asyncio client of the store at ``url``: redis-py's ``RedisCluster`` when ``cluster``
    (``url`` is one startup node, ``startup_nodes`` more of them, tried when it is down), else the
    plain client. Nothing is sent until first use.

    Both follow the store's own retry policy, not redis-py's default, which changes with its version
    (8.x retries a cluster call 10 times, about 6 s against a cluster that is down; 6.x 3 times with
    waits of seconds; a plain client may not retry at all), while the callers retry on their own
    schedule (the probe worker writes a buffered round with the next one, the controller tries again
    the next interval). A call that failed to connect, lost its connection or timed out is retried
    :data:`STORE_RETRIES` times, each after a jittered wait of at most :data:`STORE_BACKOFF_BASE`
    doubled per failure, capped at :data:`STORE_BACKOFF_CAP`; a ``retry`` in ``connection_options``
    replaces the policy. A call against an unreachable store therefore fails after at most
    ``STORE_RETRIES + 1`` attempts, each bounded by ``socket_timeout``, plus the waits (0.3 s at most;
    redis-py adds 0.25 s before each retry when a cluster answers CLUSTERDOWN): within a second when
    connections are refused or the cluster is down, within ``(STORE_RETRIES + 1) * socket_timeout``
    and the waits when they hang.

    :class:`InvalidInputError` names ``redis_url`` (not redis://, rediss:// or unix://; on a
    cluster also a unix socket or a database other than 0, which Redis Cluster does not have) or
    ``startup_nodes`` (given without ``cluster``).
    """
    if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
        raise InvalidInputError("redis_url", url, "must start with redis://, rediss:// or unix://")
    options = dict(decode_responses=True, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout,
                   **connection_options)
    options.setdefault("retry", Retry(EqualJitterBackoff(cap=STORE_BACKOFF_CAP, base=STORE_BACKOFF_BASE),
                                      STORE_RETRIES))
    if not cluster:
        if startup_nodes:
            raise InvalidInputError("startup_nodes", list(startup_nodes), "are only used with a Redis Cluster "
                                    "(cluster: true)")
        return aioredis.Redis.from_url(url, **options)
    problem = cluster_url_problem(url)
    if problem:
        raise InvalidInputError("redis_url", url, problem)
    nodes = [ClusterNode(host, port) for host, port in startup_nodes]
    return RedisCluster.from_url(url, startup_nodes=nodes or None, **options)


def redacted_url(url: str) -> str:
    """``url`` with its password replaced by ``***``, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{user}:***@{host}").geturl()


def cluster_url_problem(url: str) -> str | None:
    """Why ``url`` cannot name a Redis Cluster node (a unix socket, a database other than 0), else None."""
    if url.startswith("unix://"):
        return "a Redis Cluster is reached over TCP: use redis://host:port or rediss://host:port"
    parts = urlsplit(url)
    if not parts.hostname:
        return "names no host: use redis://host:port"
    database = parts.path.strip("/")
    if database not in ("", "0"):
        return f"selects database {database}, but a Redis Cluster has only database 0"
    return None


@_unavailable_as_store_errors
class RedisLatencyStore:
    """:class:`~knapsack_lb.store.LatencyStore` on Redis (see the module docstring for keys)."""

    def __init__(
        self,
        client: RedisClient,
        *,
        namespace: str = "klb",
        retention_count: int = DEFAULT_RETENTION_COUNT,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        plan_history_limit: int = DEFAULT_PLAN_HISTORY,
        now: Callable[[], float] | None = None,
    ) -> None:
        validate_name("namespace", namespace)
        if not isinstance(retention_count, int) or retention_count < 1:
            raise InvalidInputError("retention_count", retention_count, "must be an integer >= 1")
        if not math.isfinite(retention_seconds) or retention_seconds <= 0:
            raise InvalidInputError("retention_seconds", retention_seconds, "must be a number > 0")
        if not isinstance(plan_history_limit, int) or plan_history_limit < 1:
            raise InvalidInputError("plan_history_limit", plan_history_limit, "must be an integer >= 1")
        self.client = client
        self.url = "<client>"  # from_url names the URL (password redacted); errors and checks show it
        self.namespace = namespace
        self.retention_count = retention_count
        self.retention_seconds = retention_seconds
        self.plan_history_limit = plan_history_limit
        self._now = now
        self._heartbeat = client.register_script(_HEARTBEAT)
        self._live_members = client.register_script(_LIVE_MEMBERS)
        self._acquire = client.register_script(_ACQUIRE)
        self._release = client.register_script(_RELEASE)
        self._put_plan = client.register_script(_PUT_PLAN)
        self._put_status = client.register_script(_PUT_STATUS)
        self._statuses = client.register_script(_STATUSES)
        self._take_set = client.register_script(_TAKE_SET)

    @classmethod
    def from_url(
        cls,
        url: str,
        namespace: str = "klb",
        *,
        retention_count: int = DEFAULT_RETENTION_COUNT,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        plan_history_limit: int = DEFAULT_PLAN_HISTORY,
        now: Callable[[], float] | None = None,
        socket_timeout: float = 2.0,
        measurement_retention_count: int | None = None,
        measurement_retention_age: float | None = None,
        plan_history: int | None = None,
        cluster: bool = False,
        startup_nodes: Sequence[tuple[str, int]] = (),
        **connection_options: Any,
    ) -> RedisLatencyStore:
        """Connect lazily to ``url`` (``redis://host:port/db``); nothing is sent until first use.

        ``cluster`` makes ``url`` a startup node of a Redis Cluster (``startup_nodes``: more of
        them, ``(host, port)``); see :func:`create_redis_client` for the errors.
        ``measurement_retention_count``, ``measurement_retention_age`` and ``plan_history``
        are the :class:`knapsack_lb.config.RedisSettings` names of ``retention_count``,
        ``retention_seconds`` and ``plan_history_limit``; given, they win.
        """
        retention_count = measurement_retention_count or retention_count
        retention_seconds = measurement_retention_age or retention_seconds
        plan_history_limit = plan_history or plan_history_limit
        client = create_redis_client(url, cluster=cluster, startup_nodes=startup_nodes, socket_timeout=socket_timeout,
                                     **connection_options)
        store = cls(client, namespace=namespace, retention_count=retention_count,
                    retention_seconds=retention_seconds, plan_history_limit=plan_history_limit, now=now)
        store.url = redacted_url(url)
        return store

    @classmethod
    def from_settings(cls, settings: StoreSettings, *, now: Callable[[], float] | None = None,
                      socket_timeout: float = 2.0) -> RedisLatencyStore:
        """The store a configuration file's ``redis`` block describes (one Redis or a Redis Cluster);
        how every process opens it. Connects lazily, like :meth:`from_url`."""
        return cls.from_url(
            settings.url, settings.namespace, retention_count=settings.measurement_retention_count,
            retention_seconds=settings.measurement_retention_age, plan_history_limit=settings.plan_history,
            now=now, socket_timeout=socket_timeout, cluster=settings.cluster,
            startup_nodes=settings.startup_node_addresses(),
        )

    @property
    def is_cluster(self) -> bool:
        return isinstance(self.client, RedisCluster)

    # --- keys (python-rq style templates) -------------------------------------------------
    def _vk(self, vip: str, suffix: str) -> str:
        return f"{self.namespace}:{{{validate_name('vip', vip)}}}:{suffix}"

    def _mkey(self, vip: str, dip: str) -> str:
        return self._vk(vip, f"m:{validate_name('dip', dip)}")

    @property
    def _vips_key(self) -> str:
        return f"{self.namespace}:vips"

    def _members_key(self, group: str) -> str:
        return f"{self.namespace}:{{members:{validate_name('group', group)}}}"

    def _lease_key(self, group: str, resource: str) -> str:
        return f"{self.namespace}:{{lease:{validate_name('group', group)}}}:{_validate_resource(resource)}"

    def _status_keys(self, component: str) -> list[str]:
        tag = f"{self.namespace}:{{status:{validate_name('component', component)}}}"
        return [f"{tag}:data", f"{tag}:exp"]

    # --- configuration -----------------------------------------------------------------------
    async def put_vip(self, config: VipConfig) -> None:
        """Index the name, then write the configuration (two slots: see "the ``ns:vips`` index")."""
        key = self._vk(config.name, "config")
        await self.client.sadd(self._vips_key, config.name)
        await self.client.set(key, config.model_dump_json())

    async def get_vip(self, vip: str) -> VipConfig | None:
        text = await self.client.get(self._vk(vip, "config"))
        return None if text is None else VipConfig.model_validate_json(text)

    async def list_vips(self) -> list[str]:
        return sorted(_text(v) for v in await self.client.smembers(self._vips_key))

    async def delete_vip(self, vip: str) -> None:
        """Delete the VIP's configuration and every key of it (measurements, plans, curves ...)."""
        dips = [_text(d) for d in await self.client.smembers(self._vk(vip, "mdips"))]
        keys = [self._vk(vip, s) for s in ("config", "mdips", "latest", "plan", "plans", "curves", "state",
                                           "remeasure", "lb", "budget")]
        keys += [self._mkey(vip, dip) for dip in dips]
        await self.client.delete(*keys)  # one slot: one atomic DEL
        await self.client.srem(self._vips_key, vip)

    # --- measurements --------------------------------------------------------------------------
    async def put_measurements(self, measurements: Sequence[Measurement], now: float | None = None) -> None:
        """Store one round (or several buffered rounds) in one pipeline, with retention."""
        if not measurements:
            return
        newest: dict[tuple[str, str], Measurement] = {}
        for m in measurements:
            key = (m.vip, m.dip)
            if key not in newest or m.time >= newest[key].time:
                newest[key] = m
        expire_ms = max(1, int(self.retention_seconds * 1000))
        async with self.client.pipeline(transaction=False) as pipe:
            for m in measurements:
                pipe.zadd(self._mkey(m.vip, m.dip), {_measurement_json(m): m.time})
            for (vip, dip), m in newest.items():
                mkey = self._mkey(vip, dip)
                reference = now if now is not None else (self._now() if self._now is not None else m.time)
                pipe.zremrangebyscore(mkey, "-inf", f"({reference - self.retention_seconds!r}")
                pipe.zremrangebyrank(mkey, 0, -(self.retention_count + 1))
                pipe.pexpire(mkey, expire_ms)
                pipe.sadd(self._vk(vip, "mdips"), dip)
                # EVAL, not EVALSHA: a pipeline with registered scripts would add a SCRIPT EXISTS round trip.
                pipe.eval(_PUT_LATEST, 1, self._vk(vip, "latest"), dip, repr(m.time), _measurement_json(m))
            await pipe.execute()

    async def measurements(
        self, vip: str, dip: str | None = None, since: float | None = None, limit: int | None = None
    ) -> list[Measurement]:
        """Oldest first; with ``limit``, the newest ``limit`` of them."""
        low = "-inf" if since is None else repr(float(since))
        dips = [dip] if dip is not None else sorted(
            _text(d) for d in await self.client.smembers(self._vk(vip, "mdips"))
        )
        if not dips:
            return []
        async with self.client.pipeline(transaction=False) as pipe:
            for name in dips:
                if limit is not None and dip is not None:
                    pipe.zrevrangebyscore(self._mkey(vip, name), "+inf", low, start=0, num=max(limit, 0))
                else:
                    pipe.zrangebyscore(self._mkey(vip, name), low, "+inf")
            replies = await pipe.execute()
        result = [Measurement.from_dict(json.loads(text)) for reply in replies for text in reply]
        result.sort(key=lambda m: (m.time, m.dip))
        if limit is not None:
            result = result[-limit:] if limit > 0 else []
        return result

    # --- plans, curves, controller state -------------------------------------------------------
    async def put_plan(self, plan: WeightPlan) -> None:
        """Store a plan as current and append it to the history, atomically; a versioned plan not
        newer than the stored one raises :class:`StalePlanError` (the fence against a stale writer)."""
        stored = await self._put_plan(keys=[self._vk(plan.vip, "plan"), self._vk(plan.vip, "plans")],
                                      args=[_plan_json(plan), plan.version, self.plan_history_limit])
        if int(stored) >= 0:
            raise StalePlanError(plan.vip, plan.version, int(stored))

    async def current_plan(self, vip: str) -> WeightPlan | None:
        text = await self.client.get(self._vk(vip, "plan"))
        return None if text is None else _plan_from_json(text)

    async def plan_history(self, vip: str, limit: int = 100) -> list[WeightPlan]:
        """The last ``limit`` plans, oldest first."""
        if limit <= 0:
            return []
        texts = await self.client.lrange(self._vk(vip, "plans"), -limit, -1)
        return [_plan_from_json(t) for t in texts]

    async def put_curves(self, vip: str, curves: Sequence[CurveRecord], replace: bool = False) -> None:
        """Upsert curves by DIP; ``replace=True`` drops the VIP's other curves."""
        mapping: dict[str, str] = {}
        for record in curves:
            if record.vip != vip:
                raise InvalidInputError("vip", record.vip, f"curve record belongs to another VIP than {vip!r}",
                                        dip=record.dip)
            mapping[validate_name("dip", record.dip)] = _dumps(curve_record_to_dict(record), "curve")
        key = self._vk(vip, "curves")
        async with self.client.pipeline(transaction=True) as pipe:
            if replace:
                pipe.delete(key)
            if mapping:
                pipe.hset(key, mapping=dict(mapping))  # type: ignore[arg-type]
            await pipe.execute()

    async def curves(self, vip: str) -> dict[str, CurveRecord]:
        raw = await self.client.hgetall(self._vk(vip, "curves"))
        return {_text(dip): curve_record_from_dict(json.loads(text)) for dip, text in raw.items()}

    async def put_controller_state(self, vip: str, state: Mapping[str, Any]) -> None:
        await self.client.set(self._vk(vip, "state"), _dumps(dict(state), "controller_state"))

    async def controller_state(self, vip: str) -> dict[str, Any] | None:
        text = await self.client.get(self._vk(vip, "state"))
        return None if text is None else dict(json.loads(text))

    async def put_in_force(self, vip: str, in_force: InForce) -> None:
        await self.client.set(self._vk(vip, "lb"), _dumps(in_force.to_dict(), "in_force"))

    async def in_force(self, vip: str) -> InForce | None:
        text = await self.client.get(self._vk(vip, "lb"))
        return None if text is None else InForce.from_dict(json.loads(text))

    async def put_probe_budget(self, vip: str, budget: Mapping[str, int], ttl: float) -> None:
        checked = check_probe_budget(budget, ttl)
        await self.client.set(self._vk(vip, "budget"), _dumps(checked, "probe_budget"), px=self._ttl_ms(ttl))

    async def probe_budget(self, vip: str) -> Any:
        text = await self.client.get(self._vk(vip, "budget"))
        return None if text is None else json.loads(text)

    async def request_remeasure(self, vip: str, dip: str) -> None:
        await self.client.sadd(self._vk(vip, "remeasure"), validate_name("dip", dip))

    async def take_remeasure_requests(self, vip: str) -> set[str]:
        """Read and clear atomically (one Lua script on one key): a request is taken exactly once."""
        members = await self._take_set(keys=[self._vk(vip, "remeasure")])
        return {_text(m) for m in members}

    async def snapshot(self, vip: str, measurements_since: float | None = None) -> VipSnapshot:
        """Configuration, newest measurement per DIP, plan, curves, state, remeasure: one round trip."""
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.get(self._vk(vip, "config"))
            pipe.hgetall(self._vk(vip, "latest"))
            pipe.get(self._vk(vip, "plan"))
            pipe.hgetall(self._vk(vip, "curves"))
            pipe.get(self._vk(vip, "state"))
            pipe.smembers(self._vk(vip, "remeasure"))
            pipe.get(self._vk(vip, "lb"))
            config, latest_raw, plan, curves_raw, state, remeasure, in_force = await pipe.execute()
        latest = {dip: Measurement.from_dict(json.loads(text)) for dip, text in latest_raw.items()}
        if measurements_since is not None:
            latest = {dip: m for dip, m in latest.items() if m.time >= measurements_since}
        return VipSnapshot(
            config=None if config is None else VipConfig.model_validate_json(config),
            latest=latest,
            current_plan=None if plan is None else _plan_from_json(plan),
            curves={dip: curve_record_from_dict(json.loads(t)) for dip, t in curves_raw.items()},
            controller_state=None if state is None else dict(json.loads(state)),
            remeasure=frozenset(remeasure),
            in_force=None if in_force is None else InForce.from_dict(json.loads(in_force)),
        )

    # --- leases and membership -------------------------------------------------------------------
    @staticmethod
    def _ttl_ms(ttl: float) -> int:
        if not math.isfinite(ttl) or ttl <= 0:
            raise InvalidInputError("ttl", ttl, "must be a number of seconds > 0")
        return max(1, int(ttl * 1000))

    async def heartbeat(self, group: str, member: str, ttl: float) -> None:
        await self._heartbeat(keys=[self._members_key(group)], args=[validate_name("member", member),
                                                                      self._ttl_ms(ttl)])

    async def live_members(self, group: str) -> list[str]:
        return sorted(await self._live_members(keys=[self._members_key(group)]))

    async def acquire_lease(self, group: str, resource: str, owner: str, ttl: float) -> bool:
        result = await self._acquire(keys=[self._lease_key(group, resource)],
                                     args=[validate_name("owner", owner), self._ttl_ms(ttl)])
        return bool(result)

    async def release_lease(self, group: str, resource: str, owner: str) -> None:
        await self._release(keys=[self._lease_key(group, resource)], args=[owner])

    async def lease_owner(self, group: str, resource: str) -> str | None:
        owner = await self.client.get(self._lease_key(group, resource))
        return None if owner is None else str(owner)

    # --- status ------------------------------------------------------------------------------------
    async def put_status(self, component: str, member: str, status: Mapping[str, Any], ttl: float) -> None:
        await self._put_status(keys=self._status_keys(component),
                               args=[validate_name("member", member), _dumps(dict(status), "status"),
                                     self._ttl_ms(ttl)])

    async def statuses(self, component: str) -> dict[str, dict[str, Any]]:
        flat = await self._statuses(keys=self._status_keys(component))
        return {flat[i]: json.loads(flat[i + 1]) for i in range(0, len(flat), 2)}

    async def ping(self) -> bool:
        try:
            return bool(await self.client.ping())
        except UNAVAILABLE as exc:
            if not _unavailable(exc):
                raise
            return False

    async def verify(self) -> str:
        """Check that the store answers and is what it was configured as; a one-line description.

        Raises :class:`InvalidInputError` naming ``redis.cluster`` and the URL when a plain Redis is
        configured as a cluster or a cluster node as a plain Redis (a mistake no retry fixes), and
        :class:`StoreUnavailableError` naming ``redis.url`` when nothing answers, a node is
        unreachable or a node reports ``cluster_state:fail`` (slots without a live master).
        """
        setting = "redis.url" + (" (redis.cluster: true)" if self.is_cluster else "")
        try:
            if isinstance(self.client, RedisCluster):
                return await self._verify_cluster()
            info = await self.client.info("server")
            cluster_info = await self.client.info("cluster")
        except UNAVAILABLE as exc:
            if not _unavailable(exc):
                raise
            if CLUSTER_MODE_DISABLED in str(exc):
                raise InvalidInputError("redis.cluster", self.url, "is true, but this Redis is not a cluster node "
                                        "(cluster_enabled:0): set redis.cluster: false or name a cluster node") from exc
            raise StoreUnavailableError(f"{setting} {self.url}: {type(exc).__name__}: {exc}") from exc
        if int(cluster_info.get("cluster_enabled", 0)):
            raise InvalidInputError("redis.cluster", self.url, "is false, but this Redis is a Redis Cluster node "
                                    "(cluster_enabled:1): set redis.cluster: true")
        return f"redis {info.get('redis_version', '?')}"

    async def _verify_cluster(self) -> str:
        """Every master must answer with ``cluster_state:ok``; an unreachable replica is only noted."""
        assert isinstance(self.client, RedisCluster)
        await self.client.initialize()
        primaries, replicas = self.client.get_primaries(), self.client.get_replicas()
        problems, notes = [], []
        for node in primaries + replicas:
            try:
                state = (await self.client.cluster_info(target_nodes=node)).get("cluster_state")
            except UNAVAILABLE as exc:
                if not _unavailable(exc):
                    raise
                if node in primaries:
                    problems.append(f"master {node.name} unreachable ({type(exc).__name__})")
                else:
                    notes.append(f"replica {node.name} unreachable")
                continue
            if state != "ok":
                problems.append(f"{node.name} reports cluster_state:{state}")
        if problems:
            raise StoreUnavailableError(f"redis.url (redis.cluster: true) {self.url}: the Redis Cluster is not "
                                        f"healthy: {'; '.join(problems)}")
        note = f" ({'; '.join(notes)})" if notes else ""
        return f"Redis Cluster: {len(primaries)} masters, {len(replicas)} replicas, cluster_state:ok{note}"

    async def close(self) -> None:
        await self.client.aclose()
