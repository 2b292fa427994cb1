"""The rate-limit governor: the account's limits, shared by every worker on every host
through Redis, spent before a request is sent and learned from the API's answers.

The Messages API measures requests, input tokens and output tokens per minute, per
organization and model, with a token bucket that is replenished continuously (a limit
of 60 requests a minute may be enforced as one a second), and says where the account
stands in every response's headers: `anthropic-ratelimit-{requests,input-tokens,
output-tokens}-{limit,remaining,reset}` (reset in RFC 3339); a refusal is a 429 with
`retry-after` (seconds). Source: https://docs.claude.com/en/api/rate-limits ("Response
headers", "About our limits").

What the governor keeps, per hashed API key (never the key) and model, in a few Redis
keys that expire when unused (nothing to leak when a worker is SIGKILLed):

- the limits learned, as rates per second (and `blocked`: a time before which nothing may
  be sent: a 429's `retry-after`, or a reset while nothing remains);
- one GCRA "theoretical arrival time" per dimension (requests and input tokens are spent
  before sending; output tokens once known, as a debt the next requests wait for);
- the fair share: requests waiting (each a member "priority|key|ticket" scored with the
  time it comes back by, and the time it was first told to wait) and, per fair-share key,
  how many requests it was granted. A request waits while a request of a higher priority
  waits, or of another key that was granted fewer; so runs are served by priority, then
  fairly across keys. A place in line is kept until the time its request comes back by,
  and a short while after (RETURN_SLACK, or two intervals of the limit): a run that never
  comes back (cancelled, timed out, capped) holds nobody back longer. A background request
  that has waited AGENTRUN_FAIR_SHARE_AGING_SECONDS counts as interactive (it ages), so
  steady interactive load never starves it.

`admit` answers with a `Verdict`: go (after at most AGENTRUN_GOVERNOR_MAX_WAIT_SECONDS,
the pacing), or come back after `wait` seconds (the engine parks the run). One Lua script
decides, so workers on every host agree (Redis's clock). Without Redis (no URL, or it
cannot be reached) every request goes, per process (fail open, logged once a minute).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import random
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

logger = logging.getLogger(__name__)

HEADER = "anthropic-ratelimit-"
# A run told "not now" comes back after about its key's waiting requests x the keys
# waiting x the interval between two requests, times this: its turn, if every waiting run
# came back in order (sooner costs a claim; later leaves the limit unused).
SPREAD = 1.0
# Seconds past the time a request was to come back by that its place in line is kept (at
# least two intervals of the limit): a run that is not back by then lost its place.
RETURN_SLACK = 2.0
# Header dimension -> the governor's short name.
DIMENSIONS = {"requests": "req", "input-tokens": "in", "output-tokens": "out"}

_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
if ARGV[10] ~= '' then now = tonumber(ARGV[10]) end
local share, prio, ticket = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local cost_in, max_wait, ttl = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local slack, spread, aging = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local lim = {}
local raw = redis.call('HGETALL', KEYS[1])
for i = 1, #raw, 2 do lim[raw[i]] = tonumber(raw[i + 1]) end
if not lim.req_rate and not lim.in_rate and not lim.out_rate
   and not (lim.blocked and lim.blocked > now) then
  return {1, '0'}
end
local interval = 1 / (lim.req_rate or 1)
-- A place in line is kept until its come-back time, and a little after: no longer.
local keep = math.max(slack, 2 * interval)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - keep)
local me = prio .. '|' .. share .. '|' .. ticket
redis.call('ZREM', KEYS[3], me)
-- A background request that waited long enough counts as interactive (it ages).
local function level(p, tk)
  if p > 0 then
    local since = tonumber(redis.call('HGET', KEYS[5], tk) or '')
    if since and now - since >= aging then return 0 end
  end
  return p
end
local mine_level = level(prio, ticket)
local mine = tonumber(redis.call('HGET', KEYS[4], share) or '0')
-- The requests ahead of this one (a higher priority, or a key granted fewer) that come
-- back about now: the limit keeps room for them. One due later holds nothing back yet.
local reserve, keys, floor, n_mine, n_keys = 0, {}, nil, 1, 1
local listed = redis.call('ZRANGE', KEYS[3], 0, -1, 'WITHSCORES')
for i = 1, #listed, 2 do
  local m, due = listed[i], tonumber(listed[i + 1])
  local p, s, tk = string.match(m, '^(%d+)|([^|]*)|(.*)$')
  p = level(tonumber(p), tk)
  local ahead = false
  if p < mine_level then
    ahead = true
  elseif p == mine_level then
    if s == share then n_mine = n_mine + 1 elseif not keys[s] then
      keys[s] = true
      n_keys = n_keys + 1
      local v = tonumber(redis.call('HGET', KEYS[4], s) or '0')
      if floor == nil or v < floor then floor = v end
    end
    if s ~= share and tonumber(redis.call('HGET', KEYS[4], s) or '0') < mine then
      ahead = true
    end
  end
  if ahead and due <= now + interval then reserve = reserve + 1 end
end
local wait, news = 0, {}
if lim.blocked and lim.blocked > now then wait = lim.blocked - now end
for dim, cost in pairs({req = 1, ['in'] = cost_in}) do
  local rate, burst = lim[dim .. '_rate'], lim[dim .. '_burst']
  if rate and rate > 0 then
    cost = math.min(cost, burst)
    local tat = tonumber(redis.call('HGET', KEYS[2], dim) or '0')
    if tat < now then tat = now end
    news[dim] = tat + cost / rate
    -- Room for this request after the requests held room for (requests only).
    local held = dim == 'req' and reserve / rate or 0
    if news[dim] + held - burst / rate - now > wait then
      wait = news[dim] + held - burst / rate - now
    end
  end
end
if lim.out_rate and lim.out_rate > 0 then
  local tat = tonumber(redis.call('HGET', KEYS[2], 'out') or '0')
  if tat - lim.out_burst / lim.out_rate - now > wait then
    wait = tat - lim.out_burst / lim.out_rate - now
  end
end
if wait <= max_wait + 1e-6 then
  for dim, new in pairs(news) do redis.call('HSET', KEYS[2], dim, tostring(new)) end
  if floor ~= nil and floor > mine then mine = floor end
  redis.call('HSET', KEYS[4], share, tostring(mine + 1))
  redis.call('HDEL', KEYS[5], ticket)
  for i = 2, 5 do redis.call('EXPIRE', KEYS[i], ttl) end
  return {1, tostring(wait)}
end
local back = math.max(wait, n_mine * n_keys * interval * spread, interval)
redis.call('ZADD', KEYS[3], now + back, me)
redis.call('HSETNX', KEYS[5], ticket, tostring(now))
redis.call('EXPIRE', KEYS[3], ttl)
redis.call('EXPIRE', KEYS[5], ttl)
return {0, tostring(back)}
"""

