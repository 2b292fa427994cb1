"""The stand-in's server tools, prompt cache and compaction: what it answers (through the
real SDK) and what it refuses the way the real API does."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from django_agentrun import servertools as vocabulary
from django_agentrun.testing.messages_api import (
    APIRequestError,
    MessagesAPIServer,
    Reply,
    by_step,
    compaction_block,
    server_tool_use,
    text,
    validate_request,
    web_search,
)
from django_agentrun.testing.messages_api import servertools as standin
from django_agentrun.testing.messages_api.cache import PromptCache

pytestmark = pytest.mark.timeout(10)

WEB_SEARCH = {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}
OWN = {"name": "lookup", "description": "Look up.", "input_schema": {"type": "object"}}


def body(messages: list[dict[str, Any]], **overrides: Any) -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-6",
        "max_tokens": 64,
        "tools": [OWN, WEB_SEARCH],
        "messages": messages,
        **overrides,
    }


SEARCH = Reply([*web_search("otters", [("https://otters.example", "Otters")]), text("Found.")])
PAIR = SEARCH.blocks()[:2]


def conversation(answer: list[dict[str, Any]], *more: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Find otters."},
        {"role": "assistant", "content": answer},
        *more,
    ]


def refused(request: dict[str, Any], betas: set[str] | None = None) -> str:
    with pytest.raises(APIRequestError) as raised:
        validate_request(request, betas)
    assert raised.value.status == 400
    return raised.value.message


def test_the_standin_knows_the_sdks_server_tools():
    assert standin.SERVER_TOOLS == {k: name for k, (name, _) in vocabulary.SERVER_TOOLS.items()}
    assert standin.RESULT_TYPES == dict(vocabulary.SERVER_RESULT_TYPES)


def test_paired_server_tool_blocks_are_accepted_and_sent_back():
    assert None is validate_request(
        body(conversation([*PAIR, text("Found.")], {"role": "user", "content": "More?"}))
    )


def test_a_server_tool_use_without_its_result_in_the_same_message_is_refused():
    use, result = PAIR
    message = refused(
        body(
            conversation(
                [use, text("Searching.")],
                {"role": "user", "content": "go on"},
                {"role": "assistant", "content": [result]},
                {"role": "user", "content": "and?"},
            )
        )
    )
    assert "messages.1: `server_tool_use` ids were found without their result blocks" in message


def test_a_result_before_its_use_or_of_another_kind_is_refused():
    use, result = PAIR
    assert "does not answer a `server_tool_use`" in refused(
        body(conversation([result, use], {"role": "user", "content": "?"}))
    )
    other = {**result, "type": "web_fetch_tool_result"}
    assert "does not answer a `server_tool_use`" in refused(
        body(conversation([use, other], {"role": "user", "content": "?"}))
    )


def test_the_last_assistant_message_may_hold_an_open_server_tool_use():
    """A turn paused with pause_turn is continued: its content comes back as the last message."""
    assert None is validate_request(body(conversation([PAIR[0]])))


def test_a_server_tool_not_declared_in_the_request_is_refused():
    message = refused(body(conversation([*PAIR], {"role": "user", "content": "?"}), tools=[OWN]))
    assert "a server tool that is not in the request's tools" in message


def test_server_tool_declarations_are_checked():
    assert "does not match any of the expected tags" in refused(
        body(
            [{"role": "user", "content": "hi"}],
            tools=[{"type": "web_search_2099", "name": "web_search"}],
        )
    )
    assert "name: Input should be 'web_search'" in refused(
        body([{"role": "user", "content": "hi"}], tools=[{**WEB_SEARCH, "name": "search"}])
    )
    deferred = {**OWN, "defer_loading": True}
    assert "defer_loading requires a tool search tool" in refused(
        body([{"role": "user", "content": "hi"}], tools=[deferred, WEB_SEARCH])
    )
    search = {"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"}
    validate_request(body([{"role": "user", "content": "hi"}], tools=[deferred, search]))


def test_a_fifth_breakpoint_is_refused_counting_automatic_caching():
    marked = {"type": "ephemeral"}
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": f"p{i}", "cache_control": marked} for i in range(3)
            ],
        }
    ]
    validate_request(
        body(messages, system=[{"type": "text", "text": "S", "cache_control": marked}])
    )
    assert "A maximum of 4 blocks with cache_control may be provided. Found 5." in refused(
        body(
            messages,
            system=[{"type": "text", "text": "S", "cache_control": marked}],
            cache_control=marked,
        )
    )


def test_context_management_needs_its_beta_and_a_compaction_block_comes_back_unchanged():
    compact = {"edits": [{"type": "compact_20260112"}]}
    hello = [{"role": "user", "content": "hi"}]
    assert "requires the anthropic-beta header 'compact-2026-01-12'" in refused(
        body(hello, context_management=compact), betas=set()
    )
    validate_request(body(hello, context_management=compact), {"compact-2026-01-12"})
    block = compaction_block("Earlier: otters.")
    later = conversation([block, text("Go on.")], {"role": "user", "content": "more"})
    validate_request(body(later, context_management=compact))
    assert "Invalid `signature` in `compaction` block" in refused(
        body(
            conversation([{**block, "content": "Changed."}], {"role": "user", "content": "more"}),
            context_management=compact,
        )
    )
    assert "need context_management with a compact_20260112 edit" in refused(body(later))


# --------------------------------------------------------------------------- through the SDK


def test_server_tool_blocks_and_their_usage_through_the_sdk():
    with MessagesAPIServer(by_step([SEARCH]), api_key="k") as api:
        client = anthropic.Anthropic(base_url=api.base_url, api_key="k", max_retries=0)
        with client.messages.stream(**body([{"role": "user", "content": "Find otters."}])) as s:
            message = s.get_final_message()
        client.close()
    assert [b.type for b in message.content] == [
        "server_tool_use",
        "web_search_tool_result",
        "text",
    ]
    assert message.content[0].id.startswith("srvtoolu_")
    assert message.content[1].tool_use_id == message.content[0].id
    assert message.usage.server_tool_use.web_search_requests == 1
    assert message.stop_reason == "end_turn"


def test_an_undeclared_model_refusal_is_a_400_through_the_sdk():
    with MessagesAPIServer(by_step([SEARCH]), api_key="k") as api:
        client = anthropic.Anthropic(base_url=api.base_url, api_key="k", max_retries=0)
        with pytest.raises(anthropic.BadRequestError, match="not in the request's tools"):
            client.messages.create(
                **body(
                    conversation(
                        [server_tool_use("web_search", id="srvtoolu_1")],
                        {"role": "user", "content": "?"},
                    ),
                    tools=[OWN],
                )
            )
        client.close()


def test_compaction_when_due_and_paused_after_it():
    compact = {
        "edits": [
            {
                "type": "compact_20260112",
                "trigger": {"type": "input_tokens", "value": 200},
                "pause_after_compaction": True,
            }
        ]
    }
    long = [{"role": "user", "content": "otters " * 100}]
    with MessagesAPIServer(by_step([Reply("Done."), Reply("Done.")]), api_key="k") as api:
        client = anthropic.Anthropic(base_url=api.base_url, api_key="k", max_retries=0)
        message = client.beta.messages.create(
            **body(long, context_management=compact), betas=["compact-2026-01-12"]
        )
        assert message.stop_reason == "compaction"
        assert [b.type for b in message.content] == ["compaction"]
        block = message.content[0].model_dump(exclude_none=True)
        again = client.beta.messages.create(
            **body([*long, {"role": "assistant", "content": [block]}], context_management=compact),
            betas=["compact-2026-01-12"],
        )
        client.close()
    assert again.stop_reason == "end_turn"  # read from the compaction block on: not due again
    assert [b.type for b in again.content] == ["text"]


# --------------------------------------------------------------------------- the prompt cache

SYSTEM = [{"type": "text", "text": "You are an otter expert. " * 400}]


def cached(messages: list[dict[str, Any]], ttl: str | None = None) -> dict[str, Any]:
    marker = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
    return body(messages, system=SYSTEM, cache_control=marker)


def test_the_cache_reads_what_it_wrote_and_writes_only_the_new_part():
    cache = PromptCache()
    first = cached([{"role": "user", "content": "Find otters."}])
    one = cache.account(first)
    assert one["cache_read_input_tokens"] == 0
    assert one["cache_creation_input_tokens"] > 2000
    assert one["cache_creation"] == {
        "ephemeral_5m_input_tokens": one["cache_creation_input_tokens"],
        "ephemeral_1h_input_tokens": 0,
    }
    second = cached(
        [
            {"role": "user", "content": "Find otters."},
            {"role": "assistant", "content": [text("Which ones?")]},
            {"role": "user", "content": "Sea otters."},
        ]
    )
    two = cache.account(second)
    assert two["cache_read_input_tokens"] == one["cache_creation_input_tokens"]
    assert 0 < two["cache_creation_input_tokens"] < 30  # only the two new messages
    assert two["input_tokens"] <= 4  # the request's own framing: no block at full price


def test_the_cache_keeps_entries_for_their_ttl_and_splits_writes_by_ttl():
    now = [0.0]
    cache = PromptCache(clock=lambda: now[0])
    request = cached([{"role": "user", "content": "Find otters."}], ttl="1h")
    written = cache.account(request)
    assert (
        written["cache_creation"]["ephemeral_1h_input_tokens"]
        == written["cache_creation_input_tokens"]
    )
    now[0] = 3000.0  # past 5 minutes, within the hour
    assert (
        cache.account(request)["cache_read_input_tokens"] == written["cache_creation_input_tokens"]
    )
    now[0] = 3000.0 + 3601
    assert cache.account(request)["cache_read_input_tokens"] == 0


def test_a_prefix_below_the_minimum_is_not_cached():
    cache = PromptCache()
    small = body([{"role": "user", "content": "hi"}], cache_control={"type": "ephemeral"})
    usage = cache.account(small)
    assert usage["cache_creation_input_tokens"] == usage["cache_read_input_tokens"] == 0
    assert usage["input_tokens"] > 0
