"""A run's live stream in process (the async view through Django's AsyncClient): who may
read it, the 204, resuming after a cursor, both formats, keep-alives, no connection held
between reads. Deltas through Redis and real processes: tests/workers/test_streams.py."""

from __future__ import annotations

import base64

import pytest
from django.db import connections
from django.urls import reverse

from django_agentrun import start_run
from django_agentrun.api import stream_reads
from django_agentrun.models import RunEvent
from django_agentrun.testing import ScriptedClient, reply, text, tool_use
from tests import factories
from tests.conftest import drive
from tests.streams import comments, frames, stream

# The stream reads on the event loop's thread pool: other connections than the test's.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.one_driver]


def url(run, **query: str) -> str:
    path = reverse("agentrun:run-stream", args=[run.pk])
    return path + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


def durable(body: str) -> list[tuple[int, str]]:
    return [(int(f.id), f.json["type"]) for f in frames(body) if f.event == "run_event"]


@pytest.fixture
def alice():
    return factories.user("alice")


def test_stream__a_finished_run_replays_then_ends(alice):
    run = factories.completed_run(alice)
    response, body = stream(url(run), user=alice)
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream; charset=utf-8"
    assert (response["Cache-Control"], response["X-Accel-Buffering"]) == ("no-cache", "no")
    events = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", "type"))
    assert durable(body) == events
    assert frames(body)[-1].event == "end"
    assert frames(body)[-1].json == {"run_state": "completed", "cursor": str(events[-1][0])}


def test_stream__resumes_after_the_cursor_and_answers_204_at_the_end(alice):
    run = factories.completed_run(alice)
    last = run.last_seq
    _, body = stream(url(run), user=alice, **{"Last-Event-ID": "2"})
    assert [seq for seq, _ in durable(body)] == list(range(3, last + 1))
    _, body = stream(url(run, after="3"), user=alice)
    assert [seq for seq, _ in durable(body)] == list(range(4, last + 1))
    # The header wins over the query (EventSource keeps the URL and sends the header).
    _, body = stream(url(run, after="1"), user=alice, **{"Last-Event-ID": str(last - 1)})
    assert [seq for seq, _ in durable(body)] == [last]
    response, body = stream(url(run), user=alice, **{"Last-Event-ID": str(last)})
    assert (response.status_code, body) == (204, "")


def test_stream__a_parked_run_ends_its_stream_and_then_answers_204(alice):
    run, _, _ = factories.parked(alice)
    response, body = stream(url(run), user=alice)
    assert response.status_code == 200
    assert frames(body)[-1].json["run_state"] == "awaiting_approval"
    approval = [f.json for f in frames(body) if f.event == "run_event"][-2:]
    assert [e["type"] for e in approval] == ["approval_requested", "run_parked"]
    assert "token" not in str(approval)
    response, _ = stream(url(run), user=alice, **{"Last-Event-ID": str(run.last_seq)})
    assert response.status_code == 204


def test_stream__events_show_what_the_api_shows(alice):
    run = factories.completed_run(alice)
    _, body = stream(url(run), user=alice)
    created = next(f.json for f in frames(body) if f.event == "run_event")
    assert created["type"] == "run_created"
    assert set(created) == {"seq", "type", "payload", "created_at"}
    stored = RunEvent.objects.get(run=run, seq=2).payload
    shown = [f.json for f in frames(body) if f.event == "run_event"][1]["payload"]
    assert "worker" in stored and "worker" not in shown


@pytest.mark.parametrize(
    ("who", "status"),
    [("owner", 200), ("viewer", 200), ("stranger", 404), ("anonymous", 403)],
)
def test_stream__who_may_read_it(who, status, alice):
    run = factories.completed_run(alice)
    user = {
        "owner": alice,
        "viewer": factories.user("vera", "view_all_runs"),
        "stranger": factories.user("sam"),
        "anonymous": None,
    }[who]
    response, body = stream(url(run), user=user)
    assert response.status_code == status, body
    if status != 200:
        assert response["Content-Type"] == "application/json"
        assert body.startswith('{"code": "') and ('"not_found"' in body or "not_auth" in body)


def test_stream__basic_authentication_and_a_bad_password(alice, settings):
    run = factories.completed_run(alice)
    good = base64.b64encode(b"alice:pw").decode()
    bad = base64.b64encode(b"alice:nope").decode()
    response, _ = stream(url(run), Authorization=f"Basic {good}")
    assert response.status_code == 200
    response, body = stream(url(run), Authorization=f"Basic {bad}")
    # Session authentication comes first and sends no challenge: 403, as DRF answers.
    assert (response.status_code, '"authentication_failed"' in body) == (403, True)
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.BasicAuthentication"],
    }
    response, body = stream(url(run))
    assert response.status_code == 401 and response["WWW-Authenticate"].startswith("Basic")


