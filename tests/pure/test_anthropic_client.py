"""AnthropicModelClient through the real `anthropic` SDK, over HTTP to the fake API."""

from __future__ import annotations

import copy
import json
import pickle
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_agentrun.abort import AbortSignal
from django_agentrun.clients.anthropic import AnthropicModelClient
from django_agentrun.clients.base import (
    ModelClient,
    ModelError,
    ModelRequest,
    StreamAborted,
    Usage,
)
from django_agentrun.testing.messages_api import (
    MessagesAPIServer,
    Reply,
    by_step,
    error,
    text,
    tool_use,
)

pytestmark = pytest.mark.timeout(10)

API_KEY = "sk-ant-test-0123456789"
MODEL = "claude-sonnet-4-6"
TOOLS = [
    {
        "name": "search",
        "description": "Search the notes.",
        "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
    {
        "name": "write",
        "description": "Write a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
]
SYSTEM = [
    {"type": "text", "text": "You are a careful research assistant."},
    {"type": "text", "text": "Answer in one sentence."},
]


@pytest.fixture(autouse=True)
def django_settings() -> None:
    """agentrun_settings reads django.conf.settings; configure bare defaults if nobody did."""
    from django.conf import settings

    if not settings.configured:
        settings.configure()


@pytest.fixture
def api() -> Iterator[MessagesAPIServer]:
    with MessagesAPIServer(lambda body: Reply("Hello there.")) as server:
        yield server


@pytest.fixture
def make_client(api: MessagesAPIServer) -> Iterator[Callable[..., AnthropicModelClient]]:
    clients: list[AnthropicModelClient] = []

    def make(**overrides: Any) -> AnthropicModelClient:
        # max_retries=0: these tests look at what one HTTP exchange turns into.
        options = {"base_url": api.base_url, "api_key": API_KEY, "max_retries": 0, "timeout": 5.0}
        client = AnthropicModelClient(**{**options, **overrides})
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def client(make_client: Callable[..., AnthropicModelClient]) -> AnthropicModelClient:
    return make_client()


def request(**overrides: Any) -> ModelRequest:
    options: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 256,
        "messages": [{"role": "user", "content": "Find notes about otters."}],
    }
    options.update(overrides)
    return ModelRequest(**options)


def sent_key(record: dict[str, Any]) -> str | None:
    """The API key a recorded request carried (SDK 2.x sends `authorization: Bearer`)."""
    headers = record["headers"]
    bearer = headers.get("authorization", "")
    return headers.get("x-api-key") or (bearer[7:] if bearer.startswith("Bearer ") else None)


def call(client: AnthropicModelClient, req: ModelRequest | None = None):
    return client.create(req or request(), abort=AbortSignal())


def model_error(client: AnthropicModelClient, req: ModelRequest | None = None) -> ModelError:
    with pytest.raises(ModelError) as info:
        call(client, req)
    return info.value


# -- success ----------------------------------------------------------------------------------


def test_implements_the_protocol(client: AnthropicModelClient) -> None:
    assert isinstance(client, ModelClient)
    assert API_KEY not in repr(client)


def test_streams_a_text_response(api: MessagesAPIServer, client: AnthropicModelClient) -> None:
    api.script = lambda body: Reply("Otters hold hands while they sleep. " * 4)
    response = call(client)
    assert response.content == [
        {"type": "text", "text": "Otters hold hands while they sleep. " * 4}
    ]
    assert response.stop_reason == "end_turn" and response.stop_sequence is None
    assert response.message_id.startswith("msg_01")
    assert response.model == MODEL
    sent = api.last_request
    assert sent["stream"] is True
    assert sent_key(sent) == API_KEY
    assert response.request_id == sent["request_id"]  # the request-id response header
    # Nothing optional was sent for a bare request (but automatic caching).
    assert set(sent["body"]) == {"model", "max_tokens", "messages", "stream", "cache_control"}


def test_optional_params_are_passed(api: MessagesAPIServer, client: AnthropicModelClient) -> None:
    req = request(
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "search"},
        stop_sequences=["END"],
        metadata={"user_id": "user-7"},
        system=SYSTEM,
        cache_prefix=False,
    )
    call(client, req)
    sent = api.last_request["body"]
    assert sent["tools"] == TOOLS and sent["system"] == SYSTEM
    assert sent["tool_choice"] == {"type": "tool", "name": "search"}
    assert sent["stop_sequences"] == ["END"]
    assert sent["metadata"] == {"user_id": "user-7"}


