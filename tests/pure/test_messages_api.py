"""Tests of the fake Messages API itself, over plain HTTP (http.client / sockets)."""

from __future__ import annotations

import copy
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from django_agentrun.testing.messages_api import (
    APIRequestError,
    MessagesAPIServer,
    Reply,
    ScriptExhausted,
    by_step,
    error,
    script_from_steps,
    step_of,
    text,
    tool_use,
    validate_request,
)

pytestmark = pytest.mark.timeout(10)

HEADERS = {
    "x-api-key": "sk-test",
    "anthropic-version": "2023-06-01",
    "content-type": "application/json",
}
TOOLS = [{"name": "search", "description": "Search.", "input_schema": {"type": "object"}}]


@pytest.fixture
def api() -> Iterator[MessagesAPIServer]:
    with MessagesAPIServer(lambda body: Reply("Hello there.")) as server:
        yield server


def body(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "model": "claude-haiku-4-5",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    data.update(overrides)
    return data


def post(
    api: MessagesAPIServer,
    data: Any,
    headers: dict[str, str] | None = None,
    path: str = "/v1/messages",
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=5)
    response = None
    try:
        raw = data if isinstance(data, bytes) else json.dumps(data).encode()
        conn.request("POST", path, body=raw, headers=HEADERS if headers is None else headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        # The response owns the socket once it is read to a close (the connection only
        # marks it closed): left to the garbage collector after an IncompleteRead, the
        # socket could be finalized before its file and warn in whatever test runs then.
        if response is not None:
            response.close()
        conn.close()


def sse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for chunk in raw.decode().strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def tool_history(result_first: bool = True) -> list[dict[str, Any]]:
    result = {"type": "tool_result", "tool_use_id": "toolu_01abc", "content": "3 hits"}
    note = {"type": "text", "text": "Here you go."}
    return [
        {"role": "user", "content": "Find otters."},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Searching."},
                {
                    "type": "tool_use",
                    "id": "toolu_01abc",
                    "name": "search",
                    "input": {"q": "otter"},
                },
            ],
        },
        {"role": "user", "content": [result, note] if result_first else [note, result]},
    ]


# -- responses --------------------------------------------------------------------------------


def test_json_message_has_the_real_shape(api: MessagesAPIServer) -> None:
    status, headers, raw = post(api, body())
    assert status == 200
    assert headers["request-id"].startswith("req_")
    message = json.loads(raw)
    assert set(message) == {
        "id",
        "type",
        "role",
        "model",
        "content",
        "stop_reason",
        "stop_sequence",
        "stop_details",  # the SDK's Message has it (a refusal's category), null otherwise
        "usage",
    }
    assert message["id"].startswith("msg_01")
    assert (message["type"], message["role"], message["model"]) == (
        "message",
        "assistant",
        "claude-haiku-4-5",
    )
    assert message["content"] == [{"type": "text", "text": "Hello there."}]
    assert (message["stop_reason"], message["stop_sequence"]) == ("end_turn", None)
    usage = message["usage"]
    for key in (
        "input_tokens",
        "output_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    ):
        assert isinstance(usage[key], int)
    assert usage["input_tokens"] >= 1 and usage["output_tokens"] >= 1
    record = api.last_request
    assert record["headers"]["x-api-key"] == "sk-test"
    assert record["body"] == body()
    assert record["request_id"] == headers["request-id"]
    assert record["status"] == 200 and record["stream"] is False


def test_stream_events_match_the_real_sequence(api: MessagesAPIServer) -> None:
    long_text = "The quick brown fox jumps over the lazy dog. " * 3
    api.script = lambda b: Reply(
        [text(long_text), tool_use("search", {"q": "otters", "limit": 10})],
        usage={"cache_read_input_tokens": 7},
    )
    status, headers, raw = post(api, body(stream=True, tools=TOOLS))
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    assert headers["request-id"].startswith("req_")
    events = sse_events(raw)
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-2:] == ["message_delta", "message_stop"]
    assert all(name == data["type"] for name, data in events)

    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["cache_read_input_tokens"] == 7
    assert start["usage"]["input_tokens"] >= 1

    deltas = [d for n, d in events if n == "content_block_delta"]
    text_deltas = [d["delta"]["text"] for d in deltas if d["index"] == 0]
    assert len(text_deltas) > 3 and "".join(text_deltas) == long_text
    json_deltas = [d["delta"] for d in deltas if d["index"] == 1]
    assert {d["type"] for d in json_deltas} == {"input_json_delta"}
    assert json_deltas[0]["partial_json"] == ""  # like the real API
    assert json.loads("".join(d["partial_json"] for d in json_deltas)) == {
        "q": "otters",
        "limit": 10,
    }
    tool_start = [d for n, d in events if n == "content_block_start"][1]["content_block"]
    assert tool_start["type"] == "tool_use" and tool_start["input"] == {}
    assert tool_start["id"].startswith("toolu_01") and tool_start["name"] == "search"
    assert [d["index"] for n, d in events if n == "content_block_stop"] == [0, 1]

    final = events[-2][1]
    assert final["delta"] == {
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "stop_details": None,
    }
    assert final["usage"]["output_tokens"] >= 1
    assert api.disconnects == 0