@pytest.mark.parametrize(
    ("path", "headers", "status", "code"),
    [
        ("/api/agentrun/runs/not-a-uuid/stream/", {}, 404, "not_found"),
        (None, {"Last-Event-ID": "x"}, 400, "invalid"),
        (None, {"Last-Event-ID": "-1"}, 400, "invalid"),
        (None, {"Last-Event-ID": "99999999999"}, 400, "invalid"),
        ("?format=xml", {}, 406, "not_acceptable"),
        ("", {"Accept": "application/json"}, 406, "not_acceptable"),
    ],
)
def test_stream__bad_requests_are_4xx(path, headers, status, code, alice):
    run = factories.completed_run(alice)
    target = path if path and path.startswith("/") else url(run) + (path or "")
    response, body = stream(target, user=alice, **headers)
    assert response.status_code == status, body
    assert f'"code": "{code}"' in body


def test_stream__the_format_by_accept_or_query(alice):
    run = factories.completed_run(alice)
    media = "application/x-vercel-ai-ui-message-stream"
    for response, body in (
        stream(url(run), user=alice, Accept=media),
        stream(url(run, format="ai-sdk"), user=alice),
    ):
        assert response["x-vercel-ai-ui-message-stream"] == "v1"
        assert body.endswith("data: [DONE]\n\n")
    response, body = stream(url(run), user=alice, Accept="text/event-stream")
    assert "x-vercel-ai-ui-message-stream" not in response and "[DONE]" not in body


def test_stream__ai_sdk_chunks_of_a_run_with_a_tool(alice):
    model = ScriptedClient(
        [
            reply(text("Looking."), tool_use("lookup", {"query": "42"}, id="toolu_1")),
            reply(text("Found.")),
        ]
    )
    run = start_run("test-agent", "find 42", owner=alice)
    drive(run, model)
    _, body = stream(url(run, format="ai-sdk"), user=alice)
    chunks = [f.json for f in frames(body) if f.data != "[DONE]"]
    kinds = [c["type"] for c in chunks if c["type"] != "data-agentrun-event"]
    assert kinds == [
        "start",
        "start-step",
        "text-start",
        "text-delta",
        "text-end",
        "tool-input-available",
        "tool-output-available",
        "finish-step",
        "start-step",
        "text-start",
        "text-delta",
        "text-end",
        "finish-step",
        "finish",
    ]
    assert chunks[0] == {"type": "start", "messageId": str(run.pk)}
    texts = [c["delta"] for c in chunks if c["type"] == "text-delta"]
    assert texts == ["Looking.", "Found."]
    tool = next(c for c in chunks if c["type"] == "tool-input-available")
    assert tool == {
        "type": "tool-input-available",
        "toolCallId": "toolu_1",
        "toolName": "lookup",
        "input": {"query": "42"},
    }
    data = [f for f in frames(body) if f.data.startswith('{"type":"data-agentrun-event"')]
    assert [int(f.id) for f in data] == list(range(1, run.last_seq + 1))
    assert all(f.json["transient"] for f in data)
    assert chunks[-1] == {"type": "finish", "finishReason": "stop"}


