"""Publishing deltas never slows a turn down: a bounded queue and one thread per process,
Redis down or hanging or not configured at all; what reaches Redis, coalesced."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from django_agentrun import streams
from django_agentrun.streams.publisher import Publisher, coalesce, publisher
from django_agentrun.streams.reader import Hub, RunDeltas

pytestmark = pytest.mark.timeout(30)


def delta(text: str, index: int = 0, turn: int = 0, attempt: int = 0) -> dict:
    return {"kind": "text", "index": index, "text": text, "turn": turn, "attempt": attempt}


def test_coalesce__joins_consecutive_deltas_of_one_block():
    batch = [
        ("k", delta("Hel")),
        ("k", delta("lo")),
        ("k", delta("!", index=1)),
        ("k", {"kind": "commit", "seq": 4}),
        ("k", delta(" there", index=1)),
        ("other", delta(" there", index=1)),
        ("k", delta("x", index=1, attempt=1)),
    ]
    assert coalesce(batch) == [
        ("k", delta("Hello")),
        ("k", delta("!", index=1)),
        ("k", {"kind": "commit", "seq": 4}),
        ("k", delta(" there", index=1)),
        ("other", delta(" there", index=1)),
        ("k", delta("x", index=1, attempt=1)),
    ]


def test_redis_url__from_the_setting_or_the_broker(settings):
    settings.AGENTRUN_STREAM_URL = ""
    assert streams.redis_url() is None and publisher() is None
    assert streams.turn_stream("r", 0) is None
    streams.notify("r", 1)  # a no-op without Redis
    settings.AGENTRUN_STREAM_URL = "redis://127.0.0.1:6379/13"
    assert streams.redis_url() == "redis://127.0.0.1:6379/13"
    settings.AGENTRUN_STREAM_URL = "amqp://guest@localhost//"
    assert streams.redis_url() is None
    settings.AGENTRUN_STREAM_URL = None  # Celery's broker (tests.settings: Redis db 9)
    assert streams.redis_url() == settings.CELERY_BROKER_URL


def _silent_server() -> tuple[socket.socket, int]:
    """A TCP server that accepts and never answers (a hung Redis)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(100)
    return server, server.getsockname()[1]


@pytest.mark.parametrize("redis", ["refused", "hanging"])
def test_publishing__never_blocks_whatever_redis_does(redis, settings):
    if redis == "refused":
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]  # closed again: nobody listens there
        server = None
    else:
        server, port = _silent_server()
    settings.AGENTRUN_STREAM_QUEUE_SIZE = 1000
    pub = Publisher(f"redis://127.0.0.1:{port}/0")
    started = time.perf_counter()
    for n in range(5000):
        pub.put("k", delta(f"chunk {n} "))
    elapsed = time.perf_counter() - started
    assert elapsed < 0.5, elapsed  # 5,000 deltas: about 10 µs each, not a network call each
    assert pub.dropped >= 5000 - 1000 - 500  # past the queue (and the batch in hand)
    assert pub.published == 0
    if server is not None:
        server.close()


def test_publishing__reaches_redis_with_the_attempt_marked(stream_redis):
    turn = streams.turn_stream("run-1", 3)
    assert turn is not None
    first = turn.attempt(0)
    first({"kind": "block_start", "index": 0, "block": "text"})
    first({"kind": "text", "index": 0, "text": "Hel"})
    second = turn.attempt(1)  # a retry: its deltas start over
    for piece in ("Hel", "lo"):
        second({"kind": "text", "index": 0, "text": piece})
    streams.notify("run-1", 9)
    pub = publisher()
    assert pub is not None and pub.flush()

    async def read():
        import redis.asyncio

        client = redis.asyncio.Redis.from_url(stream_redis)
        deltas = RunDeltas(Hub(client), streams.run_key("run-1"))
        try:
            return await deltas.catch_up(), deltas.last
        finally:
            deltas.close()
            await client.aclose()

    entries, last_id = asyncio.run(read())
    items = [item for _, item in entries]
    assert items[0]["kind"] == "attempt" and (items[0]["turn"], items[0]["attempt"]) == (3, 1)
    assert items[1] == {"kind": "text", "index": 0, "text": "Hello", "turn": 3, "attempt": 1}
    assert items[2] == {"kind": "commit", "seq": 9}
    assert entries[-1][0] == last_id


def _publishing_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "agentrun-stream-publisher")


def test_publishing__one_thread_a_process(stream_redis):
    before = _publishing_threads()
    for n in range(50):
        pub = publisher()
        assert pub is not None
        pub.put(streams.run_key("run-2"), delta(str(n)))
    assert publisher() is pub and pub.flush()
    assert _publishing_threads() - before <= 1  # none if an earlier test started it


def test_reading__many_clients_share_one_blocking_read(stream_redis):
    """150 clients of two runs (more than a Redis pool's default 100 connections): each gets
    every entry after its catch-up once, through the loop's hub."""
    from django_agentrun.streams import reader

    keys = [streams.run_key("run-a"), streams.run_key("run-b")]
    pub = publisher()
    assert pub is not None

    async def scenario():
        hub = reader.client()
        assert hub is not None and reader.client() is hub
        clients = [RunDeltas(hub, keys[n % 2]) for n in range(150)]
        await asyncio.gather(*(c.catch_up() for c in clients))
        for n in range(20):
            for key in keys:
                pub.put(key, delta(f"{n};", index=n))
        await asyncio.to_thread(pub.flush)
        got = {id(c): [] for c in clients}
        deadline = asyncio.get_running_loop().time() + 5
        while any(len(v) < 20 for v in got.values()):
            assert asyncio.get_running_loop().time() < deadline, {len(v) for v in got.values()}
            for c in clients:
                got[id(c)] += [item["text"] for _, item in await c.next(0.01)]
        connections = hub.redis.connection_pool.max_connections
        for c in clients:
            c.close()
        assert hub.queues == {}
        return got, connections

    got, connections = asyncio.run(scenario())
    assert all(texts == [f"{n};" for n in range(20)] for texts in got.values())
    assert connections == reader.POOL_SIZE  # a bounded pool that waits, never refuses