_LEARN = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ttl, block, out = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
for i = 4, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
if block > 0 then
  local until_ = now + block
  local held = tonumber(redis.call('HGET', KEYS[1], 'blocked') or '0')
  if until_ > held then redis.call('HSET', KEYS[1], 'blocked', tostring(until_)) end
end
local rate = tonumber(redis.call('HGET', KEYS[1], 'out_rate') or '0')
if out > 0 and rate > 0 then
  local tat = tonumber(redis.call('HGET', KEYS[2], 'out') or '0')
  if tat < now then tat = now end
  redis.call('HSET', KEYS[2], 'out', tostring(tat + out / rate))
end
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('EXPIRE', KEYS[2], ttl)
return 1
"""


@dataclass(frozen=True)
class Verdict:
    """Go (after sleeping `wait` seconds, at most the pacing bound), or come back after
    `wait` seconds (nothing was spent)."""

    go: bool
    wait: float = 0.0


GO = Verdict(True)


def scope_of(api_key: str | None, base_url: str | None) -> str:
    """Whose limits: a hash of the API key (and where it is sent), never the key itself."""
    digest = hashlib.sha256(f"{base_url or ''}\0{api_key or ''}".encode()).hexdigest()
    return digest[:24]


def read_headers(headers: Any, now: float | None = None) -> tuple[dict[str, float], float]:
    """The limits a response's headers state, as the governor keeps them ({"req_rate",
    "req_burst", ...} per second), and how long nothing may be sent (a dimension with
    nothing remaining, until its reset; 0 otherwise)."""
    now = time.time() if now is None else now
    fields: dict[str, float] = {}
    blocked = 0.0
    for dimension, short in DIMENSIONS.items():
        limit = _number(headers.get(f"{HEADER}{dimension}-limit"))
        if limit is None or limit <= 0:
            continue
        fields[f"{short}_rate"] = limit / 60.0
        # Requests: a minute's limit may be enforced per second, so a second's worth at
        # once; tokens: the bucket holds a minute's worth.
        fields[f"{short}_burst"] = max(1.0, limit / 60.0) if short == "req" else limit
        remaining = _number(headers.get(f"{HEADER}{dimension}-remaining"))
        reset = _reset(headers.get(f"{HEADER}{dimension}-reset"))
        if remaining is not None and remaining <= 0 and reset is not None:
            blocked = max(blocked, reset - now)
    return fields, blocked


def _number(value: Any) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def _reset(value: Any) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def estimate_input_tokens(params: dict[str, Any]) -> int:
    """A rough count of a request's input tokens (about 4 characters a token), spent
    before sending; the answer's usage is what the API counts."""
    size = sum(len(json.dumps(params.get(k) or "", default=str)) for k in ("system", "messages"))
    return size // 4 + 1


