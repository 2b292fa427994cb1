"""Reading a run's live stream from Redis in an async view (`redis.asyncio`): where the
answer being written starts, what came since, and blocking reads for what comes next.
One connection pool per event loop, shared by every stream the loop serves."""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from typing import Any

from .config import attempt_key, redis_url

logger = logging.getLogger(__name__)

Entry = tuple[str, dict[str, Any]]

_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Any]] = (
    weakref.WeakKeyDictionary()
)


def client() -> Any | None:
    """The loop's `redis.asyncio` client for the configured Redis, or None."""
    url = redis_url()
    if url is None:
        return None
    loop = asyncio.get_running_loop()
    per_url = _clients.setdefault(loop, {})
    found = per_url.get(url)
    if found is None:
        import redis.asyncio

        found = per_url[url] = redis.asyncio.Redis.from_url(
            url, socket_connect_timeout=1.0, health_check_interval=30
        )
    return found


def _entries(raw: Any) -> list[Entry]:
    out = []
    for entry_id, fields in raw or []:
        data = fields.get(b"d") or fields.get("d")
        try:
            item = json.loads(data)
        except (TypeError, ValueError):
            continue
        out.append((entry_id.decode() if isinstance(entry_id, bytes) else entry_id, item))
    return out


class RunDeltas:
    """One stream client's reader of one Redis stream."""

    def __init__(self, redis: Any, key: str) -> None:
        self.redis = redis
        self.key = key

    async def catch_up(self) -> tuple[list[Entry], str]:
        """The entries from the newest attempt marker on (the answer being written, if
        any), and the id to read on from."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(attempt_key(self.key))
        pipe.xrevrange(self.key, count=1)
        start, last = await pipe.execute()
        last_id = _entries(last)[0][0] if last else "0-0"
        if not start or last_id == "0-0":
            return [], last_id
        start = start.decode() if isinstance(start, bytes) else start
        return _entries(await self.redis.xrange(self.key, min=start, max=last_id)), last_id

    async def read(self, after: str, block_ms: int) -> list[Entry]:
        """Entries after `after`, waiting up to `block_ms` for the first."""
        found = await self.redis.xread({self.key: after}, count=500, block=max(1, block_ms))
        return _entries(found[0][1]) if found else []
