"""The hub as it is served (issue #40): uvicorn (one process) and a real Celery worker on
Postgres and Redis, many watchers on raw sockets (one asyncio loop, no thread each).

Every watcher of several runs receives every delta of the run it watches (their texts
add up to the committed answer), without a thread per watcher in the server; a logout
ends every stream its session opened within the re-check's bound (one check for all of
the user's streams), and leaves another user's alone."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time

import pytest
from django.test import Client

from django_agentrun import start_run
from django_agentrun.models import RunEvent
from django_agentrun.testing.messages_api import Reply, by_step, text, tool_use
from tests import factories
from tests.processes import ASGIServer, wait_resting

WATCHERS = 120
DELTA = re.compile(r"event: delta\ndata: ([^\n]*)")


def slow(*blocks) -> Reply:
    return Reply(list(blocks), chunk_size=16, delay=0.01)


def session_of(user) -> str:
    browser = Client()
    browser.force_login(user)
    return browser.cookies["sessionid"].value


class Watcher:
    """An SSE client on a raw socket: the body as it comes, until the stream ends."""

    def __init__(self, port: int, path: str, session: str) -> None:
        self.port, self.path, self.session = port, path, session
        self.status = 0
        self.body = ""
        self.ended_at: float | None = None

    async def run(self, stop: asyncio.Event) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(
            f"GET {self.path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
            f"Cookie: sessionid={self.session}\r\n\r\n".encode()
        )
        head = await reader.readuntil(b"\r\n\r\n")
        self.status = int(head.split()[1])
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while True:
                reading = asyncio.ensure_future(reader.read(65536))
                await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not reading.done():
                    reading.cancel()
                    return
                chunk = reading.result()
                if not chunk:
                    self.ended_at = time.monotonic()  # the server ended the stream
                    return
                self.body += chunk.decode()
                if "\r\n0\r\n\r\n" in self.body:  # the chunked body's end
                    self.ended_at = time.monotonic()
                    return
        finally:
            stopping.cancel()
            writer.close()

    def deltas(self) -> list[dict]:
        return [json.loads(found) for found in DELTA.findall(self.body)]


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_hub__every_watcher_of_several_runs_gets_every_delta(workers, messages_api, many_watchers):
    alice = factories.user("alice")
    session = session_of(alice)
    messages_api.script = by_step(
        [
            slow(text("Otters hold hands while they sleep. " * 4), tool_use("lookup", {"q": "o"})),
            slow(text("So that they do not drift apart. " * 4)),
        ]
    )
    runs = [start_run("test-agent", f"Otters {n}?", owner=alice) for n in range(3)]
    port, pid = many_watchers.port, many_watchers.proc.pid
    seen_threads: list[int] = []

    async def go() -> list[Watcher]:
        stop = asyncio.Event()
        watchers = [
            Watcher(port, f"/api/agentrun/runs/{runs[n % 3].pk}/stream/", session)
            for n in range(WATCHERS)
        ]
        tasks = [asyncio.ensure_future(w.run(stop)) for w in watchers]
        while not all(w.status for w in watchers):
            await asyncio.sleep(0.1)
        # Every watcher connected: the worker starts, the runs' turns are watched whole.
        await asyncio.to_thread(workers.start, **many_watchers.extra)
        deadline = time.monotonic() + 120
        while not all(t.done() for t in tasks) and time.monotonic() < deadline:
            seen_threads.append(threads(pid))
            await asyncio.sleep(0.2)
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        return watchers

    watchers = asyncio.run(go())
    for run in runs:
        wait_resting(run)
    committed = {}
    for run in runs:
        answers = RunEvent.objects.filter(run=run, type="model_response").order_by("seq")
        committed[str(run.pk)] = [
            "".join(b["text"] for b in e.payload["content"] if b["type"] == "text") for e in answers
        ]
    for n, watcher in enumerate(watchers):
        assert watcher.status == 200 and watcher.ended_at is not None, n
        texts: dict[int, str] = {}
        for delta in watcher.deltas():
            if delta.get("kind") == "text":
                texts[delta["turn"]] = texts.get(delta["turn"], "") + delta["text"]
        run_id = str(runs[n % 3].pk)
        # The deltas of each turn this watcher saw add up to the committed answer (a
        # watcher may join after a turn ended: its record is the committed event).
        for turn, streamed in texts.items():
            assert streamed == committed[run_id][turn], (n, turn)
        assert sorted(texts) == [0, 1], n  # it watched every turn as it was written
        assert '"run_state":"completed"' in watcher.body, n
    # No thread per watcher: the server's threads stay few while 120 watch.
    assert max(seen_threads) < 60, seen_threads


def serve(workers, stream_redis, settings, tmp_path, **more: str) -> ASGIServer:
    """uvicorn on the live streams' Redis (no worker yet: `served.extra` for one)."""
    extra = {
        "AGENTRUN_STREAM_URL": stream_redis,
        "AGENTRUN_STREAM_PREFIX": settings.AGENTRUN_STREAM_PREFIX,
        "AGENTRUN_STREAM_KEEPALIVE_SECONDS": "0.5",
        **more,
    }
    served = ASGIServer(workers, tmp_path / "uvicorn.log", **extra)
    served.extra = extra
    return served


