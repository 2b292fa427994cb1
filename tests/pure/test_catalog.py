"""The model table (catalog.py): the shipped entries, what each model refuses, and the
host project's overrides (AGENTRUN_MODELS, the deprecated AGENTRUN_PRICES)."""

from __future__ import annotations

import subprocess
import sys
from decimal import Decimal

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_agentrun import Agent, catalog
from django_agentrun.agents import unregister_agent
from django_agentrun.catalog import SHIPPED, model_info, refusals, shipped_info
from django_agentrun.checks import check_agents

CURRENT = ("claude-fable-5-2", "claude-mythos-5-2", "claude-opus-5-5", "claude-sonnet-5-5")
CURRENT += ("claude-haiku-5-5",)


def test_catalog__importable_without_django_settings():
    # The Messages API stand-in imports it in a process that never configures Django.
    code = (
        "import sys; from django_agentrun.catalog import SHIPPED, refusals;"
        "assert refusals('claude-opus-5-5', {'temperature': 0.2}, shipped_only=True);"
        "assert 'django.conf' not in sys.modules or not __import__('django.conf').conf.settings.configured;"
        "print(len(SHIPPED))"
    )
    env = {"PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert int(out.stdout) >= 19


def test_catalog__every_model_the_sdk_names_is_in_the_table():
    from typing import get_args

    from anthropic.types.model import Model

    (literal, _str) = get_args(Model)
    assert set(get_args(literal)) - set(SHIPPED) == set()
    for model in CURRENT:
        assert SHIPPED[model].status == "current"
    assert shipped_info("claude-opus-4-5-20251101").id == "claude-opus-4-5"
    # A dated id of a shipped alias resolves; a neighbouring model never does.
    assert shipped_info("claude-sonnet-5-5-20261120").id == "claude-sonnet-5-5"
    assert shipped_info("claude-sonnet-5-20261120").id == "claude-sonnet-5"
    assert shipped_info("claude-sonnet-5-9") is None


@pytest.mark.parametrize("model", CURRENT)
def test_catalog__current_models_refuse_budgets_sampling_and_forced_tool_choice(model):
    params = {
        "model": model,
        "max_tokens": 1024,
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "tool_choice": {"type": "any"},
        "temperature": 0.3,
        "top_k": 5,
    }
    found = refusals(model, params)
    assert any("thinking.type 'enabled'" in r for r in found)
    assert f"{model} does not accept tool_choice {{'type': 'any'}}" in found
    assert f"{model} does not accept temperature" in found
    assert f"{model} does not accept top_k" in found
    # What they accept passes: adaptive thinking, an effort level, auto tool choice, the
    # default temperature.
    ok = {
        "model": model,
        "max_tokens": 1024,
        "thinking": {"type": "adaptive", "display": "summarized"},
        "output_config": {"effort": "high", "format": {"type": "json_schema", "schema": {}}},
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        "temperature": 1,
        "tools": [{"type": "web_search_20260318", "name": "web_search"}],
    }
    assert refusals(model, ok) == []


def test_catalog__legacy_models_refuse_what_they_do_not_know():
    haiku = "claude-haiku-4-5"
    assert refusals(haiku, {"thinking": {"type": "enabled", "budget_tokens": 2048}}) == []
    assert refusals(haiku, {"output_config": {"effort": "low"}}) == [
        "claude-haiku-4-5 does not accept output_config.effort"
    ]
    assert refusals(haiku, {"thinking": {"type": "adaptive"}}) == [
        "claude-haiku-4-5 does not accept thinking.type 'adaptive' (accepts: disabled, enabled)"
    ]
    # max on Sonnet 4.6 (effort page); xhigh is newer than the 4.6 models.
    assert refusals("claude-sonnet-4-6", {"output_config": {"effort": "max"}}) == []
    assert refusals("claude-sonnet-4-6", {"output_config": {"effort": "xhigh"}}) == [
        "claude-sonnet-4-6 does not accept output_config.effort 'xhigh' "
        "(accepts: low, medium, high, max)"
    ]
    assert refusals(haiku, {"tools": [{"type": "web_search_20260318", "name": "w"}]}) == [
        "claude-haiku-4-5 does not accept the server tool web_search_20260318"
    ]
    assert refusals(haiku, {"max_tokens": 64_001}) == [
        "claude-haiku-4-5 does not accept max_tokens 64001 (at most 64000)"
    ]
    # Client tools (custom, or client-schema tools) are never judged here.
    assert refusals(haiku, {"tools": [{"name": "lookup", "input_schema": {}}]}) == []
    assert refusals("no-such-model", {"temperature": 0.5}) == []


def test_catalog__haiku_5_5_is_priced_by_prompt_length():
    prices = shipped_info("claude-haiku-5-5").prices
    assert prices.for_prompt(100_000).input == Decimal("0.10")
    long = prices.for_prompt(100_001)
    assert (long.input, long.output, long.cache_write_5m, long.cache_write_1h, long.cache_read) == (
        Decimal("0.50"),
        Decimal("2.50"),
        Decimal("0.625"),
        Decimal("1.00"),
        Decimal("0.05"),
    )
    # The read multiplier differs by model now.
    assert shipped_info("claude-opus-5-5").prices.cache_read == Decimal("0.20")
    assert shipped_info("claude-opus-5").prices.cache_read == Decimal("0.50")


def test_catalog__settings_override_merge_over_the_shipped_entry(settings):
    settings.AGENTRUN_MODELS = {
        "claude-sonnet-5-5": {"sampling": True, "prices": {"output": "12"}},
        "my-proxy-model": {"like": "claude-haiku-5-5", "context_window": 200_000},
    }
    sonnet = model_info("claude-sonnet-5-5")
    assert sonnet.sampling is True and sonnet.prices.output == 12
    assert sonnet.prices.input == 2  # the rest is the shipped entry's
    assert refusals("claude-sonnet-5-5", {"temperature": 0.2}) == []
    assert refusals("claude-sonnet-5-5", {"temperature": 0.2}, shipped_only=True) != []
    mine = model_info("my-proxy-model")
    assert (mine.id, mine.context_window) == ("my-proxy-model", 200_000)
    assert mine.prices.bands == shipped_info("claude-haiku-5-5").prices.bands
    assert catalog.catalog_errors() == []
    assert "my-proxy-model" in catalog.known_models()


@pytest.mark.parametrize(
    "entry, words",
    [
        ({"new-model": {"context_window": 10}}, "give every field, or 'like'"),
        ({"claude-opus-5-5": {"effort": ["extreme"]}}, "effort: unknown value(s) ['extreme']"),
        ({"claude-opus-5-5": {"prices": {"input": "cheap"}}}, "expected a number"),
        ({"claude-opus-5-5": {"prices": {"inptu": 1}}}, "unknown price field(s) ['inptu']"),
        ({"claude-opus-5-5": {"sampling": "yes"}}, "expected true or false"),
        ({"claude-opus-5-5": {"window": 1}}, "unknown field(s) ['window']"),
        ({"x": {"like": "claude-nothing"}}, "is not a model of the shipped table"),
        ({"claude-opus-5-5": "fast"}, "expected a dict"),
    ],
)
def test_catalog__a_bad_override_is_a_clear_error_and_a_check_error(settings, entry, words):
    settings.AGENTRUN_MODELS = entry
    (model,) = entry
    with pytest.raises(ImproperlyConfigured, match="AGENTRUN_MODELS"):
        model_info(model)
    found = check_agents()
    assert [m.id for m in found] == ["agentrun.E020"]
    assert words in found[0].msg


def test_catalog__agentrun_prices_still_works_and_is_deprecated(settings):
    settings.AGENTRUN_PRICES = {
        "claude-opus-5-5": {"input": 3, "output": 15, "cache_write": 3.75, "cache_read": 0.3},
        "house-model": {"input": 1, "output": 2, "cache_write": 1.25, "cache_read": 0.1},
    }
    opus = model_info("claude-opus-5-5")
    assert (opus.prices.input, opus.prices.cache_write_5m, opus.prices.cache_write_1h) == (
        3,
        Decimal("3.75"),
        6,  # no 1-hour price before: 2 x input, the API's rule
    )
    assert opus.forced_tool_choice is False  # capabilities stay the table's
    assert model_info("house-model").prices.output == 2
    assert [m.id for m in check_agents()] == ["agentrun.W021"]


def test_checks__unknown_model_warns_and_refused_options_fail():
    Agent(name="unknown-model", model="claude-typo-5-5")
    Agent(name="too-long", model="claude-haiku-4-5", max_tokens=100_000)
    try:
        found = {m.id: m for m in check_agents()}
        assert set(found) == {"agentrun.W020", "agentrun.E021"}
        assert "claude-typo-5-5" in found["agentrun.W020"].msg
        assert (
            found["agentrun.E021"].msg == "Agent 'too-long': claude-haiku-4-5 does not accept "
            "max_tokens 100000 (at most 64000); its runs would fail with a 400."
        )
    finally:
        unregister_agent("unknown-model")
        unregister_agent("too-long")


def test_checks__default_model_is_current():
    from django_agentrun.conf import agentrun_settings

    assert shipped_info(agentrun_settings.DEFAULT_MODEL).status == "current"