def test_truncated_tool_input_is_cut_mid_json(api: MessagesAPIServer) -> None:
    full = {"path": "/tmp/notes.txt", "content": "a fairly long line of text"}
    api.script = lambda b: Reply([tool_use("write", full)], truncate_input=True)
    _, _, raw = post(api, body(stream=True))
    events = sse_events(raw)
    partial = "".join(d["delta"]["partial_json"] for n, d in events if n == "content_block_delta")
    assert json.dumps(full).startswith(partial) and partial != json.dumps(full)
    with pytest.raises(ValueError):
        json.loads(partial)
    assert events[-2][1]["delta"]["stop_reason"] == "max_tokens"

    _, _, raw = post(api, body())
    message = json.loads(raw)
    assert message["stop_reason"] == "max_tokens"
    assert message["content"][0]["input"] == {}


def test_stream_error_event_and_dropped_connection(api: MessagesAPIServer) -> None:
    api.script = lambda b: Reply("partial answer", stream_error="overloaded_error")
    _, _, raw = post(api, body(stream=True))
    name, data = sse_events(raw)[-1]
    assert name == "error" and data["error"]["type"] == "overloaded_error"

    api.script = lambda b: Reply("never finished", drop_after=2)
    with pytest.raises(http.client.IncompleteRead):
        post(api, body(stream=True))


def test_keep_alive_connection_serves_several_requests(api: MessagesAPIServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=5)
    try:
        for stream in (False, True, False):
            conn.request("POST", "/v1/messages", json.dumps(body(stream=stream)), HEADERS)
            response = conn.getresponse()
            assert response.status == 200
            response.read()
    finally:
        conn.close()
    assert len(api.requests) == 3


# -- errors -----------------------------------------------------------------------------------


def test_error_reply_shape_headers_and_request_id(api: MessagesAPIServer) -> None:
    api.script = lambda b: error(429, retry_after=3)
    status, headers, raw = post(api, body(stream=True))
    assert status == 429
    assert headers["retry-after"] == "3"
    assert headers["request-id"].startswith("req_")
    payload = json.loads(raw)
    assert payload["type"] == "error"
    assert payload["error"]["type"] == "rate_limit_error"
    assert payload["request_id"] == headers["request-id"]

    for status_code, error_type in ((529, "overloaded_error"), (500, "api_error")):
        api.script = lambda b, s=status_code: error(s)
        status, _, raw = post(api, body())
        assert status == status_code
        assert json.loads(raw)["error"]["type"] == error_type


