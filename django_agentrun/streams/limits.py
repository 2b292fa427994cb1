"""How many live streams a user holds open: at most AGENTRUN_STREAM_MAX_PER_USER.

With Redis (where the streams' deltas go) the count is shared by every web process: one
sorted set per user, a member per open stream scored by when it lapses (a process that
dies without closing its streams frees their places within `lapse` seconds; an open
stream renews its place whenever it re-checks its permission). Without Redis, or while it
does not answer, each process counts its own."""

from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import Any

from ..conf import agentrun_settings
from .reader import client

logger = logging.getLogger(__name__)

# Drop the lapsed places, then take one if fewer than the limit are held (atomic in Redis).
_TAKE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""

_lock = threading.Lock()
_local: dict[Any, int] = {}  # user id -> streams open in this process (without Redis)


def user_key(user_id: Any) -> str:
    return f"{agentrun_settings.STREAM_PREFIX}:open:{user_id}"


class Place:
    """One open stream's place among its user's; `release()` when the stream ends."""

    def __init__(self, user_id: Any, shared: bool, lapse: float) -> None:
        self.user_id = user_id
        self.shared = shared  # counted in Redis (else in this process)
        self.lapse = lapse
        self.token = secrets.token_hex(8)
        self.released = False

    def __del__(self) -> None:
        # A stream whose body never started (its client went away first) never released
        # its place: one counted in this process is given back here (Redis ones lapse).
        if not self.released and not self.shared:
            self.released = True
            _count(self.user_id, -1)

    async def renew(self) -> None:
        hub = client()
        if not self.shared or self.released or hub is None:
            return
        try:
            await hub.redis.zadd(user_key(self.user_id), {self.token: time.time() + self.lapse})
        except Exception as exc:  # noqa: BLE001 - the place lapses; the stream goes on
            logger.warning("Could not renew a stream's place (%s) user=%s", exc, self.user_id)

    async def release(self) -> None:
        if self.released:
            return
        self.released = True
        hub = client()
        if not self.shared or hub is None:
            _count(self.user_id, -1)
            return
        try:
            await hub.redis.zrem(user_key(self.user_id), self.token)
        except Exception as exc:  # noqa: BLE001 - it lapses by itself
            logger.warning("Could not free a stream's place (%s) user=%s", exc, self.user_id)


async def renew_all(places: list[Place]) -> None:
    """Renew every place of `places` (one Redis command per user: a process's re-check of a
    user's streams renews all of their places at once)."""
    hub = client()
    by_user: dict[Any, dict[str, float]] = {}
    lapse_at = time.time()
    for place in places:
        if place.shared and not place.released:
            by_user.setdefault(place.user_id, {})[place.token] = lapse_at + place.lapse
    if hub is None or not by_user:
        return
    try:
        pipe = hub.redis.pipeline(transaction=False)
        for user_id, tokens in by_user.items():
            pipe.zadd(user_key(user_id), tokens)
        await pipe.execute()
    except Exception as exc:  # noqa: BLE001 - the places lapse; the streams go on
        logger.warning("Could not renew streams' places (%s)", exc)


async def take(user_id: Any, lapse: float) -> Place | None:
    """A place for one more stream of `user_id`, or None (the user holds the maximum)."""
    limit = agentrun_settings.STREAM_MAX_PER_USER
    hub = client()
    place = Place(user_id, hub is not None and limit is not None, lapse)
    if limit is None:
        _count(user_id, +1)
        return place
    if hub is not None:
        try:
            now = time.time()
            taken = await hub.redis.eval(
                _TAKE,
                1,
                user_key(user_id),
                now,
                int(limit),
                now + lapse,
                place.token,
                int(lapse) + 1,
            )
            return place if taken else None
        except Exception as exc:  # noqa: BLE001 - count in this process instead
            logger.warning("Stream places counted per process (%s) user=%s", exc, user_id)
            place.shared = False
    with _lock:
        if _local.get(user_id, 0) >= int(limit):
            return None
        _local[user_id] = _local.get(user_id, 0) + 1
    return place


def _count(user_id: Any, step: int) -> None:
    with _lock:
        held = _local.get(user_id, 0) + step
        if held > 0:
            _local[user_id] = held
        else:
            _local.pop(user_id, None)