def test_stream__server_tools_are_provider_executed_tool_parts(alice):
    """A tool the API ran itself: its input and its output come with the answer, marked
    providerExecuted (the AI SDK shows them, and sends nothing back for them)."""
    search = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search"}
    found = [{"type": "web_search_result", "url": "https://o.example", "title": "Otters"}]
    model = ScriptedClient(
        [
            reply(
                {**search, "input": {"query": "otters"}},
                {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": found},
                text("Otters hold hands."),
            )
        ]
    )
    run = start_run("researcher", "otters?", owner=alice)
    drive(run, model)
    _, body = stream(url(run, format="ai-sdk"), user=alice)
    chunks = [f.json for f in frames(body) if f.data != "[DONE]"]
    tools = [c for c in chunks if c["type"].startswith("tool-")]
    assert tools == [
        {
            "type": "tool-input-available",
            "toolCallId": "srvtoolu_1",
            "toolName": "web_search",
            "input": {"query": "otters"},
            "providerExecuted": True,
        },
        {
            "type": "tool-output-available",
            "toolCallId": "srvtoolu_1",
            "output": found,
            "providerExecuted": True,
        },
    ]
    assert [c["delta"] for c in chunks if c["type"] == "text-delta"] == ["Otters hold hands."]


def test_stream__ai_sdk_approval_request_carries_the_calls_api_id(alice):
    run, call, _ = factories.parked(alice)
    _, body = stream(url(run, format="ai-sdk"), user=alice)
    chunks = [f.json for f in frames(body) if f.data != "[DONE]"]
    asked = [c for c in chunks if c["type"] == "tool-approval-request"]
    assert asked == [
        {
            "type": "tool-approval-request",
            "approvalId": str(call.pk),
            "toolCallId": call.tool_call_id,
        }
    ]
    assert chunks[-1] == {"type": "finish", "finishReason": "tool-calls"}


def test_stream__keeps_an_idle_stream_alive(alice, settings):
    settings.AGENTRUN_STREAM_KEEPALIVE_SECONDS = 0.2
    run = start_run("test-agent", "nobody works on me", owner=alice)  # queued: active
    response, body = stream(url(run), user=alice, chunks=4)
    assert response.status_code == 200
    assert durable(body) == [(1, "run_created")]
    assert comments(body)[:2] == [": keep-alive", ": keep-alive"]


def test_stream__holds_no_connection_between_reads(postgres, alice, settings, monkeypatch):
    """Every read closes the connection it opened (on the pool thread that ran it). On
    Postgres: SQLite keeps an in-memory test database's connection open on purpose."""
    settings.AGENTRUN_STREAM_KEEPALIVE_SECONDS = 0.05
    settings.AGENTRUN_STREAM_POLL_SECONDS = 0.05
    run = start_run("test-agent", "nobody works on me", owner=alice)
    reads, left_open = [], []
    original = stream_reads.close_connections

    def closing_and_checking():
        original()
        reads.append(1)
        left_open.extend(c.alias for c in connections.all() if c.connection is not None)

    monkeypatch.setattr(stream_reads, "close_connections", closing_and_checking)
    _, body = stream(url(run), user=alice, chunks=6)
    assert len(comments(body)) >= 2
    assert len(reads) >= 3  # the authentication, the first read, polls
    assert left_open == []


def test_deltas__each_model_attempt_starts_the_turns_deltas_over(stream_redis, settings, alice):
    """The engine hands the client a sink per (run, turn, attempt); a retried attempt's
    deltas start over after a marker of its own; each commit sends a nudge."""
    import json

    import redis

    from django_agentrun import streams
    from django_agentrun.testing import error

    settings.AGENTRUN_MODEL_RETRY_BASE_SECONDS = 0.01
    model = ScriptedClient(
        [error("api error", status=500), reply(text("Hello from the second attempt."))]
    )
    run = start_run("test-agent", "hi", owner=alice)
    drive(run, model)
    assert run.state == "completed"
    assert streams.publisher().flush()

    stored = redis.Redis.from_url(stream_redis).xrange(streams.run_key(run.pk))
    items = [json.loads(fields[b"d"]) for _, fields in stored]
    markers = [(i["turn"], i["attempt"]) for i in items if i["kind"] == "attempt"]
    assert markers == [(0, 0), (0, 1)]
    texts = "".join(i["text"] for i in items if i["kind"] == "text" and i["attempt"] == 1)
    assert texts == "Hello from the second attempt."
    nudges = [i["seq"] for i in items if i["kind"] == "commit"]
    assert nudges == sorted(nudges) and nudges[-1] == run.last_seq


def test_stream__the_api_schema_describes_it(alice, client):
    client.force_login(alice)
    schema = client.get(reverse("agentrun:schema"), {"format": "json"}).json()
    operation = schema["paths"]["/api/agentrun/runs/{id}/stream/"]["get"]
    assert "text/event-stream" in operation["responses"]["200"]["content"]
    assert set(operation["responses"]) == {"200", "204", "400", "401", "403", "404", "406", "429"}
    ref = operation["responses"]["404"]["content"]["application/json"]["schema"]["$ref"]
    assert ref.rsplit("/", 1)[1] in schema["components"]["schemas"]


def test_stream__thinking_apart_from_the_answer_and_redacted_data_never_shown(alice):
    thought = {"type": "thinking", "thinking": "They want 42.", "signature": "SIG-SECRET"}
    hidden = {"type": "redacted_thinking", "data": "ENCRYPTED-SECRET"}
    run = start_run("test-agent", "find 42", owner=alice)
    drive(run, ScriptedClient([reply(thought, hidden, text("Found."))]))
    _, body = stream(url(run, format="ai-sdk"), user=alice)
    chunks = [f.json for f in frames(body) if f.data != "[DONE]"]
    reasoning = [c["delta"] for c in chunks if c["type"] == "reasoning-delta"]
    answer = [c["delta"] for c in chunks if c["type"] == "text-delta"]
    assert (reasoning, answer) == (["They want 42."], ["Found."])
    _, plain = stream(url(run), user=alice)
    for shown in (body, plain):
        assert "ENCRYPTED-SECRET" not in shown and "SIG-SECRET" not in shown