def test_usage_counters(api: MessagesAPIServer, client: AnthropicModelClient) -> None:
    usage = {
        "input_tokens": 12,
        "output_tokens": 34,
        "cache_creation_input_tokens": 560,
        "cache_read_input_tokens": 7800,
    }
    api.script = lambda body: Reply("ok", usage=usage)
    response = call(client)
    # The writes' TTL split, as the API reports it (5 minutes unless scripted otherwise).
    split = {"ephemeral_5m_input_tokens": 560, "ephemeral_1h_input_tokens": 0}
    assert response.usage == Usage(**usage, cache_creation=split)
    assert response.usage.prompt_tokens == 12 + 560 + 7800


def test_tool_use_roundtrip(api: MessagesAPIServer, client: AnthropicModelClient) -> None:
    api.script = by_step(
        [
            Reply([text("Let me search."), tool_use("search", {"q": "otters"})]),
            "Otters hold hands.",
        ]
    )
    first = call(client, request(tools=TOOLS))
    assert first.stop_reason == "tool_use"
    assert first.content[0] == {"type": "text", "text": "Let me search."}
    block = first.content[1]
    assert set(block) == {"type", "id", "name", "input"}
    assert block["type"] == "tool_use" and block["name"] == "search"
    assert block["input"] == {"q": "otters"} and block["id"].startswith("toolu_01")

    # The content goes back verbatim as the assistant turn; the fake validates the pairing.
    history = [
        *request().messages,
        {"role": "assistant", "content": first.content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": block["id"], "content": "2 notes"}],
        },
    ]
    second = call(client, request(tools=TOOLS, messages=history))
    assert second.content == [{"type": "text", "text": "Otters hold hands."}]
    assert api.steps() == {0: 1, 1: 1}


def assistant_tool_use(tool_id: str = "toolu_01abc") -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": tool_id, "name": "search", "input": {"q": "x"}}],
    }


def test_missing_tool_result_is_a_permanent_error(client: AnthropicModelClient) -> None:
    history = [
        {"role": "user", "content": "Find otters."},
        assistant_tool_use("toolu_01missing"),
        {"role": "user", "content": "Well?"},
    ]
    err = model_error(client, request(tools=TOOLS, messages=history))
    assert err.retryable is False and err.status == 400
    assert "toolu_01missing" in str(err)
    assert "`tool_use` ids were found without `tool_result` blocks immediately after" in str(err)
    assert err.request_id.startswith("req_")


def test_tool_result_not_first_is_rejected(client: AnthropicModelClient) -> None:
    history = [
        {"role": "user", "content": "Find otters."},
        assistant_tool_use(),
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Here:"},
                {"type": "tool_result", "tool_use_id": "toolu_01abc", "content": "none"},
            ],
        },
    ]
    err = model_error(client, request(tools=TOOLS, messages=history))
    assert err.retryable is False and err.status == 400
    assert "at the beginning of this message" in str(err)


def test_tool_blocks_without_tools_are_rejected(client: AnthropicModelClient) -> None:
    history = [
        {"role": "user", "content": "Find otters."},
        assistant_tool_use(),
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_01abc", "content": "none"}],
        },
    ]
    err = model_error(client, request(messages=history))
    assert err.retryable is False and err.status == 400
    assert "must define tools" in str(err)


# -- prompt caching ---------------------------------------------------------------------------


def cache_controls(value: Any) -> int:
    """How many cache_control markers are in a JSON value."""
    if isinstance(value, dict):
        return ("cache_control" in value) + sum(cache_controls(v) for v in value.values())
    if isinstance(value, list):
        return sum(cache_controls(v) for v in value)
    return 0