def test_authentication(api: MessagesAPIServer) -> None:
    no_key = {k: v for k, v in HEADERS.items() if k != "x-api-key"}
    status, headers, raw = post(api, body(), headers=no_key)
    assert status == 401 and headers["request-id"]
    assert json.loads(raw)["error"] == {
        "type": "authentication_error",
        "message": "x-api-key header is required",
    }
    status, _, _ = post(api, body(), headers={**no_key, "authorization": "Bearer tok"})
    assert status == 200

    with MessagesAPIServer(lambda b: Reply("ok"), api_key="right") as strict:
        assert post(strict, body(), headers={**HEADERS, "x-api-key": "wrong"})[0] == 401
        assert post(strict, body(), headers={**HEADERS, "x-api-key": "right"})[0] == 200


def test_unknown_path_and_bad_json(api: MessagesAPIServer) -> None:
    status, _, raw = post(api, body(), path="/v1/complete")
    assert status == 404 and json.loads(raw)["error"]["type"] == "not_found_error"
    status, _, raw = post(api, b"{not json")
    assert status == 400 and json.loads(raw)["error"]["type"] == "invalid_request_error"


INVALID = [
    ("missing model", lambda b: b.pop("model"), "model: Field required"),
    # max_tokens 0 is accepted (it fills the prompt cache): catalog RULES max_tokens_zero.
    ("max_tokens negative", lambda b: b.update(max_tokens=-1), "max_tokens"),
    ("max_tokens str", lambda b: b.update(max_tokens="64"), "max_tokens"),
    ("max_tokens bool", lambda b: b.update(max_tokens=True), "max_tokens"),
    ("no messages", lambda b: b.update(messages=[]), "at least one message"),
    (
        "first assistant",
        lambda b: b.update(messages=[{"role": "assistant", "content": "Hi"}]),
        'first message must use the "user" role',
    ),
    (
        "system role",
        lambda b: b["messages"].append({"role": "system", "content": "x"}),
        "messages.3.role",
    ),
    ("content int", lambda b: b["messages"][0].update(content=3), "messages.0.content"),
    ("empty content", lambda b: b["messages"][0].update(content=""), "non-empty content"),
    (
        "empty text block",
        lambda b: b["messages"][0].update(content=[{"type": "text", "text": ""}]),
        "text content blocks must be non-empty",
    ),
    (
        "unknown block",
        lambda b: b["messages"][0].update(content=[{"type": "video"}]),
        "Input tag 'video'",
    ),
    (
        "extra param",
        lambda b: b.update(temprature=0.5),
        "temprature: Extra inputs are not permitted",
    ),
    ("stream not bool", lambda b: b.update(stream="yes"), "stream"),
    ("temperature range", lambda b: b.update(temperature=1.5), "temperature"),
    ("metadata extra", lambda b: b.update(metadata={"run": "1"}), "metadata.run"),
    ("system block type", lambda b: b.update(system=[{"type": "image"}]), "system.0.type"),
    (
        "tool without schema",
        lambda b: b.update(tools=[{"name": "search"}]),
        "tools.0.custom.input_schema: Field required",
    ),
    (
        "tool bad name",
        lambda b: b.update(tools=[{"name": "no spaces", "input_schema": {"type": "object"}}]),
        "tools.0.custom.name",
    ),
    ("duplicate tools", lambda b: b.update(tools=TOOLS + TOOLS), "Tool names must be unique"),
    (
        "tool_choice type",
        lambda b: b.update(tools=TOOLS, tool_choice={"type": "some"}),
        "tool_choice",
    ),
    (
        "tool_choice unknown tool",
        lambda b: b.update(tools=TOOLS, tool_choice={"type": "tool", "name": "nope"}),
        "Tool 'nope' not found",
    ),
    (
        "too many cache breakpoints",
        lambda b: b.update(
            system=[
                {"type": "text", "text": f"part {i}", "cache_control": {"type": "ephemeral"}}
                for i in range(5)
            ]
        ),
        "A maximum of 4 blocks with cache_control may be provided. Found 5.",
    ),
    (
        "bad cache_control",
        lambda b: b.update(system=[{"type": "text", "text": "s", "cache_control": {"type": "x"}}]),
        "cache_control.type",
    ),
    (
        "tool_use without tool_result",
        lambda b: b.update(messages=tool_history()[:2] + [{"role": "user", "content": "Well?"}]),
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: "
        "toolu_01abc. Each `tool_use` block must have a corresponding `tool_result` block in the "
        "next message.",
    ),
    (
        "tool_use as last message",
        lambda b: b.update(messages=tool_history()[:2]),
        "`tool_use` ids were found without `tool_result` blocks immediately after: toolu_01abc",
    ),
    (
        "tool_result not first",
        lambda b: b.update(messages=tool_history(result_first=False)),
        "messages.2: Did not find 1 `tool_result` block(s) at the beginning of this message.",
    ),
    (
        "unknown tool_result id",
        lambda b: b["messages"][2]["content"][0].update(tool_use_id="toolu_01zzz"),
        "messages.2.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_01zzz",
    ),
    (
        "tool_result in assistant message",
        lambda b: b["messages"].append(
            {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "x"}]}
        ),
        "`tool_result` blocks can only be in `user` messages",
    ),
    (
        "tool_use id pattern",
        lambda b: b["messages"][1]["content"][1].update(id="bad id!"),
        "tool_use.id",
    ),
    (
        "tool_use input not dict",
        lambda b: b["messages"][1]["content"][1].update(input="q=otter"),
        "tool_use.input",
    ),
    (
        "tool blocks without tools",
        lambda b: b.pop("tools"),
        "Requests which include `tool_use` or `tool_result` blocks must define tools.",
    ),
    (
        "tool blocks with empty tools",
        lambda b: b.update(tools=[]),
        "Requests which include `tool_use` or `tool_result` blocks must define tools.",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "expected"), [case[1:] for case in INVALID], ids=[case[0] for case in INVALID]
)
def test_invalid_requests_are_rejected_like_the_real_api(
    api: MessagesAPIServer, mutate: Any, expected: str
) -> None:
    data = body(messages=tool_history(), tools=copy.deepcopy(TOOLS))
    mutate(data)
    status, headers, raw = post(api, data)
    assert status == 400, raw
    assert headers["request-id"].startswith("req_")
    payload = json.loads(raw)
    assert payload["type"] == "error"
    assert payload["error"]["type"] == "invalid_request_error"
    assert expected in payload["error"]["message"]


