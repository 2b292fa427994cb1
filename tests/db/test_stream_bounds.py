"""A live stream's bounds (issue #25): the user checked again while it is open, a bounded
lifetime, a per-user limit on open streams, a bounded buffer for a client that does not
read, line separators escaped in `data:` lines, and the stream served as it comes under
WSGI too. In process (Django's AsyncClient) unless the server matters (WSGI: pytest-django's
live server)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth.models import Permission
from django.contrib.sessions.models import Session
from django.test import AsyncClient, Client
from django.urls import reverse
from django.utils import timezone

from django_agentrun import start_run
from django_agentrun.api.sse import dumps, frame
from django_agentrun.testing import ScriptedClient, reply, text
from tests import factories
from tests.conftest import assert_api_error, drive
from tests.streams import LiveStream, frames, stream

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.one_driver]


def url(run, **query: str) -> str:
    path = reverse("agentrun:run-stream", args=[run.pk])
    return path + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


@pytest.fixture
def alice():
    return factories.user("alice")


@pytest.fixture
def quick(settings):
    settings.AGENTRUN_STREAM_KEEPALIVE_SECONDS = 0.1
    settings.AGENTRUN_STREAM_POLL_SECONDS = 0.1
    settings.AGENTRUN_STREAM_RECHECK_SECONDS = 0.2
    return settings


class Reader:
    """A stream read for a while at a time, never cancelled in between (a pending read
    carries over), as a client that keeps its connection."""

    def __init__(self, response) -> None:
        self.response = response
        self.iterator = response.streaming_content if response.streaming else None
        self.pending: asyncio.Future | None = None
        self.ended = False

    async def read_for(self, seconds: float) -> str:
        """What arrives within `seconds`, or until the stream ends (then `ended`)."""
        body = []
        deadline = time.monotonic() + seconds
        while not self.ended:
            if self.pending is None:
                self.pending = asyncio.ensure_future(self.iterator.__anext__())
            done, _ = await asyncio.wait({self.pending}, timeout=deadline - time.monotonic())
            if not done:
                break
            try:
                chunk = self.pending.result()
            except StopAsyncIteration:
                self.ended = True
                break
            finally:
                if done:
                    self.pending = None
            body.append(chunk.decode() if isinstance(chunk, bytes) else chunk)
        return "".join(body)

    async def close(self) -> None:
        """Go away (the stream's generator is cancelled where it waits, as on a disconnect)."""
        while not self.ended:  # until the stream waits inside (as it mostly does)
            if self.pending is None:
                self.pending = asyncio.ensure_future(self.iterator.__anext__())
            await asyncio.sleep(0.05)
            if not self.pending.done():
                break
            with contextlib.suppress(StopAsyncIteration):
                self.pending.result()
                self.pending = None
                continue
            self.ended, self.pending = True, None
        if self.pending is not None:
            self.pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await self.pending
        await self.iterator.aclose()


async def _open(path: str, user) -> Reader:
    client = AsyncClient()
    await client.aforce_login(user)
    return Reader(await client.get(path))


def test_stream__a_viewer_stripped_of_view_all_runs_stops_receiving(quick, alice):
    vera = factories.user("vera", "view_all_runs")
    run = start_run("test-agent", "nobody works on me", owner=alice)  # queued: active

    async def go():
        reader = await _open(url(run), vera)
        assert reader.response.status_code == 200
        first = await reader.read_for(0.6)
        assert not reader.ended and "run_created" in first  # open, keeping alive

        def revoke():
            vera.user_permissions.remove(Permission.objects.get(codename="view_all_runs"))

        await sync_to_async(revoke)()
        await reader.read_for(3)
        await reader.close()
        return reader.ended

    assert async_to_sync(go)() is True


def test_stream__a_deactivated_user_stops_receiving_their_own_run(quick, alice):
    run = start_run("test-agent", "nobody works on me", owner=alice)

    async def go():
        reader = await _open(url(run), alice)
        await reader.read_for(0.6)
        assert not reader.ended
        alice.is_active = False
        await sync_to_async(alice.save)()
        await reader.read_for(3)
        await reader.close()
        return reader.ended

    assert async_to_sync(go)() is True


def test_stream__ends_after_its_lifetime_for_the_client_to_reconnect(quick, alice):
    quick.AGENTRUN_STREAM_MAX_SECONDS = 0.6
    run = start_run("test-agent", "nobody works on me", owner=alice)
    started = time.monotonic()
    response, body = stream(url(run), user=alice)
    assert response.status_code == 200 and time.monotonic() - started < 5
    last = frames(body)[-1]
    assert (last.event, last.json) == ("reconnect", {"cursor": "1"})
    assert "end" not in [f.event for f in frames(body)]


def test_stream__a_user_holds_at_most_the_limit_of_open_streams(quick, alice):
    quick.AGENTRUN_STREAM_MAX_PER_USER = 2
    run = start_run("test-agent", "nobody works on me", owner=alice)
    other = factories.user("bob")
    theirs = start_run("test-agent", "nor on me", owner=other)

    async def go():
        held = [await _open(url(run), alice) for _ in range(2)]
        for reader in held:
            assert reader.response.status_code == 200
            await reader.read_for(0.3)
            assert not reader.ended
        refused = (await _open(url(run), alice)).response
        assert refused.status_code == 429
        assert b'"code": "throttled"' in refused.content and refused["Retry-After"]
        # Somebody else's streams are theirs to count.
        theirs_reader = await _open(url(theirs), other)
        assert theirs_reader.response.status_code == 200
        await theirs_reader.read_for(0.1)
        await theirs_reader.close()
        # A stream that ends gives its place back.
        await held[0].close()
        again = await _open(url(run), alice)
        assert again.response.status_code == 200
        await again.read_for(0.1)
        await again.close()
        await held[1].close()

    async_to_sync(go)()


def test_stream__the_limit_counts_across_processes_in_redis(quick, stream_redis, alice):
    """With Redis, places are kept there (a second web process sees them): one taken by
    another process counts, and lapses if that process dies without giving it back."""
    import redis

    from django_agentrun.streams import limits

    quick.AGENTRUN_STREAM_MAX_PER_USER = 1
    run = start_run("test-agent", "nobody works on me", owner=alice)
    server = redis.Redis.from_url(stream_redis)
    server.zadd(limits.user_key(alice.pk), {"another-process": time.time() + 60})
    response, _ = stream(url(run), user=alice)
    assert response.status_code == 429
    server.zadd(limits.user_key(alice.pk), {"another-process": time.time() - 1})  # lapsed
    response, body = stream(url(run), user=alice, chunks=2)
    assert response.status_code == 200, body
    # Its own place was given back when it ended.
    assert [m.decode() for m in server.zrange(limits.user_key(alice.pk), 0, -1)] == []


def test_stream__a_client_that_does_not_read_holds_a_bounded_buffer(stream_redis, settings):
    """The hub keeps at most AGENTRUN_STREAM_BUFFER_ENTRIES entries for a client; past that
    it lets the client go (its stream ends; it reconnects with its cursor)."""
    import json

    import redis

    from django_agentrun.streams.reader import RunDeltas, SlowReader, client

    settings.AGENTRUN_STREAM_BUFFER_ENTRIES = 100
    key = f"{settings.AGENTRUN_STREAM_PREFIX}:run:slow"
    server = redis.Redis.from_url(stream_redis)

    async def go():
        deltas = RunDeltas(client(), key)
        await deltas.catch_up()
        for i in range(1000):
            server.xadd(key, {"d": json.dumps({"kind": "text", "turn": 0, "text": "x" * 50})})
            if i % 100 == 0:
                await asyncio.sleep(0.05)  # the hub reads meanwhile
        await asyncio.sleep(0.6)
        held = deltas.queue.held
        try:
            await deltas.next(1)
        except SlowReader:
            return held, True
        finally:
            deltas.close()
        return held, False

    held, dropped = async_to_sync(go)()
    assert held <= 100 and dropped


def test_sse__line_separators_are_escaped_in_data_lines():
    forged = "a\u2028event: run_event\u2029id: 999\x85data: {}\r\n"
    line = frame({"text": forged}, event="delta")
    for separator in ("\u2028", "\u2029", "\x85", "\r"):
        assert separator not in line
    assert line.splitlines() == ["event: delta", line.splitlines()[1], ""]
    import json

    assert json.loads(dumps({"text": forged}))["text"] == forged


def test_stream__a_tools_text_with_line_separators_forges_no_lines(alice):
    forged = "Done.\u2028id: 999\u2029event: end\x85data: {}"
    run = start_run("test-agent", "hi", owner=alice)
    drive(run, ScriptedClient([reply(text(forged))]))
    for fmt in ("events", "ai-sdk"):
        _, body = stream(url(run, format=fmt), user=alice)
        lines = body.splitlines()  # Python splits on all three, as some readers do
        assert not [line for line in lines if line.startswith(("id: 999", "data: {}"))]
        assert "\\u2028id: 999\\u2029event: end\\u0085data" in body


def test_stream__streams_as_it_comes_under_wsgi(live_server, quick, alice):
    """Under a WSGI server (pytest-django's live server) the first frames arrive at once,
    not when the run rests; the stream ends after AGENTRUN_STREAM_WSGI_MAX_SECONDS."""
    quick.AGENTRUN_STREAM_WSGI_MAX_SECONDS = 2
    run = start_run("test-agent", "nobody works on me", owner=alice)
    started = time.monotonic()
    live = LiveStream(live_server.url, url(run), auth=("alice", "pw"))
    assert live.status == 200
    seen = []
    for got in live.frames():
        seen.append((round(time.monotonic() - started, 1), got.event))
        if got.event == "run_event":
            break
    assert seen[-1][1] == "run_event" and seen[-1][0] < 1.5, seen
    rest = [f.event for f in live.frames()]
    live.close()
    assert "comment" in rest and rest[-1] == "reconnect"
    assert time.monotonic() - started < 6


# --------------------------------------------------------------------------- sessions, HEAD, POST
# A stream ends with the session that opened it (logout, a password changed elsewhere, the
# session's expiry), within its periodic re-check; HEAD and POST answer at once (issue 37).


def password_changed(client, user):
    user.set_password("changed elsewhere")  # another session of theirs (no session rehash)
    user.save()


def logged_out(client, user):
    async_to_sync(client.alogout)()


def expired(client, user):
    Session.objects.update(expire_date=timezone.now() - timedelta(seconds=1))


def still_signed_in(client, user):
    pass


@pytest.mark.parametrize(
    ("change", "ends"),
    [(still_signed_in, False), (logged_out, True), (password_changed, True), (expired, True)],
)
def test_stream__ends_with_the_session_that_opened_it(quick, alice, change, ends):
    run = start_run("test-agent", "nobody works on me", owner=alice)  # queued: it stays open

    async def go():
        client = AsyncClient()
        await client.alogin(username="alice", password="pw")
        reader = Reader(await client.get(url(run)))
        assert reader.response.status_code == 200
        first = await reader.read_for(0.6)
        assert not reader.ended and "run_created" in first
        await sync_to_async(change)(client, alice)
        await reader.read_for(1.2)
        ended = reader.ended
        await reader.close()
        return ended

    assert async_to_sync(go)() is ends


def test_head__answers_at_once_and_holds_no_place(quick, alice):
    quick.AGENTRUN_STREAM_MAX_PER_USER = 1
    run = start_run("test-agent", "nobody works on me", owner=alice)
    client = Client()
    client.force_login(alice)
    for _ in range(3):
        response = client.head(url(run))
        assert response.status_code == 200
        assert response["Content-Type"] == "text/event-stream; charset=utf-8"
        assert not response.streaming and response.content == b""

    async def go():
        other = AsyncClient()
        await other.aforce_login(alice)
        reader = Reader(await other.get(url(run)))  # the one place is free
        status = reader.response.status_code
        await reader.close()
        return status

    assert async_to_sync(go)() == 200


def test_post__a_json_405_even_with_a_session_and_no_csrf_token(alice):
    run = start_run("test-agent", "nobody works on me", owner=alice)
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    for method in (client.post, client.put, client.delete):
        response = method(url(run))
        assert_api_error(response, 405, "method_not_allowed")
        assert response["Allow"] == "GET, HEAD"