def test_cache_prefix_marks_last_tool_and_last_system_block_and_follows_the_conversation(
    api: MessagesAPIServer, client: AnthropicModelClient
) -> None:
    req = request(tools=copy.deepcopy(TOOLS), system=copy.deepcopy(SYSTEM), cache_prefix=True)
    before = copy.deepcopy(req)
    call(client, req)
    sent = api.last_request["body"]
    assert sent["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert sent["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in sent["tools"][0] and "cache_control" not in sent["system"][0]
    # Automatic caching: the API puts this breakpoint on the last block, each turn.
    assert sent["cache_control"] == {"type": "ephemeral"}
    assert cache_controls(sent) == 3
    assert req == before  # the request (and its lists and dicts) were not mutated
    assert cache_controls(req.tools) == cache_controls(req.system) == 0


def test_cache_ttl_and_the_breakpoint_limit(
    api: MessagesAPIServer, client: AnthropicModelClient
) -> None:
    """1 hour for a run that may wait for a person; never more than the API's 4 breakpoints:
    breakpoints of the input leave fewer for the prefix (system goes first, then tools)."""
    hour = {"type": "ephemeral", "ttl": "1h"}
    call(client, request(tools=copy.deepcopy(TOOLS), system=copy.deepcopy(SYSTEM), cache_ttl="1h"))
    sent = api.last_request["body"]
    assert sent["cache_control"] == sent["tools"][-1]["cache_control"] == hour
    assert sent["system"][-1]["cache_control"] == hour
    for given in (1, 2, 3):
        content = [
            {"type": "text", "text": f"part {i}", "cache_control": {"type": "ephemeral"}}
            for i in range(given)
        ] + [{"type": "text", "text": "the question"}]  # the last block unmarked (below)
        req = request(
            tools=copy.deepcopy(TOOLS),
            system=copy.deepcopy(SYSTEM),
            messages=[{"role": "user", "content": content}],
        )
        call(client, req)
        sent = api.last_request["body"]
        assert cache_controls(sent) == 4
        assert "cache_control" in sent  # the moving breakpoint is the last one dropped
        assert ("cache_control" in sent["system"][-1]) == (given == 1)
    # The input's last block marked by the host: automatic caching would land on it (a
    # no-op, or a 400 with another TTL), so there is no top-level marker.
    content = [{"type": "text", "text": "marked", "cache_control": {"type": "ephemeral"}}]
    call(client, request(messages=[{"role": "user", "content": content}]))
    assert "cache_control" not in api.last_request["body"]


def test_no_cache_control_without_cache_prefix(
    api: MessagesAPIServer, client: AnthropicModelClient
) -> None:
    req = request(tools=copy.deepcopy(TOOLS), system=copy.deepcopy(SYSTEM), cache_prefix=False)
    call(client, req)
    assert cache_controls(api.last_request["body"]) == 0


def test_cache_prefix_with_only_system(
    api: MessagesAPIServer, client: AnthropicModelClient
) -> None:
    call(client, request(system=[{"type": "text", "text": "Be brief."}]))
    sent = api.last_request["body"]
    assert "tools" not in sent
    assert sent["system"] == [
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}
    ]


# -- errors -----------------------------------------------------------------------------------


def test_rate_limit_is_retryable_with_retry_after(
    api: MessagesAPIServer, client: AnthropicModelClient
) -> None:
    api.script = lambda body: error(
        429,
        message="Number of request tokens has exceeded your per-minute rate limit",
        retry_after=2,
    )
    err = model_error(client)
    assert err.retryable is True and err.status == 429
    assert err.retry_after == 2.0
    assert "rate_limit_error" in str(err) and "per-minute rate limit" in str(err)
    assert err.request_id == api.last_request["request_id"]
    assert isinstance(err.__cause__, Exception)  # raised from the SDK error
    assert len(api.requests) == 1  # max_retries=0: the SDK did not retry by itself


def test_retry_after_ms_wins(api: MessagesAPIServer, client: AnthropicModelClient) -> None:
    api.script = lambda body: error(429, headers={"retry-after-ms": "1500", "retry-after": "9"})
    assert model_error(client).retry_after == 1.5


@pytest.mark.parametrize(
    ("status", "error_type"),
    [(529, "overloaded_error"), (500, "api_error"), (503, "api_error"), (408, "timeout_error")],
)
def test_server_side_errors_are_retryable(
    api: MessagesAPIServer, client: AnthropicModelClient, status: int, error_type: str
) -> None:
    api.script = lambda body: error(status)
    err = model_error(client)
    assert err.retryable is True and err.status == status
    assert error_type in str(err)
    assert err.retry_after is None


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (400, "prompt is too long: 210000 tokens > 200000 maximum"),
        (403, "Your API key does not have permission to use the specified resource."),
        (404, "model: claude-nope"),
        (413, "Request exceeds the maximum allowed number of bytes."),
        (422, "Unprocessable."),
    ],
)
def test_client_errors_are_permanent(
    api: MessagesAPIServer, client: AnthropicModelClient, status: int, message: str
) -> None:
    api.script = lambda body: error(status, message=message)
    err = model_error(client)
    assert err.retryable is False and err.status == status
    assert message in str(err)
    assert err.request_id.startswith("req_")