def test_validate_request_works_in_process() -> None:
    validate_request(body(messages=tool_history(), tools=TOOLS))
    with pytest.raises(APIRequestError) as info:
        validate_request(body(messages=tool_history()[:2], tools=TOOLS))
    assert info.value.status == 400 and info.value.error_type == "invalid_request_error"
    assert "toolu_01abc" in info.value.message


VALID = [
    ("tool roundtrip", {"messages": tool_history(), "tools": TOOLS}),
    ("system str", {"system": "You are terse."}),
    (
        "system blocks cached",
        {"system": [{"type": "text", "text": "Be terse.", "cache_control": {"type": "ephemeral"}}]},
    ),
    (
        "sampling and misc params",
        {
            "temperature": 0.2,
            "top_p": 0.9,
            "top_k": 5,
            "stop_sequences": ["END"],
            "metadata": {"user_id": "u1"},
            "stream": False,
        },
    ),
    *[
        (f"tool_choice {kind}", {"tools": TOOLS, "tool_choice": choice})
        for kind, choice in (
            ("auto", {"type": "auto"}),
            ("any", {"type": "any", "disable_parallel_tool_use": True}),
            ("tool", {"type": "tool", "name": "search"}),
            ("none", {"type": "none"}),
        )
    ],
    (
        "cached tool and tool_result list content",
        {
            "tools": [{**TOOLS[0], "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
            "messages": [
                *tool_history()[:2],
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_01abc",
                            "content": [{"type": "text", "text": "boom"}],
                            "is_error": True,
                        }
                    ],
                },
            ],
        },
    ),
    (
        "prefilled final assistant",
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]},
    ),
    (
        "parallel tool calls",
        {
            "tools": TOOLS,
            "messages": [
                {"role": "user", "content": "Two searches."},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "toolu_01a", "name": "search", "input": {}},
                        {"type": "tool_use", "id": "toolu_01b", "name": "search", "input": {}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_01b", "content": "b"},
                        {"type": "tool_result", "tool_use_id": "toolu_01a", "content": "a"},
                        {"type": "text", "text": "Both done."},
                    ],
                },
            ],
        },
    ),
]


