"""The hosted limiter: the state lives in Redis (REDIS_URL), shared by every worker on every host.
Each step is one Lua script (atomic on the server) and reads the server's clock (TIME), so hosts
with skewed clocks agree on expiry and refills.

Per limit key: a sorted set of holders (score: lease expiry, ms), a sorted set of waiters in arrival
order (score: a counter), a sorted set of waiter heartbeats (a waiter that stops polling is dropped),
and a hash with the request / token buckets and a shared pause (a vendor's Retry-After).
"""
from __future__ import annotations

import hashlib

from django.conf import settings

from veronica.agent.providers.limit_config import Limit

WAITER_TTL_MS = 15_000
KEY_TTL_MS = 86_400_000  # idle limits leave nothing behind
SLOT_POLL_MS = 30  # a slot frees when a call ends: look again soon (same-process waiters are woken at once)

_CLOCK = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

_LEVELS = """
local function levels(now, rpm, tpm)
  local b = redis.call('HMGET', KEYS[4], 'rpm', 'tpm', 'at', 'paused')
  local at = tonumber(b[3]) or now
  local elapsed = math.max(now - at, 0)
  local r = math.min((tonumber(b[1]) or rpm) + elapsed * rpm / 60000, rpm)
  local k = math.min((tonumber(b[2]) or tpm) + elapsed * tpm / 60000, tpm)
  return r, k, tonumber(b[4]) or 0
end
"""

# KEYS: holders, queue, alive, bucket, seq. ARGV: ticket, cap, lease_ms, rpm, tpm, tokens.
# Returns {0, 0} when granted, else {milliseconds worth waiting, how many wait ahead}.
ACQUIRE = _CLOCK + _LEVELS + """
local ticket, cap, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local rpm, tpm, tokens = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
for _, d in ipairs(dead) do
  redis.call('ZREM', KEYS[2], d)
  redis.call('ZREM', KEYS[3], d)
end
if not redis.call('ZSCORE', KEYS[2], ticket) then
  redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[5]), ticket)
end
redis.call('ZADD', KEYS[3], now + %(ttl)d, ticket)
for i = 1, 5 do redis.call('PEXPIRE', KEYS[i], %(key_ttl)d) end
local ahead = redis.call('ZRANK', KEYS[2], ticket)
local r, k, paused = levels(now, rpm, tpm)
if paused > now then return {paused - now, ahead} end
local wait = 0
if rpm > 0 and r < ahead + 1 then wait = math.max(wait, math.ceil((ahead + 1 - r) * 60000 / rpm)) end
local need = math.min(tokens, tpm)
if tpm > 0 and k < need then wait = math.max(wait, math.ceil((need - k) * 60000 / tpm)) end
if wait > 0 then return {wait, ahead} end
if cap > 0 and ahead >= cap - redis.call('ZCARD', KEYS[1]) then return {%(slot_poll)d, ahead} end
if cap > 0 then redis.call('ZADD', KEYS[1], now + lease, ticket) end
redis.call('ZREM', KEYS[2], ticket)
redis.call('ZREM', KEYS[3], ticket)
if rpm > 0 or tpm > 0 then
  redis.call('HSET', KEYS[4], 'rpm', r - (rpm > 0 and 1 or 0), 'tpm', k - (tpm > 0 and tokens or 0), 'at', now)
end
return {0, 0}
""" % {"ttl": WAITER_TTL_MS, "key_ttl": KEY_TTL_MS, "slot_poll": SLOT_POLL_MS}

# KEYS: holders, queue, alive, bucket. ARGV: ticket, tpm, token_delta.
RELEASE = _CLOCK + _LEVELS + """
redis.call('ZREM', KEYS[1], ARGV[1])
local tpm, delta = tonumber(ARGV[2]), tonumber(ARGV[3])
if tpm > 0 and delta ~= 0 then
  local r, k = levels(now, tonumber(redis.call('HGET', KEYS[4], 'rpm_cap') or '0'), tpm)
  redis.call('HSET', KEYS[4], 'tpm', math.min(k - delta, tpm), 'at', now, 'rpm', r)
end
return 1
"""

# KEYS: holders. ARGV: ticket, lease_ms. A lease that already expired is not taken back (XX).
RENEW = _CLOCK + """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) < now then return 0 end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
return 1
"""

# KEYS: bucket. ARGV: ms.
PAUSE = _CLOCK + """
local until = now + tonumber(ARGV[1])
local paused = tonumber(redis.call('HGET', KEYS[1], 'paused') or '0')
if until > paused then redis.call('HSET', KEYS[1], 'paused', until) end
redis.call('PEXPIRE', KEYS[1], %(key_ttl)d)
return 1
""" % {"key_ttl": KEY_TTL_MS}

HELD = _CLOCK + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
"""

class RedisLimiter:
    name = "redis"

    def __init__(self, url: str | None = None) -> None:
        import redis

        self.client = redis.Redis.from_url(url or settings.REDIS_URL, socket_timeout=5, health_check_interval=30)
        self._scripts = {name: self.client.register_script(src) for name, src in
                         (("acquire", ACQUIRE), ("release", RELEASE), ("renew", RENEW), ("pause", PAUSE), ("held", HELD))}

    def _keys(self, limit: Limit) -> list[str]:
        digest = hashlib.sha1(limit.key.encode()).hexdigest()[:16]
        base = f"{getattr(settings, 'CHANNEL_PREFIX', 'veronica')}:limit:{{{digest}}}"  # one hash slot (cluster-safe)
        return [f"{base}:holders", f"{base}:queue", f"{base}:alive", f"{base}:bucket", f"{base}:seq"]

    def enqueue(self, limit: Limit, ticket: str) -> None:
        pass  # the first try_acquire joins the queue (atomically with its first look)

    def leave(self, limit: Limit, ticket: str) -> None:
        holders, queue, alive, *_ = self._keys(limit)
        pipe = self.client.pipeline()
        pipe.zrem(queue, ticket)
        pipe.zrem(alive, ticket)
        pipe.execute()

    def try_acquire(self, limit: Limit, ticket: str, tokens: int) -> tuple[float, int]:
        keys = self._keys(limit)
        if limit.rpm:
            self.client.hset(keys[3], "rpm_cap", limit.rpm)
        wait, ahead = self._scripts["acquire"](keys=keys, args=[ticket, limit.concurrency, limit.lease_seconds * 1000,
                                                               limit.rpm, limit.tpm, tokens])
        return int(wait) / 1000.0, int(ahead)

    def renew(self, limit: Limit, ticket: str) -> bool:
        if not limit.concurrency:
            return True
        return bool(self._scripts["renew"](keys=self._keys(limit)[:1], args=[ticket, limit.lease_seconds * 1000]))

    def release(self, limit: Limit, ticket: str, token_delta: int) -> None:
        self._scripts["release"](keys=self._keys(limit)[:4], args=[ticket, limit.tpm, token_delta])

    def pause(self, limit: Limit, seconds: float) -> None:
        self._scripts["pause"](keys=self._keys(limit)[3:4], args=[int(seconds * 1000)])

    def held(self, limit: Limit) -> int:
        return int(self._scripts["held"](keys=self._keys(limit)[:1]))

