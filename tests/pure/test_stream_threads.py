"""`stream_threads(application)`: the synchronous parts of stream requests run on a few
shared threads, not one of each request's own (issue #40); other requests as before."""

from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import ThreadSensitiveContext, sync_to_async

from django_agentrun.api import stream_serving
from django_agentrun.api.stream_serving import stream_threads

pytestmark = pytest.mark.skipif(
    not stream_serving.TAKES_EXECUTOR, reason="asgiref without ThreadSensitiveContext(executor)"
)


def test_stream_requests_share_a_few_threads_others_do_not():
    seen: dict[str, set[int]] = {"stream": set(), "other": set()}

    async def django_like(scope, receive, send):
        # As Django's ASGIHandler: a context of the request's own, then its synchronous
        # middleware on the context's thread (while many requests wait at once).
        async with ThreadSensitiveContext():
            await asyncio.sleep(0.01)
            ident = await sync_to_async(threading.get_ident)()
            kind = "stream" if scope["path"].endswith("/stream/") else "other"
            seen[kind].add(ident)
            await asyncio.sleep(0.01)

    app = stream_threads(django_like)

    async def go():
        paths = [
            *(f"/api/agentrun/runs/{n}/stream/" for n in range(40)),
            *(f"/api/agentrun/conversations/{n}/stream/" for n in range(10)),
            *(f"/api/agentrun/runs/{n}/" for n in range(20)),
        ]
        await asyncio.gather(*(app({"type": "http", "path": p}, None, None) for p in paths))

    asyncio.run(go())
    assert 1 <= len(seen["stream"]) <= stream_serving.SHARED_THREADS
    assert len(seen["other"]) > stream_serving.SHARED_THREADS  # a thread each, as Django does