@pytest.mark.parametrize("overrides", [case[1] for case in VALID], ids=[case[0] for case in VALID])
def test_valid_requests_are_accepted(api: MessagesAPIServer, overrides: dict[str, Any]) -> None:
    status, _, raw = post(api, body(**copy.deepcopy(overrides)))
    assert status == 200, raw


# -- scripting --------------------------------------------------------------------------------


def test_reply_defaults() -> None:
    assert Reply("hi").stop_reason == "end_turn"
    assert Reply("hi").content == [{"type": "text", "text": "hi"}]
    reply = Reply([text("Looking."), tool_use("search", {"q": "x"})])
    assert reply.stop_reason == "tool_use"
    tool_id = reply.content[1]["id"]
    assert tool_id.startswith("toolu_01") and len(tool_id) == len("toolu_01") + 22
    assert tool_use("search", {}, id="toolu_01fixed")["id"] == "toolu_01fixed"
    assert Reply([tool_use("w", {"a": 1})], truncate_input=True).stop_reason == "max_tokens"
    assert Reply("x", stop_reason="pause_turn").stop_reason == "pause_turn"
    assert error(529).error_type == "overloaded_error" and error(529).is_error
    assert error(429, retry_after=1.5).headers == {"retry-after": "1.5"}
    with pytest.raises(ValueError):
        Reply("no tool", truncate_input=True)


def test_usage_defaults_and_overrides(api: MessagesAPIServer) -> None:
    api.script = lambda b: Reply(
        "ok", usage={"cache_creation_input_tokens": 100, "output_tokens": 9}
    )
    _, _, raw = post(api, body(system="x" * 4000))
    usage = json.loads(raw)["usage"]
    assert usage["input_tokens"] >= 1000  # estimated from the body size
    assert usage["cache_creation_input_tokens"] == 100
    assert usage["cache_read_input_tokens"] == 0
    assert usage["output_tokens"] == 9


def test_script_results_are_coerced(api: MessagesAPIServer) -> None:
    for result, expected in (
        ("plain", [text("plain")]),
        (text("block"), [text("block")]),
        ([text("a"), text("b")], [text("a"), text("b")]),
        (lambda b: Reply("called"), [text("called")]),
    ):
        api.script = lambda b, r=result: r
        _, _, raw = post(api, body())
        assert json.loads(raw)["content"] == expected


def test_by_step_answers_per_step_and_counts(api: MessagesAPIServer) -> None:
    first = Reply([tool_use("search", {"q": "otter"})])
    api.script = by_step([first, "Done."])
    history = body(tools=TOOLS)
    _, _, raw1 = post(api, history)
    _, _, raw2 = post(api, history)  # the same step again (e.g. a retry)
    answer1, answer2 = json.loads(raw1), json.loads(raw2)
    assert answer1["content"] == answer2["content"]  # same tool_use id too
    tool_id = answer1["content"][0]["id"]

    step1 = body(
        tools=TOOLS,
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": answer1["content"]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": tool_id, "content": "ok"}],
            },
        ],
    )
    _, _, raw = post(api, step1)
    assert json.loads(raw)["content"] == [text("Done.")]
    assert step_of(step1) == 1

    step2 = copy.deepcopy(step1)
    step2["messages"] += [
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "And?"},
    ]
    status, _, raw = post(api, step2)
    assert status == 400
    assert "no reply for step 2 (2 scripted)" in json.loads(raw)["error"]["message"]
    assert isinstance(api.script_errors[0], ScriptExhausted)
    assert api.steps() == {0: 2, 1: 1, 2: 1}

    api.reset()
    assert api.requests == [] and api.steps() == {} and api.script_errors == []


