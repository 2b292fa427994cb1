"""The governor spends what the API counts against input tokens per minute (issue #36): the
tokens after the last cache breakpoint (tools included) and those up to it the cache does
not hold, learned from the run's previous answer; not the whole cached prefix. A tool loop
under a 150k-token cached prefix is not held back, through the engine, the real `anthropic`
SDK, the Messages API stand-in (which reports the input-tokens limit and bills its prompt
cache) and the governor in a real Redis."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from django_agentrun import Agent, start_run
from django_agentrun.agents import unregister_agent
from django_agentrun.clients import governor as gov
from django_agentrun.clients.anthropic import AnthropicModelClient
from django_agentrun.engine import Outcome
from django_agentrun.testing.messages_api import (
    AccountLimit,
    MessagesAPIServer,
    Reply,
    by_step,
    text,
    tool_use,
)
from tests.conftest import drive
from tests.testapp.agents import lookup

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.timeout(60),
    pytest.mark.one_driver,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

PREFIX = "You answer questions about the archive. " * 15_000  # about 150k tokens


@pytest.fixture
def redis_url(settings) -> str:
    import redis

    url = os.environ.get("AGENTRUN_TEST_BROKER_URL") or "redis://127.0.0.1:6379/9"
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    except redis.RedisError:
        pytest.skip("no Redis")
    settings.AGENTRUN_GOVERNOR_URL = url
    settings.AGENTRUN_GOVERNOR_MAX_WAIT_SECONDS = 0.5
    return url


@pytest.fixture
def agent() -> Iterator[Any]:
    name = f"archivist-{uuid.uuid4().hex[:8]}"
    yield Agent(name, model="claude-sonnet-4-6", system=PREFIX, tools=[lookup], max_turns=8)
    unregister_agent(name)


def test_estimate__what_counts_against_itpm():
    tools = [lookup.definition()]
    system = [{"type": "text", "text": PREFIX, "cache_control": {"type": "ephemeral"}}]
    messages = [
        {"role": "user", "content": "Find it."},
        {"role": "assistant", "content": [tool_use("lookup", {"query": "a"}, id="toolu_1")]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "found"}],
        },
    ]
    params = {"tools": tools, "system": system, "messages": messages}
    cold = gov.estimate_input_tokens(params)
    assert cold >= len(PREFIX) // 4  # nothing known cached: all of it counts
    tools_only = gov.estimate_input_tokens({"tools": tools, "messages": messages[:1]})
    assert tools_only > gov.estimate_input_tokens({"messages": messages[:1]})  # tools count
    previous = {
        "input_tokens": 10,
        "cache_creation_input_tokens": len(PREFIX) // 4 + 20,
        "cache_read_input_tokens": 0,
    }
    warm = gov.estimate_input_tokens(
        {**params, "cache_control": {"type": "ephemeral"}}, {"previous": previous}
    )
    assert warm < 1_000, warm  # the cached prefix is read, not counted


def test_governor__a_150k_token_cached_prefix_is_not_held_back(redis_url, agent):
    limit = AccountLimit(50, input_tokens_per_minute=200_000)
    steps = [Reply([tool_use("lookup", {"query": f"q{i}"})]) for i in range(4)]
    with MessagesAPIServer(by_step([*steps, Reply([text("Found.")])]), rate_limit=limit) as api:
        client = AnthropicModelClient(base_url=api.base_url, api_key="test-key", max_retries=0)
        try:
            run = start_run(agent.name, "Find it.")
            outcomes = drive(run, client, limit=1)
        finally:
            client.close()
    assert outcomes == [Outcome.FINISHED], (outcomes, run.state)
    assert run.state == "completed" and len(api.requests) == 5
    assert run.cache_read_input_tokens > 4 * 140_000  # the prefix was read, turn after turn
