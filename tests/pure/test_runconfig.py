"""RunConfig: a run's configuration as the code reads it, frozen, with the defaults applied
once where it is built from the stored form (Run.config) or from an agent."""

from __future__ import annotations

import dataclasses

import pytest

from django_agentrun import Agent
from django_agentrun.agents import agent_request_params
from django_agentrun.conf import agentrun_settings
from django_agentrun.runconfig import RunConfig


def test_runconfig__frozen_and_built_from_the_agent_its_options_and_the_table():
    agent = Agent(
        "runconfig-agent",
        model="claude-sonnet-5-5",
        system="Be brief.",
        max_turns=3,
        effort="low",
        register=False,
    )
    config = agent.run_config({"effort": "high"})
    assert config == RunConfig.of(agent.snapshot({"effort": "high"}))
    assert (config.model, config.max_turns, config.system) == ("claude-sonnet-5-5", 3, "Be brief.")
    assert config.options["output_config"] == {"effort": "high"}
    assert config.system_blocks == [{"type": "text", "text": "Be brief."}]
    assert config.max_tokens == agentrun_settings.DEFAULT_MAX_TOKENS
    assert agent_request_params(agent) == agent_request_params(agent.snapshot())
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_turns = 10  # type: ignore[misc]


def test_runconfig__the_defaults_of_a_snapshot_that_lacks_them(settings):
    settings.AGENTRUN_DEFAULT_MAX_TURNS = 7
    config = RunConfig.of({"model": "claude-haiku-5-5", "max_tokens": 0})
    assert config.max_turns == 7
    assert config.max_tokens == agentrun_settings.DEFAULT_MAX_TOKENS
    assert config.max_tool_calls_per_turn == agentrun_settings.DEFAULT_MAX_TOOL_CALLS_PER_TURN
    assert (config.repeat_threshold, config.repeat_window) == (
        agentrun_settings.REPEAT_THRESHOLD,
        agentrun_settings.REPEAT_WINDOW,
    )
    assert (config.prompt_caching, config.cache_ttl, config.system_blocks) == (True, "5m", [])
    assert (config.tools, config.options, config.budget, config.output_format) == ([], {}, {}, None)
    # The agent's time limit: said by a snapshot (even as None), or not said at all.
    assert not config.deadline_snapshotted
    assert RunConfig.of({"deadline_seconds": None}).deadline_snapshotted
    assert RunConfig.of(None) == RunConfig.of({})
