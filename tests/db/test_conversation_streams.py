"""A conversation's live stream in process (the async view through Django's AsyncClient):
its runs' events in (position, seq) order with `<position>-<seq>` ids, resuming after a
cursor, the 204, both formats, who may read it, bad cursors, a follow-up held back until
the run before it ends. Deltas and reconnects with real workers:
tests/workers/test_conversation_streams.py."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse

from django_agentrun import approve_tool_call, send_message, start_conversation
from django_agentrun.models import RunEvent
from django_agentrun.testing import ScriptedClient, reply, text, tool_use
from tests import factories
from tests.conftest import drive
from tests.streams import comments, frames, stream

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.one_driver]


def url(conversation, **query: str) -> str:
    path = reverse("agentrun:conversation-stream", args=[conversation.pk])
    return path + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


def durable(body: str) -> list[tuple[str, str]]:
    return [(f.id, f.json["type"]) for f in frames(body) if f.event == "run_event"]


def stored(*runs) -> list[tuple[str, str]]:
    """Every event of `runs` (in conversation order) as (cursor, type)."""
    return [
        (f"{run.conversation_position}-{seq}", kind)
        for run in runs
        for seq, kind in RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", "type")
    ]


@pytest.fixture
def alice():
    return factories.user("alice")


@pytest.fixture
def two_runs(alice):
    """A conversation of two completed runs: the first with an approved call, then a
    follow-up."""
    conversation = start_conversation("test-agent", owner=alice)
    first = send_message(conversation, "delete bob", by=alice)
    model = ScriptedClient(
        [
            reply(text("Deleting."), tool_use("delete_account", {"user": "bob"})),
            reply(text("Done.")),
            reply(text("Nothing else.")),
        ]
    )
    drive(first, model)
    assert first.state == "awaiting_approval"
    approve_tool_call(first.tool_calls.get(), by=factories.user("ann", "approve_toolcall"))
    drive(first, model)
    second = send_message(conversation, "anything else?", by=alice)
    drive(second, model)
    assert (first.state, second.state) == ("completed", "completed")
    return conversation, first, second


def test_conversation_stream__replays_every_run_in_order_then_ends(two_runs, alice):
    conversation, first, second = two_runs
    response, body = stream(url(conversation), user=alice)
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream; charset=utf-8"
    assert (response["Cache-Control"], response["X-Accel-Buffering"]) == ("no-cache", "no")
    assert durable(body) == stored(first, second)
    shown = [f.json for f in frames(body) if f.event == "run_event"]
    assert {(e["run"], e["position"]) for e in shown} == {(str(first.pk), 0), (str(second.pk), 1)}
    end = frames(body)[-1]
    assert (end.event, end.json) == (
        "end",
        {"run_state": "completed", "cursor": f"1-{second.last_seq}"},
    )


def test_conversation_stream__resumes_after_the_cursor_and_answers_204_at_the_end(two_runs, alice):
    conversation, first, second = two_runs
    everything = stored(first, second)
    for i in (0, 3, first.last_seq - 1, first.last_seq, len(everything) - 2):
        cursor = everything[i][0]
        _, body = stream(url(conversation), user=alice, **{"Last-Event-ID": cursor})
        assert durable(body) == everything[i + 1 :], cursor
        _, body = stream(url(conversation, after=cursor), user=alice)
        assert durable(body) == everything[i + 1 :], cursor
    # The header wins over the query (EventSource keeps the URL and sends the header).
    _, body = stream(url(conversation, after="0-1"), user=alice, **{"Last-Event-ID": "1-1"})
    assert durable(body) == everything[first.last_seq + 1 :]
    last = everything[-1][0]
    response, body = stream(url(conversation), user=alice, **{"Last-Event-ID": last})
    assert (response.status_code, body) == (204, "")
    response, _ = stream(url(conversation), user=alice, **{"Last-Event-ID": "7-1"})
    assert response.status_code == 204


def test_conversation_stream__a_conversation_without_runs_answers_204(alice):
    conversation = start_conversation("test-agent", owner=alice)
    response, body = stream(url(conversation), user=alice)
    assert (response.status_code, body) == (204, "")


def test_conversation_stream__ai_sdk_one_message_per_run(two_runs, alice):
    conversation, first, second = two_runs
    media = "application/x-vercel-ai-ui-message-stream"
    response, body = stream(url(conversation), user=alice, Accept=media)
    assert response["x-vercel-ai-ui-message-stream"] == "v1"
    _, by_query = stream(url(conversation, format="ai-sdk"), user=alice)
    # The same, but for the connection's token in part ids (unique across reconnects).
    token = re.compile(r'("id":"\d+-[^"]*)-[0-9a-f]{8}"')
    assert token.sub(r'\1"', body) == token.sub(r'\1"', by_query) and body != by_query
    assert body.endswith("data: [DONE]\n\n") and body.count("[DONE]") == 1
    chunks = [f.json for f in frames(body) if f.data != "[DONE]"]
    starts = [c for c in chunks if c["type"] in ("start", "finish")]
    assert starts == [
        {"type": "start", "messageId": str(first.pk)},
        {"type": "finish", "finishReason": "stop"},
        {"type": "start", "messageId": str(second.pk)},
        {"type": "finish", "finishReason": "stop"},
    ]
    said = [c["delta"] for c in chunks if c["type"] == "text-delta"]
    assert said == ["Deleting.", "Done.", "Nothing else."]
    kinds = [c["type"] for c in chunks]
    assert kinds.index("tool-approval-request") < kinds.index("tool-output-available")
    ids = [f.id for f in frames(body) if f.id is not None]
    assert ids == [cursor for cursor, _ in stored(first, second)]


def test_conversation_stream__a_follow_up_waits_for_the_run_before_it(alice, settings):
    """An enqueued message's run is queued behind a parked run: its events (and deltas)
    wait until the parked run ends, so no cursor ever passes an event still to come."""
    settings.AGENTRUN_STREAM_KEEPALIVE_SECONDS = 0.1
    settings.AGENTRUN_STREAM_POLL_SECONDS = 0.05
    conversation = start_conversation("test-agent", owner=alice)
    first = send_message(conversation, "delete bob", by=alice)
    model = ScriptedClient(
        [reply(tool_use("delete_account", {"user": "bob"})), reply(text("Done."))]
    )
    drive(first, model)
    second = send_message(conversation, "and then?", policy="enqueue", by=alice)
    assert (first.state, second.state) == ("awaiting_approval", "queued")
    response, body = stream(url(conversation), user=alice, chunks=len(stored(first)) + 3)
    assert response.status_code == 200
    assert durable(body) == stored(first)  # the queued run's run_created waits
    assert comments(body)  # still open: a run is queued
    assert not [f for f in frames(body) if f.event == "end"]


def test_conversation_stream__ends_when_every_run_rests(alice):
    conversation = start_conversation("test-agent", owner=alice)
    first = send_message(conversation, "delete bob", by=alice)
    drive(first, ScriptedClient([reply(tool_use("delete_account", {"user": "bob"}))]))
    response, body = stream(url(conversation), user=alice)
    assert frames(body)[-1].json["run_state"] == "awaiting_approval"
    response, _ = stream(url(conversation), user=alice, **{"Last-Event-ID": f"0-{first.last_seq}"})
    assert response.status_code == 204


@pytest.mark.parametrize(
    ("who", "status"),
    [
        ("owner", 200),
        ("stranger", 404),
        ("staff", 404),
        ("staff_viewer", 200),
        ("viewer", 200),
        ("superuser", 200),
        ("anonymous", 403),
    ],
)
def test_conversation_stream__who_may_read_it(who, status, alice):
    conversation = start_conversation("test-agent", owner=alice)
    run = send_message(conversation, "hi", by=alice)
    drive(run, ScriptedClient([reply(text("Hello."))]))
    user = {
        "owner": alice,
        "stranger": factories.user("sam"),
        "staff": factories.user("stan", is_staff=True),
        "staff_viewer": factories.user("stella", "view_all_runs", is_staff=True),
        "viewer": factories.user("vera", "view_all_runs"),
        "superuser": factories.user("root", is_staff=True, is_superuser=True),
        "anonymous": None,
    }[who]
    response, body = stream(url(conversation), user=user)
    assert response.status_code == status, body
    # The API's own answer for the same user agrees.
    api = reverse("agentrun:conversation-detail", args=[conversation.pk])
    detail, api_body = stream(api, user=user)
    assert detail.status_code == status, api_body
    if status != 200:
        assert response["Content-Type"] == "application/json"
        assert json.loads(body)["code"] == json.loads(api_body)["code"]


@pytest.mark.parametrize(
    ("cursor", "status", "code"),
    [
        ("x", 400, "invalid"),
        ("3", 400, "invalid"),
        ("1-x", 400, "invalid"),
        ("-1-2", 400, "invalid"),
        ("1-99999999999", 400, "invalid"),
        ("1-2-3", 400, "invalid"),
    ],
)
def test_conversation_stream__a_bad_cursor_is_a_400(cursor, status, code, alice):
    conversation = start_conversation("test-agent", owner=alice)
    for headers, query in (({"Last-Event-ID": cursor}, {}), ({}, {"after": cursor})):
        response, body = stream(url(conversation, **query), user=alice, **headers)
        assert response.status_code == status, body
        assert json.loads(body)["code"] == code
        assert "after" in json.loads(body)["errors"]


def test_conversation_stream__not_a_conversation_is_a_404(alice):
    response, body = stream("/api/agentrun/conversations/nope/stream/", user=alice)
    assert (response.status_code, json.loads(body)["code"]) == (404, "not_found")
    response, body = stream(
        "/api/agentrun/conversations/6c9b1f4e-3f0a-4a4e-9b2e-000000000000/stream/", user=alice
    )
    assert (response.status_code, json.loads(body)["code"]) == (404, "not_found")


def test_conversation_stream__the_api_schema_describes_it(alice, client):
    client.force_login(alice)
    schema = client.get(reverse("agentrun:schema"), {"format": "json"}).json()
    operation = schema["paths"]["/api/agentrun/conversations/{id}/stream/"]["get"]
    assert "text/event-stream" in operation["responses"]["200"]["content"]
    assert operation["operationId"] == "conversations_stream_retrieve"
    assert "<position>-<seq>" in operation["responses"]["400"]["description"]


def test_deltas__a_follow_up_tags_its_position_on_the_conversations_stream_only(
    stream_redis, alice
):
    """A run's own stream is position 0 to its readers (a follow-up's deltas reach its run
    stream); its conversation's stream tags each entry with the run's position and id."""
    import redis

    from django_agentrun import streams

    conversation = start_conversation("test-agent", owner=alice)
    model = ScriptedClient([reply(text("One.")), reply(text("Two."))])
    first = send_message(conversation, "one", by=alice)
    drive(first, model)
    second = send_message(conversation, "two", by=alice)
    drive(second, model)
    assert streams.publisher().flush()
    server = redis.Redis.from_url(stream_redis)

    def items(key):
        return [json.loads(fields[b"d"]) for _, fields in server.xrange(key)]

    own = items(streams.run_key(second.pk))
    assert own and all("position" not in i and "run" not in i for i in own)
    shared = items(streams.conversation_key(conversation.pk))
    assert {(i["position"], i["run"]) for i in shared} == {(0, str(first.pk)), (1, str(second.pk))}
    assert "".join(i["text"] for i in shared if i["kind"] == "text" and i["position"] == 1) == (
        "Two."
    )


def test_conversation_stream__a_follow_ups_first_deltas_wait_for_the_read_they_need(
    stream_redis, settings, alice
):
    """The nudge that says the run before has ended may be lost (publishing drops what it
    cannot send): the follow-up's first deltas then make the stream read the database
    (the frontier moves on) instead of being dropped until the next timed read."""
    import asyncio

    from asgiref.sync import async_to_sync, sync_to_async
    from django.test import AsyncClient

    from django_agentrun import cancel_run, streams

    settings.AGENTRUN_STREAM_KEEPALIVE_SECONDS = 0.1
    settings.AGENTRUN_STREAM_POLL_SECONDS = 30  # no timed read during the test
    conversation = start_conversation("test-agent", owner=alice)
    first = send_message(conversation, "one", by=alice)  # queued: nobody works on it
    second = send_message(conversation, "two", policy="enqueue", by=alice)

    def end_the_first_run_losing_its_nudge():
        prefix = settings.AGENTRUN_STREAM_PREFIX
        settings.AGENTRUN_STREAM_PREFIX = prefix + "-elsewhere"
        try:
            cancel_run(first, by=alice)
        finally:
            settings.AGENTRUN_STREAM_PREFIX = prefix
        sink = streams.turn_stream(second, 0).attempt(0)
        sink({"kind": "block_start", "index": 0, "block": "text"})
        sink({"kind": "text", "index": 0, "text": "Hello from the follow-up."})
        assert streams.publisher().flush()

    async def go():
        client = AsyncClient()
        await client.aforce_login(alice)
        response = await client.get(url(conversation))
        chunks = response.streaming_content.__aiter__()
        body = ""
        while "run_created" not in body:
            body += (await chunks.__anext__()).decode()
        await sync_to_async(end_the_first_run_losing_its_nudge)()
        try:
            async with asyncio.timeout(5):
                while "Hello from the follow-up." not in body:
                    body += (await chunks.__anext__()).decode()
        except TimeoutError:
            pass
        await chunks.aclose()
        return body

    body = async_to_sync(go)()
    texts = [
        f.json["text"] for f in frames(body) if f.event == "delta" and f.json["kind"] == "text"
    ]
    assert texts == ["Hello from the follow-up."]
    # The first run's last events came before the follow-up's deltas, its own after them.
    kinds = [(f.event, f.id) for f in frames(body)]
    first_end = kinds.index(("run_event", f"0-{last_seq_of(first)}"))
    assert first_end < kinds.index(("delta", None))
    assert ("run_event", "1-1") in kinds[: kinds.index(("delta", None))]


def last_seq_of(run) -> int:
    run.refresh_from_db()
    return run.last_seq