@pytest.fixture
def many_watchers(workers, stream_redis, settings, tmp_path):
    served = serve(workers, stream_redis, settings, tmp_path, AGENTRUN_STREAM_MAX_PER_USER="none")
    yield served
    served.stop()
    print(served.log.read_text()[-3000:])


@pytest.fixture
def quick_checks(workers, stream_redis, settings, tmp_path):
    served = serve(workers, stream_redis, settings, tmp_path, AGENTRUN_STREAM_RECHECK_SECONDS="0.5")
    yield served
    served.stop()
    print(served.log.read_text()[-3000:])


def log_out(session_key: str) -> None:
    """The session's end, as a logout makes it (from a thread: its connection closed)."""
    from django.contrib.sessions.models import Session
    from django.db import connection

    try:
        Session.objects.filter(session_key=session_key).delete()
    finally:
        connection.close()


def test_hub__a_logout_ends_every_stream_of_its_session_within_the_bound(quick_checks):
    alice, bob = factories.user("alice"), factories.user("bob")
    alices, bobs = session_of(alice), session_of(bob)
    mine = [start_run("test-agent", f"nobody works on me {n}", owner=alice) for n in range(3)]
    theirs = start_run("test-agent", "nor on me", owner=bob)
    port = quick_checks.port

    async def go():
        stop = asyncio.Event()
        watchers = [
            Watcher(port, f"/api/agentrun/runs/{mine[n % 3].pk}/stream/", alices) for n in range(10)
        ]
        other = Watcher(port, f"/api/agentrun/runs/{theirs.pk}/stream/", bobs)
        tasks = [asyncio.ensure_future(w.run(stop)) for w in (*watchers, other)]
        await asyncio.sleep(1.5)  # open, checked at least once
        assert all(w.ended_at is None and w.status == 200 for w in (*watchers, other))
        await asyncio.to_thread(log_out, alices)
        logged_out = time.monotonic()
        await asyncio.wait(tasks[:-1], timeout=5)
        still = other.ended_at is None
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        return [w.ended_at - logged_out for w in watchers if w.ended_at], still

    ended_after, other_open = asyncio.run(go())
    assert len(ended_after) == 10
    assert max(ended_after) < 0.5 + 1.0  # within the re-check's bound (and a margin)
    assert other_open


def test_hub__redis_restarted_under_the_served_streams(workers, messages_api, own_redis, tmp_path):
    """The streams' Redis killed while the first turn streams, started again (empty) at
    once: every watcher receives every durable event once, in order, and the run's end;
    the last turn, written after Redis came back, streams to them whole."""
    from django.conf import settings

    alice = factories.user("alice")
    session = session_of(alice)

    def slower(*blocks) -> Reply:  # about 0.6 s a turn
        return Reply(list(blocks), chunk_size=4, delay=0.03)

    messages_api.script = by_step(
        [
            slower(text("Otters hold hands. " * 4), tool_use("lookup", {"q": "o"})),
            slower(text("While they sleep. " * 4), tool_use("lookup", {"q": "p"})),
            slower(text("So that they do not drift apart. " * 4)),
        ]
    )
    served = serve(
        workers,
        own_redis.url,
        settings,
        tmp_path,
        AGENTRUN_STREAM_POLL_SECONDS="0.2",
        AGENTRUN_STREAM_MAX_PER_USER="none",
    )
    run = start_run("test-agent", "Otters?", owner=alice)
    port = served.port

    async def go() -> list[Watcher]:
        stop = asyncio.Event()
        watchers = [
            Watcher(port, f"/api/agentrun/runs/{run.pk}/stream/", session) for _ in range(20)
        ]
        tasks = [asyncio.ensure_future(w.run(stop)) for w in watchers]
        while not all(w.status for w in watchers):
            await asyncio.sleep(0.1)
        await asyncio.to_thread(workers.start, **served.extra)
        while not any(w.deltas() for w in watchers):  # the first turn streams
            await asyncio.sleep(0.02)
        await asyncio.to_thread(own_redis.kill)  # Redis gone under the hub, mid-turn
        await asyncio.sleep(0.3)
        await asyncio.to_thread(own_redis.start)  # back, empty
        await asyncio.wait(tasks, timeout=90)
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        return watchers

    try:
        watchers = asyncio.run(go())
        wait_resting(run)
    finally:
        served.stop()
        print(served.log.read_text()[-3000:])
    stored = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", "type"))
    last_answer = RunEvent.objects.filter(run=run, type="model_response").order_by("seq").last()
    final = "".join(b["text"] for b in last_answer.payload["content"] if b["type"] == "text")
    for n, watcher in enumerate(watchers):
        frames = re.findall(r"event: run_event\nid: (\d+)\ndata: (\{[^\n]*)", watcher.body)
        durable = [(int(seq), json.loads(data)["type"]) for seq, data in frames]
        assert durable == stored, n  # every event, once, in order
        assert '"run_state":"completed"' in watcher.body, n
        streamed = "".join(
            d["text"] for d in watcher.deltas() if d.get("kind") == "text" and d["turn"] == 2
        )
        assert streamed == final, n  # the last turn streamed whole, after Redis came back
