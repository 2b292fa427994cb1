"""The cost of a run on each current model equals the sum its responses' usage implies at
that model's prices: cache writes by TTL, cache reads, the price band of a long prompt
and server tool use, through the real SDK and the Messages API stand-in."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal

import pytest

from django_agentrun import Agent, Budget, SideEffect, start_run, tool
from django_agentrun.agents import unregister_agent
from django_agentrun.catalog import shipped_info
from django_agentrun.engine.guards import cost_of, next_turn_cost
from django_agentrun.models import RunEvent
from django_agentrun.testing import drive
from django_agentrun.testing.messages_api import Reply, by_step, text, tool_use

# What the run asks the model (the request's rules), not how its rows are stored: the same on
# any Postgres driver and binding (the store's statements run in the other modules).
pytestmark = [pytest.mark.django_db, pytest.mark.timeout(60), pytest.mark.one_driver]


def current_models() -> list[str]:
    from django_agentrun.catalog import SHIPPED

    return sorted({i.id for i in SHIPPED.values() if i.status == "current"})


@tool(side_effect=SideEffect.READ_ONLY)
def look_up(query: str) -> str:
    """Look something up."""
    return f"found {query}"


# Three responses: each usage shape the API sends.
USAGES = [
    # Cache writes split by TTL, and server tool use.
    {
        "input_tokens": 1_200,
        "output_tokens": 300,
        "cache_creation_input_tokens": 5_000,
        "cache_creation": {"ephemeral_5m_input_tokens": 2_000, "ephemeral_1h_input_tokens": 3_000},
        "cache_read_input_tokens": 0,
        "server_tool_use": {"web_search_requests": 3, "web_fetch_requests": 2},
    },
    # A flat cache write (no split: 5-minute) and a cache read.
    {
        "input_tokens": 800,
        "output_tokens": 200,
        "cache_creation_input_tokens": 700,
        "cache_read_input_tokens": 5_000,
    },
    # A long prompt: 60,000 + 500 + 45,000 = 105,500 tokens, past Haiku 5.5's 100,000 band.
    {
        "input_tokens": 60_000,
        "output_tokens": 1_000,
        "cache_creation_input_tokens": 500,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 500},
        "cache_read_input_tokens": 45_000,
        "server_tool_use": {"web_search_requests": 1, "web_fetch_requests": 0},
    },
]


def implied(model: str, usage: dict) -> Decimal:
    """The usage priced by hand from the table's figures (USD per million tokens)."""
    prices = shipped_info(model).prices
    split = usage.get("cache_creation") or {
        "ephemeral_5m_input_tokens": usage["cache_creation_input_tokens"],
        "ephemeral_1h_input_tokens": 0,
    }
    w5, w1 = split["ephemeral_5m_input_tokens"], split["ephemeral_1h_input_tokens"]
    prompt = usage["input_tokens"] + w5 + w1 + usage["cache_read_input_tokens"]
    for threshold, band in prices.bands:
        if prompt > threshold:
            prices = band
    tools = usage.get("server_tool_use") or {"web_search_requests": 0, "web_fetch_requests": 0}
    total = (
        Decimal(usage["input_tokens"]) * prices.input
        + Decimal(usage["output_tokens"]) * prices.output
        + Decimal(w5) * prices.cache_write_5m
        + Decimal(w1) * prices.cache_write_1h
        + Decimal(usage["cache_read_input_tokens"]) * prices.cache_read
    ) / Decimal(1_000_000) + (
        tools["web_search_requests"] * prices.web_search_per_1k
        + tools["web_fetch_requests"] * prices.web_fetch_per_1k
    ) / Decimal(1000)
    return total.quantize(Decimal("0.000001"), rounding=ROUND_HALF_EVEN)


