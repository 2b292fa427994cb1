"""The stand-in checks the request options as the real API does (through the real SDK):
their shapes, what the requested model refuses (the shipped model table), a strict format
schema; and answers with structured output, stop_details and thinking token counts."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from django_agentrun.abort import AbortSignal
from django_agentrun.clients.anthropic import AnthropicModelClient
from django_agentrun.clients.base import ModelRequest
from django_agentrun.testing.messages_api import MessagesAPIServer, Reply, text

CURRENT = "claude-sonnet-5-5"
SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["n"],
    "additionalProperties": False,
}


@pytest.fixture
def api() -> Iterator[MessagesAPIServer]:
    with MessagesAPIServer(lambda body: Reply("ok")) as server:
        yield server


@pytest.fixture
def sdk(api) -> Iterator[anthropic.Anthropic]:
    client = anthropic.Anthropic(base_url=api.base_url, api_key="test", max_retries=0)
    yield client
    client.close()


def create(sdk: anthropic.Anthropic, **params: Any) -> Any:
    params.setdefault("model", CURRENT)
    params.setdefault("max_tokens", 2000)
    params.setdefault("messages", [{"role": "user", "content": "hi"}])
    return sdk.messages.create(**params)


def refused(sdk: anthropic.Anthropic, **params: Any) -> str:
    with pytest.raises(anthropic.BadRequestError) as caught:
        create(sdk, **params)
    return caught.value.body["error"]["message"]


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"thinking": {"type": "sometimes"}}, "thinking: Input tag"),
        ({"thinking": {"type": "adaptive", "display": "loud"}}, "thinking.adaptive.display"),
        ({"output_config": {"effort": "extreme"}}, "output_config.effort: Input should be"),
        ({"output_config": {"verbosity": 1}}, "output_config.verbosity: Extra inputs"),
        ({"service_tier": "priority"}, "service_tier: Input should be 'auto' or 'standard_only'"),
        ({"metadata": {"user_id": "x" * 300}}, "metadata.user_id: String should have at most 256"),
        (
            {"output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
            "'additionalProperties' must be explicitly set to false",
        ),
        (
            {"output_config": {"format": {"type": "json_schema", "schema": {"type": "string"}}}},
            "the root schema must have type 'object'",
        ),
        (
            {
                "output_config": {
                    "format": {
                        "type": "json_schema",
                        "schema": {
                            "type": "object",
                            "properties": {"inner": {"type": "object"}},
                            "additionalProperties": False,
                        },
                    }
                }
            },
            "schema.properties.inner: For 'object' type",
        ),
        (
            {
                "tools": [
                    {
                        "name": "t",
                        "strict": True,
                        "input_schema": {"type": "object", "properties": {}},
                    }
                ]
            },
            "tools.0.custom.input_schema: For 'object' type",
        ),
    ],
)
def test_option__bad_shape_refused(sdk, params, says):
    assert says in refused(sdk, **params)


@pytest.mark.parametrize(
    ("model", "params", "says"),
    [
        ("claude-haiku-4-5", {"output_config": {"effort": "high"}}, "output_config.effort"),
        ("claude-haiku-4-5", {"thinking": {"type": "adaptive"}}, "thinking.type 'adaptive'"),
        ("claude-opus-5-5", {"thinking": {"type": "disabled"}}, "thinking.type 'disabled'"),
        (
            CURRENT,
            {
                "tools": [{"name": "t", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "any"},
            },
            "tool_choice",
        ),
    ],
)
def test_option__the_requested_model_refuses(sdk, model, params, says):
    message = refused(sdk, model=model, **params)
    assert model in message and says in message


def test_thinking__manual_with_a_forced_tool_choice_refused(sdk):
    message = refused(
        sdk,
        model="claude-haiku-4-5",
        max_tokens=4000,
        thinking={"type": "enabled", "budget_tokens": 2000},
        tools=[{"name": "t", "input_schema": {"type": "object"}}],
        tool_choice={"type": "tool", "name": "t"},
    )
    assert "Thinking may not be enabled when tool_choice forces tool use" in message


def test_thinking__adaptive_with_a_forced_tool_choice_accepted(api, sdk):
    """Only manual thinking refuses forced tool use: "Adaptive thinking, including on models
    where thinking is on by default, supports forced tool use" (the thinking page)."""
    api.script = lambda body: Reply([{"type": "tool_use", "name": "t", "input": {}}])
    answer = sdk.messages.create(
        model="claude-opus-4-6",
        max_tokens=64,
        messages=[{"role": "user", "content": "Use t."}],
        thinking={"type": "adaptive"},
        tools=[{"name": "t", "input_schema": {"type": "object"}}],
        tool_choice={"type": "tool", "name": "t"},
    )
    assert answer.stop_reason == "tool_use"