def share_of(admission: dict[str, Any]) -> tuple[str, int, str]:
    """(fair-share key, priority: 0 first, ticket) of a request. For a run: the key it was
    created with (in `admission`: Run.share_key), else the one agents.share_key names; a
    conversation's message first unless AGENTRUN_FAIR_SHARE_INTERACTIVE_FIRST is off."""
    from ..agents import share_key
    from ..conf import agentrun_settings as s

    run = admission.get("run")
    if run is None:
        key = admission.get("key") or "-"
        priority = int(admission.get("priority") or 0)
        ticket = admission.get("ticket") or random.random()
    else:
        key = admission.get("key") or share_key(run)
        interactive = run.conversation_id is not None and s.FAIR_SHARE_INTERACTIVE_FIRST
        priority, ticket = (0 if interactive else 1), run.pk
    return str(key).replace("|", "/"), priority, str(ticket)


class Governor:
    """The account's limits in Redis (see the module's docstring)."""

    def __init__(self, url: str, prefix: str = "agentrun:gov", clock: Any = None) -> None:
        import redis

        self.prefix = prefix
        # Seconds since the epoch, or None: Redis's clock (every worker agrees on it). A
        # clock of its own is for tests that play time forward (tests/explorer).
        self.clock = clock
        self._redis = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        self._admit = self._redis.register_script(_ADMIT)
        self._learn = self._redis.register_script(_LEARN)
        self._warned = 0.0

    def _keys(self, scope: str, model: str) -> list[str]:
        base = f"{self.prefix}:{scope}:{model}"
        return [
            f"{base}:limits",
            f"{base}:tat",
            f"{base}:waiting",
            f"{base}:granted",
            f"{base}:since",
        ]

    def admit(
        self, scope: str, model: str, admission: dict[str, Any] | None, input_tokens: int
    ) -> Verdict:
        """May a request of `model` go now? (Spends its request and input tokens if so.)"""
        from ..conf import agentrun_settings as s

        key, priority, ticket = share_of(admission or {})
        args = [
            key,
            priority,
            ticket,
            input_tokens,
            float(s.GOVERNOR_MAX_WAIT_SECONDS),
            int(s.GOVERNOR_TTL_SECONDS),
            RETURN_SLACK,
            SPREAD,
            float(s.FAIR_SHARE_AGING_SECONDS),
            "" if self.clock is None else repr(float(self.clock())),
        ]
        try:
            go, wait = self._admit(keys=self._keys(scope, model), args=args)
        except Exception:  # noqa: BLE001 - no governor: the request goes (fail open)
            self._warn("admit")
            return GO
        return Verdict(bool(int(go)), max(0.0, float(wait)))

    def learn(
        self,
        scope: str,
        model: str,
        headers: Any,
        *,
        output_tokens: int = 0,
        retry_after: float | None = None,
    ) -> None:
        """Keep what a response (or a refusal) says of the limits; spend its output tokens."""
        fields, blocked = read_headers(headers)
        block = max(blocked, retry_after or 0.0)
        from ..conf import agentrun_settings as s

        args: list[Any] = [int(s.GOVERNOR_TTL_SECONDS), block, output_tokens]
        for name, value in fields.items():
            args += [name, value]
        keys = self._keys(scope, model)[:2]
        try:
            self._learn(keys=keys, args=args)
        except Exception:  # noqa: BLE001 - the next response teaches it again
            self._warn("learn")

    def _warn(self, what: str) -> None:
        if time.monotonic() - self._warned > 60:
            self._warned = time.monotonic()
            logger.warning("Rate-limit governor unavailable (%s): requests go", what, exc_info=True)


@functools.cache
def _governor(url: str) -> Governor:
    return Governor(url)


def get_governor() -> Governor | None:
    """The governor of AGENTRUN_GOVERNOR_URL (None: Celery's broker when it is Redis; "":
    none), one per process; None when there is no Redis to share."""
    from ..conf import agentrun_settings

    url = agentrun_settings.GOVERNOR_URL
    if url is None:
        url = _broker_url()
    if not url or not str(url).startswith(("redis://", "rediss://", "unix://")):
        return None
    return _governor(str(url))


def _broker_url() -> str | None:
    try:
        from celery import current_app

        url = current_app.conf.broker_url
    except Exception:  # noqa: BLE001 - no Celery app: nothing to share
        return None
    if isinstance(url, list | tuple):
        url = url[0] if url else None
    return str(url) if url else None


def park_delay(retry_after: float | None, status: int | None) -> float:
    """How long a run refused by the API waits (a 429's retry-after; a 529 without one: the
    engine's base backoff), with jitter so that parked runs do not come back at once."""
    from ..conf import agentrun_settings

    base = retry_after if retry_after else agentrun_settings.MODEL_RETRY_BASE_SECONDS
    return min(base, agentrun_settings.MODEL_RETRY_MAX_SECONDS) * (1 + random.random() * 0.2)