@pytest.mark.parametrize("model", current_models())
def test_cost__a_run_costs_what_its_usage_implies(model, agentrun_messages_api):
    Agent(name="costly", model=model, tools=[look_up], max_tokens=2048)
    try:
        agentrun_messages_api.script = by_step(
            [
                Reply([tool_use("look_up", {"query": "a"})], usage=USAGES[0]),
                Reply([tool_use("look_up", {"query": "b"})], usage=USAGES[1]),
                Reply([text("Done.")], usage=USAGES[2]),
            ]
        )
        run = drive(start_run("costly", "Find a and b."))
    finally:
        unregister_agent("costly")
    assert run.state == "completed", run.error_message
    expected = [implied(model, u) for u in USAGES]
    assert all(e > 0 for e in expected)
    assert run.cost_usd == sum(expected, Decimal(0))
    # Each response's event keeps the usage as the API reported it, nested fields too,
    # and its cost: recomputing from the record gives the same.
    events = list(RunEvent.objects.filter(run=run, type="model_response").order_by("seq"))
    assert [Decimal(e.payload["cost_usd"]) for e in events] == expected
    for event, usage in zip(events, USAGES, strict=True):
        stored = event.payload["usage"]
        # A scripted write without its TTL split is reported as the API does: 5 minutes.
        split = usage.get("cache_creation") or {
            "ephemeral_5m_input_tokens": usage["cache_creation_input_tokens"],
            "ephemeral_1h_input_tokens": 0,
        }
        assert stored.get("cache_creation") == split
        assert stored.get("server_tool_use") == usage.get("server_tool_use")
        assert cost_of(model, stored) == implied(model, usage)
    # The run's counters keep the flat totals.
    assert run.cache_read_input_tokens == 50_000
    assert run.cache_creation_input_tokens == 6_200


def test_cost__the_band_applies_to_the_whole_request():
    # Haiku 5.5 just under and just over 100,000 prompt tokens: every token of the
    # request (output included) at the band's prices.
    under = {"input_tokens": 100_000, "output_tokens": 1_000}
    over = {"input_tokens": 100_001, "output_tokens": 1_000}
    assert cost_of("claude-haiku-5-5", under) == Decimal("0.010500")  # 0.10 + 0.50
    assert cost_of("claude-haiku-5-5", over) == Decimal(
        "0.052500"
    )  # 0.0500005 + 0.0025, to the micro-dollar (half-even)
    # Sonnet 5.5 has no band.
    assert cost_of("claude-sonnet-5-5", over) == Decimal("0.210002")
    assert cost_of("unknown-model", over) == 0


def test_cost__budget_precheck_uses_the_same_prices(agentrun_messages_api):
    # The pre-check's estimate is priced from the table too: a 1-hour cache write at the
    # band of the prompt is the dearest a prompt token can be.
    assert next_turn_cost("claude-haiku-5-5", 200_000, 1_000) == Decimal("0.2025")
    assert next_turn_cost("claude-opus-5-5", 1_000, 1_000) == Decimal("0.028")
    # A run whose next turn would pass its dollar budget halts before sending it.
    Agent(
        name="thrifty",
        model="claude-opus-5-5",
        tools=[look_up],
        max_tokens=4096,
        budget=Budget(max_cost_usd=0.09),
    )
    try:
        agentrun_messages_api.script = by_step(
            [
                Reply(
                    [tool_use("look_up", {"query": "a"})],
                    usage={"input_tokens": 10_000, "output_tokens": 100},  # $0.042
                ),
                "never asked",
            ]
        )
        run = drive(start_run("thrifty", "Find a."))
    finally:
        unregister_agent("thrifty")
    assert run.cost_usd == Decimal("0.042000")
    assert run.state == "failed" and "max_cost_usd" in run.error_message
    assert agentrun_messages_api.steps() == {0: 1}


def test_cost__a_fork_keeps_the_cost_its_turns_recorded(agentrun_messages_api, admin_user):
    from django_agentrun import fork_run

    model = "claude-opus-5-5"
    Agent(name="costly", model=model, tools=[look_up], max_tokens=2048)
    try:
        agentrun_messages_api.script = by_step(
            [
                Reply([tool_use("look_up", {"query": "a"})], usage=USAGES[0]),
                Reply([tool_use("look_up", {"query": "b"})], usage=USAGES[1]),
                Reply([text("Done.")], usage=USAGES[2]),
            ]
        )
        run = drive(start_run("costly", "Find a and b.", owner=admin_user))
        fork = fork_run(run, at_turn=2, by=admin_user)
    finally:
        unregister_agent("costly")
    # Priced again from the turns' four counters, the 1-hour writes and the searches of
    # the first turn would be lost: the fork keeps what each turn recorded.
    assert fork.cost_usd == implied(model, USAGES[0]) + implied(model, USAGES[1])
    first = RunEvent.objects.filter(run=fork, type="model_response").order_by("seq").first()
    assert first.payload["usage"]["server_tool_use"] == USAGES[0]["server_tool_use"]