# -- disconnects and robustness ---------------------------------------------------------------


def raw_stream_request(port: int, data: dict[str, Any]) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    payload = json.dumps(data).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in HEADERS.items())
    sock.sendall(
        f"POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\n{head}"
        f"content-length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return sock


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before {marker!r}"
        data += chunk
    return data


def test_client_hanging_up_mid_stream_is_counted_quietly(
    api: MessagesAPIServer, capfd: pytest.CaptureFixture[str]
) -> None:
    api.script = lambda b: Reply("word " * 100, delay=0.2)
    sock = raw_stream_request(api.port, body(stream=True))
    read_until(sock, b"message_start")
    started = time.monotonic()
    sock.close()
    assert api.wait_for(lambda: api.disconnects == 1, timeout=2)
    assert time.monotonic() - started < 1.0  # noticed during the delay, not at the end
    time.sleep(0.1)
    assert "Traceback" not in capfd.readouterr().err


def test_a_fully_read_stream_is_no_disconnect(api: MessagesAPIServer) -> None:
    api.script = lambda b: Reply("short", delay=0.01)
    status, _, _ = post(api, body(stream=True))
    assert status == 200
    time.sleep(0.05)
    assert api.disconnects == 0


def test_stop_is_prompt_with_a_slow_stream_running() -> None:
    server = MessagesAPIServer(lambda b: Reply("slow " * 100, delay=1.0)).start()
    sock = raw_stream_request(server.port, body(stream=True))
    try:
        read_until(sock, b"message_start")
        started = time.monotonic()
        server.stop()
        assert time.monotonic() - started < 2.0
    finally:
        sock.close()
    server.stop()  # idempotent


def test_a_held_stream_waits_for_its_release_or_a_hang_up(api: MessagesAPIServer) -> None:
    release = threading.Event()
    api.script = lambda b: Reply("word " * 40, chunk_size=5, hold=release, hold_at=4)
    sock = raw_stream_request(api.port, body(stream=True))
    try:
        seen = read_until(sock, b"content_block_delta")
        sock.settimeout(0.3)
        while True:  # everything before the 4th event, then nothing while held
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            assert chunk, "the held stream ended"
            seen += chunk
        assert seen.count(b"event: ") == 4 and b"message_stop" not in seen
        release.set()
        sock.settimeout(5)
        seen += read_until(sock, b"message_stop")
        assert seen.count(b"event: content_block_delta") == 40
    finally:
        sock.close()
    # A client hanging up while held ends the wait (a worker cancelling its turn).
    api.script = lambda b: Reply("word " * 40, hold=threading.Event(), hold_at=2)
    sock = raw_stream_request(api.port, body(stream=True))
    read_until(sock, b"message_start")
    sock.close()
    assert api.wait_for(lambda: api.disconnects == 1, timeout=2)


def test_a_json_script_cannot_hold() -> None:
    with pytest.raises(ValueError, match="unknown reply field.*hold"):
        script_from_steps([{"content": "hi", "hold": True}])


def test_latency_delays_the_first_byte(api: MessagesAPIServer) -> None:
    api.script = lambda b: Reply("late", latency=0.3)
    started = time.monotonic()
    status, _, _ = post(api, body())
    assert status == 200
    assert time.monotonic() - started >= 0.3