def test_authentication_error_is_permanent_and_hides_the_key(
    make_client: Callable[..., AnthropicModelClient],
) -> None:
    with MessagesAPIServer(lambda body: Reply("ok"), api_key="the-right-key") as strict:
        client = make_client(base_url=strict.base_url)
        err = model_error(client)
    assert err.retryable is False and err.status == 401
    assert "authentication_error" in str(err)
    assert API_KEY not in str(err) and API_KEY not in repr(err.args)


def test_x_should_retry_header_is_obeyed(
    api: MessagesAPIServer, client: AnthropicModelClient
) -> None:
    api.script = lambda body: error(500, headers={"x-should-retry": "false"})
    assert model_error(client).retryable is False
    api.script = lambda body: error(409, headers={"x-should-retry": "true"})
    assert model_error(client).retryable is True


def test_connection_refused_is_retryable(make_client: Callable[..., AnthropicModelClient]) -> None:
    with socket.socket() as sock:  # a port nobody listens on any more
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = make_client(base_url=f"http://127.0.0.1:{port}")
    err = model_error(client)
    assert err.retryable is True and err.status is None
    assert "connection" in str(err).lower()


def test_error_event_mid_stream_is_retryable(
    api: MessagesAPIServer, client: AnthropicModelClient
) -> None:
    api.script = lambda body: Reply("Half an ans", stream_error="overloaded_error")
    err = model_error(client)
    assert err.retryable is True and err.status == 529
    assert "overloaded_error" in str(err)


def test_connection_dropped_mid_stream_is_retryable(
    api: MessagesAPIServer, client: AnthropicModelClient
) -> None:
    api.script = lambda body: Reply("This answer never finishes. " * 5, drop_after=4)
    err = model_error(client)
    assert err.retryable is True and err.status is None
    assert err.request_id == api.last_request["request_id"]


def test_stalled_stream_times_out_retryably(
    api: MessagesAPIServer, make_client: Callable[..., AnthropicModelClient]
) -> None:
    api.script = lambda body: Reply("slow " * 20, delay=1.0)
    client = make_client(timeout=0.3)
    started = time.monotonic()
    err = model_error(client)
    assert time.monotonic() - started < 1.0
    assert err.retryable is True and "timed out" in str(err)


def test_model_error_survives_pickling(
    api: MessagesAPIServer, client: AnthropicModelClient
) -> None:
    api.script = lambda body: error(429, retry_after=4)
    err = pickle.loads(pickle.dumps(model_error(client)))
    assert (err.retryable, err.status, err.retry_after) == (True, 429, 4.0)


# -- abort ------------------------------------------------------------------------------------


def test_abort_during_a_slow_stream_cuts_it_promptly(
    api: MessagesAPIServer, client: AnthropicModelClient
) -> None:
    # About 25 events 0.5 s apart: draining it would take over 10 s.
    api.script = lambda body: Reply("Otters are mustelids. " * 20, delay=0.5)
    abort = AbortSignal()
    timer = threading.Timer(0.7, abort.abort, kwargs={"reason": "cancelled"})
    started = time.monotonic()
    timer.start()
    try:
        with pytest.raises(StreamAborted):
            client.create(request(), abort=abort)
    finally:
        timer.cancel()
    assert time.monotonic() - started < 1.5
    assert api.wait_for(lambda: api.disconnects == 1, timeout=1.0)
    assert abort._callbacks == []  # the client's callback was removed (fired and dropped)


def test_abort_before_start_sends_nothing(
    api: MessagesAPIServer, client: AnthropicModelClient
) -> None:
    abort = AbortSignal()
    abort.abort("lease_lost")
    with pytest.raises(StreamAborted, match="lease_lost"):
        client.create(request(), abort=abort)
    assert api.requests == []


def test_abort_while_waiting_for_headers(
    api: MessagesAPIServer, client: AnthropicModelClient
) -> None:
    api.script = lambda body: Reply("late", latency=0.3)
    abort = AbortSignal()
    threading.Timer(0.1, abort.abort).start()
    with pytest.raises(StreamAborted):
        client.create(request(), abort=abort)


def test_callback_is_removed_after_a_normal_call(client: AnthropicModelClient) -> None:
    abort = AbortSignal()
    client.create(request(), abort=abort)
    assert abort._callbacks == []
    abort.abort()  # nothing left to cut; must not raise


