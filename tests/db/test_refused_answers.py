"""A refused answer never acts (ARCHITECTURE.md invariant 11, issue #36): a response that
streams a tool_use and then ends `stop_reason: "refusal"` runs no tool, its calls close as
not run, the run completes saying so, the refused turn is left out of what the
conversation sends next (the stand-in answers a request that sends it back with another
refusal, as the docs say the API does), and its cost is what the docs bill. Through the
engine, the real `anthropic` SDK and the Messages API stand-in."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from django_agentrun import Agent, send_message, start_conversation, start_run
from django_agentrun.agents import unregister_agent
from django_agentrun.clients.anthropic import AnthropicModelClient
from django_agentrun.testing.messages_api import MessagesAPIServer, Reply, by_step, text, tool_use
from tests.conftest import assert_projection_matches, drive
from tests.factories import by_message
from tests.testapp.agents import executions, lookup

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(60), pytest.mark.one_driver]


@pytest.fixture
def api() -> Iterator[MessagesAPIServer]:
    with MessagesAPIServer(api_key="k") as server:
        yield server


@pytest.fixture
def client(api: MessagesAPIServer) -> Iterator[AnthropicModelClient]:
    client = AnthropicModelClient(base_url=api.base_url, api_key="k", max_retries=0)
    yield client
    client.close()


@pytest.fixture
def agent() -> Iterator[Any]:
    names: list[str] = []

    def define(name: str, **options: Any) -> Agent:
        names.append(name)
        options.setdefault("model", "claude-sonnet-4-6")
        return Agent(name, tools=[lookup], **options)

    yield define
    for name in names:
        unregister_agent(name)


def refused(*content: dict[str, Any], category: str | None = "cyber") -> Reply:
    return Reply(list(content), stop_reason="refusal", stop_details={"category": category})


def test_refusal__after_a_tool_use__runs_no_tool_and_the_next_message_is_accepted(
    api, client, agent, test_log
):
    agent("refused")
    api.script = by_message(
        {
            "Look it up.": [
                refused(text("Looking"), tool_use("lookup", {"query": "x"}, id="toolu_refused"))
            ],
            "Something else.": [Reply([text("Here you are.")])],
        }
    )
    conversation = start_conversation("refused")
    first = send_message(conversation, "Look it up.")
    drive(first, client)

    assert executions("lookup") == []  # the refused answer ran nothing
    assert first.state == "completed" and first.stop_reason == "refusal"
    call = first.tool_calls.get()
    assert (call.state, call.is_error, call.result_source) == ("skipped", True, "synthetic")
    assert "refusal" in str(call.result)
    # Its partial output is discarded; the output says it was refused and left out.
    assert first.output["text"] == "" and first.output["content"] == []
    assert first.output["refusal"]["category"] == "cyber"
    assert first.output["refusal"]["left_out_of_history"] is True
    assert len(api.requests) == 1  # nothing more was asked in that run
    assert_projection_matches(first)

    second = send_message(conversation, "Something else.")
    drive(second, client)
    assert second.state == "completed", (second.state, second.error_message)
    assert second.output["text"] == "Here you are."
    sent = api.bodies[-1]["messages"]
    assert "toolu_refused" not in str(sent) and "Looking" not in str(sent)
    assert [r["status"] for r in api.requests] == [200, 200]
    assert api.requests[-1]["body"]["messages"][0]["role"] == "user"


def test_stand_in__a_refused_turn_sent_again_is_refused_again(api, client, agent):
    """What the docs say the API does with a conversation that was not reset: the stand-in
    answers with another refusal, without asking the script."""
    body = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 100,
        "tools": [lookup.definition()],
        "messages": [{"role": "user", "content": "Look it up."}],
    }
    api.script = by_step([refused(tool_use("lookup", {"query": "x"}, id="toolu_again"))])
    first = client.client.messages.create(**body)
    assert first.stop_reason == "refusal"
    again = {
        **body,
        "messages": [
            *body["messages"],
            {"role": "assistant", "content": [b.model_dump() for b in first.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_again", "content": "x"}],
            },
        ],
    }
    second = client.client.messages.create(**again)
    assert second.stop_reason == "refusal" and second.content == []


@pytest.mark.parametrize(
    ("content", "category", "billed"),
    [
        ((), "cyber", False),  # before any output, a category not billed
        ((), None, False),  # before any output, no category
        ((), "bio", True),  # before any output, a billed category
        ((text("Part"),), "cyber", True),  # mid-stream: input and output streamed
    ],
)
def test_refusal__billed_as_the_docs_say(content, category, billed, api, client, agent):
    agent("refused-bill")
    api.script = by_step([refused(*content, category=category)])
    run = start_run("refused-bill", "Hello.")
    drive(run, client)
    assert run.stop_reason == "refusal"
    assert run.input_tokens > 0  # the usage as the API reported it
    assert (run.cost_usd > Decimal(0)) is billed, run.cost_usd
    assert run.output["refusal"]["billed"] is billed
    assert_projection_matches(run)
