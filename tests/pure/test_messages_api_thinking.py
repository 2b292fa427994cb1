"""The stand-in's prefix rule for thinking blocks: it signs the thinking blocks it answers
with, and refuses a later request whose thinking blocks were changed, or whose system
prompt, tools, model or earlier messages differ from those they were made after, with the
API's 400."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from django_agentrun.testing.messages_api import (
    APIRequestError,
    MessagesAPIServer,
    Reply,
    text,
    tool_use,
    validate_request,
)
from django_agentrun.testing.messages_api.thinking import BOUND, seal, sign, signature

pytestmark = pytest.mark.timeout(10)

TOOLS = [{"name": "search", "description": "Search.", "input_schema": {"type": "object"}}]
SYSTEM = [{"type": "text", "text": "You are terse."}]


def request(messages: list[dict[str, Any]], **overrides: Any) -> dict[str, Any]:
    return {
        "model": "claude-fable-5-1",
        "max_tokens": 64,
        "system": SYSTEM,
        "tools": TOOLS,
        "messages": messages,
        **overrides,
    }


def history(answer: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Find otters."},
        {"role": "assistant", "content": answer},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "3 hits"}],
        },
    ]


FIRST = request([{"role": "user", "content": "Find otters."}])
ANSWER = sign(
    FIRST,
    [
        {"type": "thinking", "thinking": "I should search."},
        {"type": "redacted_thinking", "data": "opaque"},
        tool_use("search", {"q": "otters"}, id="toolu_1"),
    ],
)


def refusal(body: dict[str, Any]) -> str:
    with pytest.raises(APIRequestError) as caught:
        validate_request(body)
    assert caught.value.status == 400 and caught.value.error_type == "invalid_request_error"
    return caught.value.message


def test_thinking__sent_back_unchanged_under_the_same_prefix_is_accepted():
    assert validate_request(request(history(ANSWER))) is None
    # Cache breakpoints are not part of the prefix; a string system prompt equals its block.
    marked = [{**SYSTEM[0], "cache_control": {"type": "ephemeral"}}]
    assert validate_request(request(history(ANSWER), system=marked)) is None
    assert validate_request(request(history(ANSWER), system="You are terse.")) is None


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"system": [{"type": "text", "text": "You are verbose."}]}, "signature"),
        ({"system": [*SYSTEM, {"type": "text", "text": "Today is Monday."}]}, "signature"),
        ({"tools": [*TOOLS, {"name": "more", "input_schema": {"type": "object"}}]}, "signature"),
        ({"tools": []}, "signature"),
    ],
    ids=["other system prompt", "text added to it", "a tool added", "tools removed"],
)
def test_thinking__under_another_system_prompt_or_tools_is_refused(change, where):
    body = request(history(ANSWER), **change)
    if change.get("tools") == []:
        body.pop("tools")
        # No tool results without tools (the block's check comes first).
        body["messages"] = [*history(ANSWER)[:2], {"role": "user", "content": "And?"}]
    assert refusal(body) == f"messages.1.content.0: Invalid `{where}` in `thinking` block. {BOUND}"


def test_thinking__without_the_prefix_check_only_the_block_itself_is_checked():
    """Models before the preserved-thinking ones (Opus / Sonnet / Haiku 4.x) take a block
    back whatever came before it, but not a changed block nor another model's (issue #36;
    preserved thinking: "Starting with Claude Fable 5.1")."""
    first = {**FIRST, "model": "claude-haiku-4-5"}
    answer = sign(first, [{"type": "thinking", "thinking": "Search."}, ANSWER[2]])
    other_system = request(history(answer), model="claude-haiku-4-5", system="Be verbose.")
    validate_request(other_system)  # a changed prefix: accepted
    changed = [{**answer[0], "thinking": "Do not."}, answer[1]]
    assert "Invalid `signature`" in refusal(request(history(changed), model="claude-haiku-4-5"))
    assert "Invalid `signature`" in refusal(request(history(answer), model="claude-opus-4-8"))


def test_thinking__a_changed_block_is_refused():
    changed = [{**ANSWER[0], "thinking": "I should not search."}, *ANSWER[1:]]
    assert refusal(request(history(changed))) == (
        f"messages.1.content.0: Invalid `signature` in `thinking` block. {BOUND}"
    )
    unsigned = [{"type": "thinking", "thinking": "x"}, *ANSWER[1:]]
    assert refusal(request(history(unsigned))) == (
        "messages.1.content.0.thinking.signature: Field required"
    )
    redacted = [ANSWER[0], {"type": "redacted_thinking", "data": "b3BhcXVl"}, ANSWER[2]]
    assert refusal(request(history(redacted))) == (
        f"messages.1.content.1: Invalid `data` in `redacted_thinking` block. {BOUND}"
    )
    resealed = [ANSWER[0], {"type": "redacted_thinking", "data": seal(FIRST, "other")}, ANSWER[2]]
    validate_request(request(history(resealed)))  # sealed under this prefix: accepted


def test_thinking__only_in_assistant_messages():
    block = {"type": "thinking", "thinking": "x", "signature": signature(FIRST, "x")}
    body = request([{"role": "user", "content": [block]}])
    assert (
        refusal(body)
        == "messages.0.content.0: `thinking` blocks can only be in `assistant` messages"
    )


# --------------------------------------------------------------------------- through the SDK


@pytest.fixture
def api() -> Iterator[MessagesAPIServer]:
    script = lambda body: Reply(  # noqa: E731
        [{"type": "thinking", "thinking": "Let me think."}, text("Otters hold hands.")]
    )
    with MessagesAPIServer(script) as server:
        yield server


@pytest.fixture
def client(api):
    with anthropic.Anthropic(base_url=api.base_url, api_key="test", max_retries=0) as client:
        yield client


def test_sdk__a_streamed_thinking_block_goes_back_and_a_changed_prompt_gets_the_apis_400(
    api, client
):
    asked = [{"role": "user", "content": "Otters?"}]
    with client.messages.stream(
        model="claude-fable-5-1", max_tokens=64, system="A", messages=asked
    ) as stream:
        message = stream.get_final_message()
    thought = message.content[0].model_dump(exclude_none=True)
    assert thought["type"] == "thinking" and thought["signature"]
    again = [
        *asked,
        {"role": "assistant", "content": [thought]},
        {"role": "user", "content": "More?"},
    ]
    client.messages.create(model="claude-fable-5-1", max_tokens=64, system="A", messages=again)
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="claude-fable-5-1", max_tokens=64, system="B", messages=again)
    body = refused.value.response.json()
    assert body["type"] == "error" and body["request_id"].startswith("req_")
    assert body["error"] == {
        "type": "invalid_request_error",
        "message": f"messages.1.content.0: Invalid `signature` in `thinking` block. {BOUND}",
    }
    assert [r["status"] for r in api.requests] == [200, 200, 400]


# ------------------------------------------------ bound to the model and the earlier messages


def test_thinking__after_a_changed_earlier_message_is_refused():
    """A changed tool result before the block (replace_tool_result), an earlier message
    left out (a rollback) or a new one put before it: the block no longer holds."""
    later_ask = request(history(ANSWER))
    later = sign(later_ask, [{"type": "thinking", "thinking": "Three hits."}, text("Three.")])
    body = request([*history(ANSWER), {"role": "assistant", "content": later}])
    body["messages"].append({"role": "user", "content": "More?"})
    assert validate_request(body) is None
    edited = [dict(m) for m in body["messages"]]
    edited[2] = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "0 hits"}],
    }
    assert refusal(request(edited)) == (
        f"messages.3.content.0: Invalid `signature` in `thinking` block. {BOUND}"
    )
    earlier = [{"role": "user", "content": "Hello."}, {"role": "assistant", "content": "Hi."}]
    assert refusal(request([*earlier, *body["messages"]])).startswith(
        "messages.3.content.0: Invalid `signature`"
    )
    # Left out from the changed point on, the request is valid again.
    without = [*edited[:3], {"role": "assistant", "content": later[1:]}, edited[4]]
    assert validate_request(request(without)) is None


def test_thinking__on_another_model_is_refused():
    """The API drops a block the model cannot read; the stand-in refuses it, so a test
    shows the app never sends one."""
    assert refusal(request(history(ANSWER), model="claude-opus-4-5")) == (
        f"messages.1.content.0: Invalid `signature` in `thinking` block. {BOUND}"
    )
