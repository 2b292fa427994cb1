"""The Messages API stand-in refuses exactly what the docs say (issue #36), a test per point:
where it was too strict (a server tool use answered in a later response under programmatic
tool calling; `role: "system"` entries in messages) and too loose (tool names over 64
characters, whitespace-only text, `max_tokens: 0` with what writes output, automatic
caching's TTL against the last block's own marker). Each cites its page in the stand-in."""

from __future__ import annotations

from typing import Any

import pytest

from django_agentrun.testing.messages_api import APIRequestError, validate_request

pytestmark = pytest.mark.timeout(10)

TOOLS = [{"name": "lookup", "input_schema": {"type": "object"}}]


def body(messages: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    found: dict[str, Any] = {
        "model": "claude-opus-5",
        "max_tokens": 64,
        "messages": messages or [{"role": "user", "content": "Hi."}],
    }
    found.update(extra)
    return found


def refused(request: dict[str, Any]) -> str:
    with pytest.raises(APIRequestError) as caught:
        validate_request(request)
    assert caught.value.status == 400 and caught.value.error_type == "invalid_request_error"
    return caught.value.message


# ---- too loose before ---------------------------------------------------------------------


def test_tool_name__at_most_64_characters():
    validate_request(body(tools=[{"name": "a" * 64, "input_schema": {"type": "object"}}]))
    message = refused(body(tools=[{"name": "a" * 65, "input_schema": {"type": "object"}}]))
    assert "{1,64}" in message


def test_tool_name__the_app_refuses_one_the_api_would_when_it_is_defined():
    from django_agentrun import tool
    from django_agentrun.exceptions import ConfigurationError

    def look(query: str) -> str:
        """Look."""
        return query

    assert tool(name="a" * 64)(look).name == "a" * 64
    with pytest.raises(ConfigurationError, match="1 to 64"):
        tool(name="a" * 65)(look)


def test_text__whitespace_only_refused():
    for blank in (" ", "\n\t "):
        message = refused(body([{"role": "user", "content": [{"type": "text", "text": blank}]}]))
        assert message == "messages: text content blocks must contain non-whitespace text"


@pytest.mark.parametrize(
    "extra",
    [
        {"stream": True},
        {"thinking": {"type": "enabled", "budget_tokens": 1024}, "model": "claude-opus-4-6"},
        {"output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
        {"tools": TOOLS, "tool_choice": {"type": "any"}},
        {"tools": TOOLS, "tool_choice": {"type": "tool", "name": "lookup"}},
    ],
    ids=["stream", "thinking enabled", "format", "any", "tool"],
)
def test_max_tokens_zero__refused_with_what_writes_output(extra):
    validate_request(body(max_tokens=0))  # pre-warming the cache: accepted
    assert "max_tokens: 0 cannot be combined" in refused(body(max_tokens=0, **extra))


def test_automatic_caching__a_ttl_unlike_the_last_blocks_own_marker_refused():
    hour = {"type": "ephemeral", "ttl": "1h"}
    last = [{"role": "user", "content": [{"type": "text", "text": "Hi.", "cache_control": hour}]}]
    validate_request(body(last, cache_control=hour))  # the same TTL: a no-op
    assert "automatic caching" in refused(body(last, cache_control={"type": "ephemeral"}))


# ---- too strict before --------------------------------------------------------------------

SEARCH = "srvtoolu_01code"
PTC_TOOLS = [
    {"type": "code_execution_20250825", "name": "code_execution"},
    {**TOOLS[0], "allowed_callers": ["code_execution_20250825"]},
]


def ptc_history(answered: bool) -> list[dict[str, Any]]:
    """Programmatic tool calling: the code called a client tool from within its run; the
    client's tool_result; then (answered) the code's result in the next response."""
    caller = {"type": "code_execution_20250825", "tool_id": SEARCH}
    messages = [
        {"role": "user", "content": "Count the hits."},
        {
            "role": "assistant",
            "content": [
                {"type": "server_tool_use", "id": SEARCH, "name": "code_execution", "input": {}},
                {
                    "type": "tool_use",
                    "id": "toolu_01ptc",
                    "name": "lookup",
                    "input": {},
                    "caller": caller,
                },
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_01ptc", "content": "3"}],
        },
    ]
    if answered:
        result = {
            "type": "code_execution_tool_result",
            "tool_use_id": SEARCH,
            "content": {"type": "code_execution_result", "stdout": "3", "stderr": "",
                        "return_code": 0, "content": []},
        }  # fmt: skip
        messages += [
            {"role": "assistant", "content": [result, {"type": "text", "text": "3 hits."}]},
            {"role": "user", "content": "Thanks."},
        ]
    return messages


def test_programmatic_tool_calling__the_server_tools_result_arrives_in_a_later_response():
    validate_request(body(ptc_history(answered=False), tools=PTC_TOOLS))
    validate_request(body(ptc_history(answered=True), tools=PTC_TOOLS))
    # A server tool use that called nothing is still answered in its own message.
    plain = ptc_history(answered=False)
    plain[1]["content"][1].pop("caller")
    assert "without their result blocks" in refused(body(plain, tools=PTC_TOOLS))


def system(text: str = "Answer in French from now on.") -> dict[str, Any]:
    return {"role": "system", "content": text}


def test_system_messages__accepted_where_the_page_places_them():
    user, answer = {"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}
    again = {"role": "user", "content": "And now?"}
    assert validate_request(body([user, system()])) is None  # ends the array
    assert validate_request(body([user, system(), system("Be brief."), answer, again])) is None


@pytest.mark.parametrize(
    ("messages", "says"),
    [
        ([system(), {"role": "user", "content": "Hi."}], "first"),
        (
            [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."},
             system()],
            "must follow a user message",
        ),
        (
            [{"role": "user", "content": "Hi."}, system(), {"role": "user", "content": "And?"}],
            "must precede an assistant message",
        ),
    ],
    ids=["first", "after an answer", "before a user message"],
)  # fmt: skip
def test_system_messages__refused_elsewhere(messages, says):
    assert says in refused(body(messages))


def test_system_messages__not_on_the_models_the_page_excludes():
    messages = [{"role": "user", "content": "Hi."}, system()]
    assert "Input should be 'user' or 'assistant'" in refused(
        body(messages, model="claude-sonnet-5")
    )