def test_thinking__a_budget_below_max_tokens(sdk):
    message = refused(
        sdk,
        model="claude-sonnet-4-6",
        max_tokens=2000,
        thinking={"type": "enabled", "budget_tokens": 4000},
    )
    assert "`max_tokens` must be greater than `thinking.budget_tokens`" in message


def test_options__accepted_when_well_formed(api, sdk):
    api.script = lambda body: Reply(output={"n": 3, "tags": ["a"]})
    message = create(
        sdk,
        thinking={"type": "adaptive", "display": "omitted"},
        output_config={"effort": "low", "format": {"type": "json_schema", "schema": SCHEMA}},
        service_tier="standard_only",
        metadata={"user_id": "0123abcd"},
        stop_sequences=["END"],
        system=[{"type": "text", "text": "Terse."}],
    )
    assert message.content[0].text == '{"n": 3, "tags": ["a"]}'
    assert api.bodies[0]["output_config"]["effort"] == "low"


def test_structured_output__a_script_that_breaks_the_schema_is_a_broken_script(api, sdk):
    api.script = lambda body: Reply(output={"n": "three"})
    fmt = {"type": "json_schema", "schema": SCHEMA}
    message = refused(sdk, output_config={"format": fmt})
    assert "ScriptBreaksFormat" in message and "$.n: should be of type integer" in message
    api.script = lambda body: Reply("not json")
    assert "not JSON" in refused(sdk, output_config={"format": fmt})
    # Cut off at max_tokens, an answer may break it (as the real one may).
    api.script = lambda body: Reply('{"n": ', stop_reason="max_tokens")
    assert create(sdk, output_config={"format": fmt}).stop_reason == "max_tokens"


def test_refusal__stop_details_and_the_model_that_answered(api):
    api.script = lambda body: Reply(
        [text("I can't help with that.")],
        stop_reason="refusal",
        stop_details={"category": "bio", "explanation": "Dangerous lab methods."},
        model="claude-opus-5-5",
    )
    client = AnthropicModelClient(base_url=api.base_url, api_key="test", max_retries=0)
    try:
        request = ModelRequest(
            model=CURRENT, messages=[{"role": "user", "content": "hi"}], max_tokens=100
        )
        response = client.create(request, abort=AbortSignal())  # streamed
        message = client.client.messages.create(  # JSON
            model=CURRENT, max_tokens=100, messages=[{"role": "user", "content": "hi"}]
        )
    finally:
        client.close()
    assert response.stop_reason == "refusal" and response.model == "claude-opus-5-5"
    assert response.stop_details == {
        "type": "refusal",
        "category": "bio",
        "explanation": "Dangerous lab methods.",
    }
    assert message.stop_details is not None and message.stop_details.category == "bio"


def test_thinking__tokens_counted_and_redacted_data_never_in_the_deltas(api):
    api.script = lambda body: Reply(
        [
            {"type": "thinking", "thinking": "Let me think about this carefully." * 4},
            {"type": "redacted_thinking", "data": "ENCRYPTED-REASONING"},
            text("Answer."),
        ]
    )
    deltas: list[dict] = []
    client = AnthropicModelClient(base_url=api.base_url, api_key="test", max_retries=0)
    try:
        request = ModelRequest(
            model=CURRENT,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2000,
            options={"thinking": {"type": "adaptive", "display": "summarized"}},
            on_event=deltas.append,
        )
        response = client.create(request, abort=AbortSignal())
    finally:
        client.close()
    assert api.bodies[0]["thinking"] == {"type": "adaptive", "display": "summarized"}
    assert 0 < response.thinking_tokens <= response.usage.output_tokens
    sealed = response.content[1]["data"]
    assert response.content[1]["type"] == "redacted_thinking"
    assert sealed not in str(deltas) and "ENCRYPTED" not in str(deltas)
    kinds = [(d["kind"], d.get("block")) for d in deltas if d["kind"] == "block_start"]
    assert kinds == [
        ("block_start", "thinking"),
        ("block_start", "redacted_thinking"),
        ("block_start", "text"),
    ]
    thinking = "".join(d["thinking"] for d in deltas if d["kind"] == "thinking")
    answer = "".join(d["text"] for d in deltas if d["kind"] == "text")
    assert thinking.startswith("Let me think") and answer == "Answer."


def test_stand_in__imports_without_django_settings():
    code = (
        "import sys; from django_agentrun.testing.messages_api import validate_request, "
        "APIRequestError\n"
        "try:\n"
        "    validate_request({'model': 'claude-haiku-4-5', 'max_tokens': 5, 'messages': "
        "[{'role': 'user', 'content': 'x'}], 'output_config': {'effort': 'low'}})\n"
        "except APIRequestError as e: print(e.message)\n"
        "print('django' in sys.modules and 'settings-configured'"
        " if 'django.conf' in sys.modules else 'no django.conf')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={}
    ).stdout
    assert "claude-haiku-4-5 does not accept output_config.effort" in out
