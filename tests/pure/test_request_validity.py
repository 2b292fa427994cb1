"""Request rules the stand-in applies as the API does, each refused through the real SDK
(cache breakpoints counted over the whole request, TTL order, prefill), and where the app
places its own breakpoints (clients/caching.place) so that it never sends a refused one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from django_agentrun.clients.anthropic import AnthropicModelClient
from django_agentrun.clients.base import ModelRequest
from django_agentrun.testing.messages_api import (
    APIRequestError,
    MessagesAPIServer,
    Reply,
    server_tool_use,
    text,
    validate_request,
)
from django_agentrun.testing.messages_api.history import PREFILL_REFUSED, accepts_prefill

pytestmark = pytest.mark.timeout(20)

FIVE_M = {"type": "ephemeral"}
ONE_H = {"type": "ephemeral", "ttl": "1h"}
TOOL = {"name": "lookup", "input_schema": {"type": "object"}}


def body(**parts: Any) -> dict[str, Any]:
    return {
        "model": "claude-haiku-4-5",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "Hi."}],
        **parts,
    }


def refusal(request: dict[str, Any]) -> str:
    with pytest.raises(APIRequestError) as caught:
        validate_request(request)
    assert caught.value.status == 400
    return caught.value.message


@pytest.fixture
def api() -> Iterator[MessagesAPIServer]:
    with MessagesAPIServer(lambda b: Reply([text("ok")])) as server:
        yield server


@pytest.fixture
def sdk(api: MessagesAPIServer) -> Iterator[anthropic.Anthropic]:
    # Closed here: an SDK client is freed only by the cycle collector (its resources point
    # back at it), which may finalize a pooled socket first and warn in a later test.
    with anthropic.Anthropic(base_url=api.base_url, api_key="k", max_retries=0) as client:
        yield client


# --------------------------------------------------------------------------- the stand-in


def test_breakpoints__counted_over_tools_system_messages_and_the_top_level(sdk):
    five = dict(
        tools=[{**TOOL, "cache_control": FIVE_M}],
        system=[{"type": "text", "text": "S.", "cache_control": FIVE_M}],
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "A.", "cache_control": FIVE_M},
                    {"type": "text", "text": "B.", "cache_control": FIVE_M},
                ],
            }
        ],
        cache_control=FIVE_M,
    )
    with pytest.raises(anthropic.BadRequestError, match="A maximum of 4 blocks with cache_cont"):
        sdk.messages.create(model="claude-haiku-4-5", max_tokens=16, **five)
    four = {**five, "cache_control": None}
    four.pop("cache_control")
    sdk.messages.create(model="claude-haiku-4-5", max_tokens=16, **four)


def test_breakpoints__a_longer_ttl_after_a_shorter_one_is_refused(sdk):
    wrong = dict(
        tools=[{**TOOL, "cache_control": FIVE_M}],
        system=[{"type": "text", "text": "S.", "cache_control": ONE_H}],
        messages=[{"role": "user", "content": "Hi."}],
    )
    with pytest.raises(anthropic.BadRequestError, match="ttl '1h' must not come after"):
        sdk.messages.create(model="claude-haiku-4-5", max_tokens=16, **wrong)
    # The top level (the last block) counts too: 1 hour there after 5 minutes in system.
    late = body(
        system=[{"type": "text", "text": "S.", "cache_control": FIVE_M}], cache_control=ONE_H
    )
    assert "ttl '1h' must not come after" in refusal(late)
    right = {**wrong, "tools": [{**TOOL, "cache_control": ONE_H}]}
    right["system"] = [{"type": "text", "text": "S.", "cache_control": FIVE_M}]
    sdk.messages.create(model="claude-haiku-4-5", max_tokens=16, **right)


def test_prefill__refused_from_the_4_6_generation_on(sdk):
    prefill = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Well,"}]
    with pytest.raises(anthropic.BadRequestError, match="does not support assistant message"):
        sdk.messages.create(model="claude-sonnet-5-5", max_tokens=16, messages=prefill)
    assert refusal(body(model="claude-opus-4-6", messages=prefill)) == PREFILL_REFUSED
    sdk.messages.create(model="claude-haiku-4-5", max_tokens=16, messages=prefill)
    assert [accepts_prefill(m) for m in ("claude-haiku-4-5", "claude-sonnet-4-6")] == [True, False]
    # A paused turn sent back last is how it continues, not a prefill.
    paused = {
        "role": "assistant",
        "content": [server_tool_use("web_search", {"query": "q"}, id="srvtoolu_01a")],
    }
    tools = [{"type": "web_search_20250305", "name": "web_search"}]
    validate_request(body(model="claude-sonnet-5-5", tools=tools, messages=[prefill[0], paused]))


# --------------------------------------------------------------------------- the app


def params(system: Any, tools: list, messages: list, ttl: str = "5m") -> dict[str, Any]:
    request = ModelRequest(
        model="claude-haiku-4-5",
        messages=messages,
        max_tokens=16,
        system=system,
        tools=tools,
        cache_prefix=True,
        cache_ttl=ttl,
    )
    return AnthropicModelClient.build_params(request)


def ttls(p: dict[str, Any]) -> list[str]:
    found = [
        t.get("cache_control", {}).get("ttl", "5m")
        for t in p.get("tools", [])
        if t.get("cache_control")
    ]
    found += [
        b["cache_control"].get("ttl", "5m") for b in p.get("system", []) if b.get("cache_control")
    ]
    for m in p["messages"]:
        for b in m["content"] if isinstance(m["content"], list) else ():
            if b.get("cache_control"):
                found.append(b["cache_control"].get("ttl", "5m"))
    if p.get("cache_control"):
        found.append(p["cache_control"].get("ttl", "5m"))
    return found


MARKED_INPUT = [
    {"role": "user", "content": [{"type": "text", "text": "In.", "cache_control": FIVE_M}]}
]


@pytest.mark.parametrize(
    ("system", "tools", "messages", "ttl", "expected"),
    [
        (
            [{"type": "text", "text": "S."}],
            [TOOL],
            [{"role": "user", "content": "Hi."}],
            "1h",
            ["1h", "1h", "1h"],
        ),
        # The five: the host's system and input markers take two of the four; the
        # input's last block is marked already, so automatic caching (a no-op there) is not.
        (
            [{"type": "text", "text": "S.", "cache_control": FIVE_M}],
            [TOOL],
            MARKED_INPUT,
            "1h",
            ["1h", "5m", "5m"],
        ),
        # A host's 1 hour marker on the input's last block: the app's 5 minutes cannot come
        # before it, and automatic caching's 5 minutes on that block is a 400 (#36).
        (
            [{"type": "text", "text": "S."}],
            [TOOL],
            [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "In.", "cache_control": ONE_H}],
                }
            ],
            "5m",
            ["1h"],
        ),
        # Four of the host's: none of the app's.
        (
            [{"type": "text", "text": str(i), "cache_control": ONE_H} for i in range(3)],
            [{**TOOL, "cache_control": ONE_H}],
            [{"role": "user", "content": "Hi."}],
            "1h",
            ["1h"] * 4,
        ),
    ],
    ids=["app only", "host system and input", "host 1h input", "host took all four"],
)
def test_place__never_more_than_four_and_longer_ttls_first(system, tools, messages, ttl, expected):
    p = params(system, tools, messages, ttl)
    assert ttls(p) == expected
    validate_request(p)  # what the API accepts