def test_client_is_reusable_after_an_abort(
    api: MessagesAPIServer, client: AnthropicModelClient
) -> None:
    api.script = lambda body: Reply("slow " * 50, delay=0.2)
    abort = AbortSignal()
    threading.Timer(0.3, abort.abort).start()
    with pytest.raises(StreamAborted):
        client.create(request(), abort=abort)
    api.script = lambda body: Reply("fast")
    assert call(client).content == [{"type": "text", "text": "fast"}]


# -- stop reasons -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stop_reason", "stop_sequence"),
    [
        ("end_turn", None),
        ("tool_use", None),
        ("max_tokens", None),
        ("pause_turn", None),
        ("refusal", None),
        ("stop_sequence", "END"),
        ("model_context_window_exceeded", None),
    ],
)
def test_stop_reasons_pass_through(
    api: MessagesAPIServer,
    client: AnthropicModelClient,
    stop_reason: str,
    stop_sequence: str | None,
) -> None:
    content = [tool_use("search", {"q": "x"})] if stop_reason == "tool_use" else "Partial"
    api.script = lambda body: Reply(content, stop_reason=stop_reason, stop_sequence=stop_sequence)
    response = call(client, request(tools=TOOLS))
    assert response.stop_reason == stop_reason
    assert response.stop_sequence == stop_sequence


def test_truncated_tool_use_at_max_tokens(
    api: MessagesAPIServer, client: AnthropicModelClient
) -> None:
    full = {"path": "/tmp/otters.md", "content": "Otters hold hands while sleeping."}
    api.script = lambda body: Reply(
        [text("Writing it."), tool_use("write", full)], truncate_input=True
    )
    response = call(client, request(tools=TOOLS))
    assert response.stop_reason == "max_tokens"
    assert response.content[0] == {"type": "text", "text": "Writing it."}
    block = response.content[1]
    assert block["type"] == "tool_use" and block["name"] == "write"
    assert block["id"].startswith("toolu_01")
    # The SDK parses the cut JSON leniently: a dict with only the complete fields.
    assert isinstance(block["input"], dict)
    assert block["input"].items() <= full.items() and block["input"] != full


# -- construction -----------------------------------------------------------------------------


def test_settings_and_environment_apply_lazily(
    api: MessagesAPIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.test import override_settings

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-from-env")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", api.base_url)
    client = AnthropicModelClient()  # nothing is read or built yet
    try:
        with override_settings(AGENTRUN_ANTHROPIC_MAX_RETRIES=0, AGENTRUN_ANTHROPIC_TIMEOUT=7.0):
            assert call(client).content == [{"type": "text", "text": "Hello there."}]
            assert client.client.max_retries == 0
            assert client.client.timeout == 7.0
        assert sent_key(api.last_request) == "sk-from-env"
    finally:
        client.close()


def test_sdk_retries_per_setting(
    api: MessagesAPIServer, make_client: Callable[..., AnthropicModelClient]
) -> None:
    replies = iter([error(529, headers={"retry-after-ms": "10"}), Reply("second time lucky")])
    api.script = lambda body: next(replies)
    client = make_client(max_retries=1)
    assert call(client).content == [{"type": "text", "text": "second time lucky"}]
    assert len(api.requests) == 2


def test_shared_client_is_thread_safe(api: MessagesAPIServer, client: AnthropicModelClient) -> None:
    api.script = lambda body: Reply(body["messages"][0]["content"], delay=0.01)
    results: dict[int, Any] = {}

    def work(n: int) -> None:
        results[n] = call(client, request(messages=[{"role": "user", "content": f"n={n}"}]))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert {n: r.content[0]["text"] for n, r in results.items()} == {n: f"n={n}" for n in range(6)}


# -- deltas (live streams) --------------------------------------------------------------------


def test_deltas_reach_the_sink_as_they_arrive(
    api: MessagesAPIServer, client: AnthropicModelClient
) -> None:
    api.script = lambda body: Reply(
        [
            {"type": "thinking", "thinking": "Otters, then tools.", "signature": "sig"},
            text("Let me search. " * 3),
            tool_use("search", {"q": "otters sleeping"}),
        ],
        chunk_size=7,
    )
    seen: list[dict[str, Any]] = []
    response = call(client, request(tools=TOOLS, on_event=seen.append))
    kinds = [d["kind"] for d in seen]
    assert kinds[0] == "block_start" and kinds[-1] == "block_stop"
    assert [d["block"] for d in seen if d["kind"] == "block_start"] == [
        "thinking",
        "text",
        "tool_use",
    ]
    joined = {
        kind: "".join(d[field] for d in seen if d["kind"] == kind)
        for kind, field in (
            ("text", "text"),
            ("thinking", "thinking"),
            ("input_json", "partial_json"),
        )
    }
    assert joined["text"] == response.content[1]["text"]
    assert joined["thinking"] == "Otters, then tools."
    assert json.loads(joined["input_json"]) == response.content[2]["input"]
    assert len([d for d in seen if d["kind"] == "text"]) == 7  # 45 characters, 7 a delta
    tool_start = next(d for d in seen if d.get("block") == "tool_use")
    assert (tool_start["id"], tool_start["name"]) == (response.content[2]["id"], "search")
    assert all(d["kind"] != "input_json" or d["partial_json"] for d in seen)  # no empty opener


def test_a_failing_sink_never_fails_the_call(
    api: MessagesAPIServer, client: AnthropicModelClient
) -> None:
    def broken(delta: dict[str, Any]) -> None:
        raise RuntimeError("the watcher broke")

    response = call(client, request(on_event=broken))
    assert response.content == [{"type": "text", "text": "Hello there."}]
    assert request(on_event=broken) == request()  # the sink is not part of the request


def test_no_api_key__a_permanent_error_that_says_where_to_set_it(
    api: MessagesAPIServer, make_client: Callable[..., AnthropicModelClient], monkeypatch
) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    error = model_error(make_client(api_key=None))
    assert not error.retryable
    assert "set ANTHROPIC_API_KEY in the worker's environment" in str(error)
    assert "Could not resolve" not in str(error)  # not the SDK's own wording
    assert api.requests == []  # nothing was sent


# -- rate limits (the governor: clients/governor.py) ------------------------------------------


class _Governor:
    """A governor double: says `verdict`, records what it learns."""

    def __init__(self, verdict: Any) -> None:
        self.verdict = verdict
        self.learned: list[tuple[dict[str, str], int, float | None]] = []

    def admit(self, scope: str, model: str, admission: Any, input_tokens: int) -> Any:
        assert API_KEY not in scope and input_tokens > 0
        return self.verdict

    def learn(self, scope, model, headers, *, output_tokens=0, retry_after=None) -> None:
        ratelimit = {k: v for k, v in headers.items() if k.startswith("anthropic-ratelimit-")}
        self.learned.append((ratelimit, output_tokens, retry_after))


def test_rate_limit__headers_are_kept_and_learned_while_streaming(
    api: MessagesAPIServer, client: AnthropicModelClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_agentrun.clients import governor
    from django_agentrun.testing.messages_api import AccountLimit

    double = _Governor(governor.GO)
    monkeypatch.setattr(governor, "get_governor", lambda: double)
    api.rate_limit = AccountLimit(5)
    deltas: list[dict[str, Any]] = []
    response = call(client, request(on_event=deltas.append))
    assert response.content == [{"type": "text", "text": "Hello there."}] and deltas
    assert client.last_headers["anthropic-ratelimit-requests-limit"] == "300"
    ((learned, output, retry_after),) = double.learned
    assert learned["anthropic-ratelimit-requests-remaining"] == "4"
    assert output == response.usage.output_tokens and retry_after is None


def test_rate_limit__a_429_is_rate_limited_with_its_retry_after(
    api: MessagesAPIServer, client: AnthropicModelClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_agentrun.clients import RateLimited, governor
    from django_agentrun.testing.messages_api import AccountLimit

    double = _Governor(governor.GO)
    monkeypatch.setattr(governor, "get_governor", lambda: double)
    api.rate_limit = AccountLimit(0.5)
    call(client)
    exc = model_error(client)
    assert isinstance(exc, RateLimited) and exc.status == 429 and exc.retry_after == 2
    assert double.learned[-1][2] == 2
    assert client.last_headers["retry-after"] == "2"


def test_rate_limit__the_governors_not_now_sends_nothing(
    api: MessagesAPIServer, client: AnthropicModelClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_agentrun.clients import RateLimited, governor

    monkeypatch.setattr(governor, "get_governor", lambda: _Governor(governor.Verdict(False, 7)))
    exc = model_error(client)
    assert isinstance(exc, RateLimited) and exc.retry_after == 7
    assert api.requests == []
