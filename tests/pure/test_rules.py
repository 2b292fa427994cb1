"""The model rules (catalog/rules.py): each documented combination refused by the stand-in
through the real SDK and by the app before a run (run_config: what start_run, a fork and a
conversation apply), every combination the app builds accepted by the stand-in unless the
app refused it first, and a property test over random Agent option sets."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_agentrun import Agent, tool
from django_agentrun.agents import agent_request_params
from django_agentrun.catalog import RULES, SHIPPED, refusals
from django_agentrun.catalog.rules import BY_KEY, readme_table, unsourced_values
from django_agentrun.engine.guards import cost_of, next_turn_cost
from django_agentrun.exceptions import ConfigurationError, InvalidOption, OptionRefused
from django_agentrun.services.runs import run_config
from django_agentrun.testing.messages_api import MessagesAPIServer, Reply

ROOT = Path(__file__).resolve().parents[2]
MODELS = sorted({info.id for info in SHIPPED.values()})
EFFORTS = (None, "low", "medium", "high", "xhigh", "max")
UP_TO_HIGH = (None, "low", "medium", "high")


@pytest.fixture(scope="module")
def api() -> Iterator[MessagesAPIServer]:
    with MessagesAPIServer(lambda body: Reply("ok")) as server:
        yield server


@pytest.fixture(scope="module")
def sdk(api) -> Iterator[anthropic.Anthropic]:
    client = anthropic.Anthropic(base_url=api.base_url, api_key="test", max_retries=0)
    yield client
    client.close()


def send(sdk: anthropic.Anthropic, params: dict[str, Any]) -> str | None:
    """The stand-in's refusal of a request with `params` (None: accepted, 200)."""
    body = {"messages": [{"role": "user", "content": "hi"}], **params}
    body.setdefault("max_tokens", 2000)
    try:
        with warnings.catch_warnings():  # the SDK warns of its deprecated models' end of life
            warnings.simplefilter("ignore", DeprecationWarning)
            sdk.messages.create(**body, timeout=30)
    except anthropic.BadRequestError as exc:
        return exc.body["error"]["message"]
    return None


@tool(side_effect="read_only")
def lookup(query: str) -> str:
    """Look something up."""
    return query


def agent(model: str, **options: Any) -> Agent:
    return Agent(name="rules", model=model, register=False, tools=[lookup], **options)


def app_refuses(a: Agent, options: dict[str, Any] | None = None) -> str | None:
    try:
        run_config(a, None, options)
    except OptionRefused as exc:
        return str(exc)
    return None


# ---- the documented combinations, written out from the docs (an oracle apart from the table)


def documented(model: str, thinking: str, effort: str | None) -> bool:
    """Whether the docs say `model` accepts thinking.type `thinking` at `effort`:
    What's new in Claude Sonnet 5.5 / Opus 5.5 (Opus 5 and Fable 5.1 there too); Haiku 5.5
    from third-party pages quoting its model page (UNSOURCED in the stored docs)."""
    if model == "claude-sonnet-5-5":
        return thinking == "adaptive" or (thinking == "between_tools" and effort in UP_TO_HIGH)
    if model in ("claude-opus-5-5", "claude-fable-5-1"):
        return thinking == "adaptive"
    if model in ("claude-opus-5", "claude-haiku-5-5"):
        return thinking == "adaptive" or (thinking == "disabled" and effort in UP_TO_HIGH)
    raise AssertionError(model)


COUPLED = [
    (model, thinking, effort)
    for model in (
        "claude-sonnet-5-5",
        "claude-opus-5-5",
        "claude-fable-5-1",
        "claude-opus-5",
        "claude-haiku-5-5",
    )
    for thinking in ("adaptive", "disabled", "between_tools")
    for effort in EFFORTS
]


@pytest.mark.parametrize(("model", "thinking", "effort"), COUPLED)
def test_rules__thinking_x_effort_as_the_docs_say(sdk, model, thinking, effort):
    params: dict[str, Any] = {"model": model, "thinking": {"type": thinking}}
    if effort is not None:
        params["output_config"] = {"effort": effort}
    said = send(sdk, params)
    predicted = refusals(model, params, shipped_only=True)
    if documented(model, thinking, effort):
        assert (said, predicted) == (None, [])
    else:
        assert said is not None and predicted, (said, predicted)
        assert model in said and thinking in said


def test_rules__sonnet_5_5_refuses_disabled_pointing_to_between_tools(sdk):
    said = send(sdk, {"model": "claude-sonnet-5-5", "thinking": {"type": "disabled"}})
    assert said is not None
    assert '"thinking.type.disabled" is not supported for this model' in said
    assert "between_tools" in said


def test_rules__between_tools_takes_no_display(sdk):
    said = send(
        sdk,
        {"model": "claude-sonnet-5-5", "thinking": {"type": "between_tools", "display": "omitted"}},
    )
    assert said == "thinking.between_tools.display: Extra inputs are not permitted"


@pytest.mark.parametrize("model", ["claude-sonnet-5-5", "claude-opus-5-5", "claude-fable-5-1"])
def test_rules__forced_tool_choice_refused_by_the_5_5_generation(sdk, model):
    tools = [{"name": "t", "input_schema": {"type": "object"}}]
    for choice in ({"type": "any"}, {"type": "tool", "name": "t"}):
        said = send(sdk, {"model": model, "tools": tools, "tool_choice": choice})
        assert said is not None and "tool_choice" in said and model in said
    a = agent(model, tool_choice="any")
    refused = app_refuses(a)
    assert refused is not None and "tool_choice" in refused and model in refused


def test_rules__sonnet_4_6_window_output_and_max_effort(sdk):
    params = {"model": "claude-sonnet-4-6", "max_tokens": 128_000}
    assert send(sdk, {**params, "output_config": {"effort": "max"}}) is None
    assert send(sdk, {**params, "max_tokens": 128_001}) is not None
    assert send(sdk, {**params, "output_config": {"effort": "xhigh"}}) is not None


def test_rules__max_tokens_zero_fills_the_cache_and_answers_nothing(sdk):
    answer = sdk.messages.create(
        model="claude-sonnet-5-5", max_tokens=0, messages=[{"role": "user", "content": "hi"}]
    )
    assert (answer.content, answer.stop_reason, answer.usage.output_tokens) == (
        [],
        "max_tokens",
        0,
    )
    assert send(sdk, {"model": "claude-sonnet-5-5", "max_tokens": -1}) is not None


def test_rules__inference_geo_reported_and_refused_before_opus_4_6(sdk):
    answer = sdk.messages.create(
        model="claude-sonnet-5-5",
        max_tokens=100,
        inference_geo="us",
        messages=[{"role": "user", "content": "hi"}],
    )
    assert answer.usage.inference_geo == "us"
    said = send(sdk, {"model": "claude-haiku-4-5", "inference_geo": "us"})
    assert said is not None and "inference_geo" in said
    assert send(sdk, {"model": "claude-sonnet-5-5", "inference_geo": "eu"}) is not None


def test_cost__us_only_inference_bills_1_1x():
    usage = {"input_tokens": 1_000_000, "output_tokens": 100_000}
    standard = cost_of("claude-sonnet-5-5", usage)
    assert standard == Decimal("3")  # $2 input + $1 output
    assert cost_of("claude-sonnet-5-5", {**usage, "inference_geo": "us"}) == Decimal("3.3")
    assert cost_of("claude-sonnet-5-5", {**usage, "inference_geo": "global"}) == standard
    # The budget's projection of the next turn too, once a run's answers say "us".
    projected = next_turn_cost("claude-sonnet-5-5", 1000, 1000)
    assert next_turn_cost("claude-sonnet-5-5", 1000, 1000, us_only=True) == projected * Decimal(
        "1.1"
    )


# ---- what the app builds ----------------------------------------------------------------


def test_agent__default_options_are_valid_on_the_default_model(sdk):
    a = Agent(name="plain", register=False)
    config = run_config(a)
    assert config["model"] == "claude-sonnet-5-5"
    assert send(sdk, agent_request_params(config)) is None


def test_agent__thinking_off_is_what_each_model_takes(sdk):
    # Sonnet 5.5 refuses "disabled": its lowest setting is sent instead, and accepted.
    params = agent_request_params(run_config(agent("claude-sonnet-5-5", thinking="off")))
    assert params["thinking"] == {"type": "between_tools"}
    assert send(sdk, params) is None
    # Opus 5: "disabled", at effort high or below.
    params = agent_request_params(run_config(agent("claude-opus-5", thinking="off")))
    assert params["thinking"] == {"type": "disabled"}
    refused = app_refuses(agent("claude-opus-5", thinking="off", effort="max"))
    assert refused is not None
    assert "claude-opus-5" in refused and "'disabled'" in refused and "'max'" in refused
    # Opus 5.5: thinking cannot be off; the refusal names the alternative.
    refused = app_refuses(agent("claude-opus-5-5", thinking="off"))
    assert refused is not None and "claude-opus-5-5" in refused and 'effort="low"' in refused


def test_agent__between_tools_at_xhigh_is_refused_before_the_run(sdk):
    a = agent("claude-sonnet-5-5", thinking="between_tools", effort="xhigh")
    refused = app_refuses(a)
    assert refused is not None
    assert "'between_tools'" in refused and "'xhigh'" in refused and "claude-sonnet-5-5" in refused
    # A run's own options are checked the same way.
    b = agent("claude-sonnet-5-5", thinking="between_tools")
    assert app_refuses(b) is None
    assert app_refuses(b, {"effort": "max"}) is not None
    assert app_refuses(b, {"effort": "medium"}) is None


COMBINATIONS = [
    (model, thinking, effort, display)
    for model in MODELS
    for thinking in (None, "adaptive", "between_tools", "off")
    for effort in EFFORTS
    for display in (None, "summarized", "omitted")
    if display is None or thinking == "adaptive"  # else the Agent refuses it where defined
]


@pytest.mark.parametrize(("model", "thinking", "effort", "display"), COMBINATIONS)
def test_agent__every_combination_refused_before_or_accepted_by_the_stand_in(
    sdk, model, thinking, effort, display
):
    a = agent(model, thinking=thinking, effort=effort, thinking_display=display)
    refused = app_refuses(a)
    if refused is None:
        # Built by the app and not refused: the stand-in (the API's rules) accepts it.
        assert send(sdk, agent_request_params(a)) is None
    else:
        # Refused before the run: the stand-in refuses what it would have sent.
        assert send(sdk, agent_request_params(a)) is not None


OPTION_SETS = st.fixed_dictionaries(
    {
        "model": st.sampled_from(MODELS),
        "max_tokens": st.sampled_from([None, 1000, 64_000, 64_001, 128_000, 128_001]),
        "thinking": st.sampled_from([None, "adaptive", "between_tools", "off"]),
        "thinking_display": st.sampled_from([None, "summarized", "omitted"]),
        "effort": st.sampled_from(EFFORTS),
        "tool_choice": st.sampled_from([None, "auto", "none", "any"]),
        "parallel_tool_use": st.sampled_from([None, True, False]),
        "service_tier": st.sampled_from([None, "auto", "standard_only"]),
        "stop_sequences": st.sampled_from([None, ["END"]]),
    }
)
RUN_OPTION_SETS = st.fixed_dictionaries(
    {},
    optional={
        "effort": st.sampled_from(EFFORTS[1:]),
        "thinking": st.sampled_from(["adaptive", "between_tools", "off"]),
    },
)


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,  # the same examples on every run: a suite that never flakes
    suppress_health_check=[HealthCheck.too_slow],
)
@given(options=OPTION_SETS, run_options=RUN_OPTION_SETS)
def test_property__no_stand_in_refusal_of_a_request_the_app_built(sdk, options, run_options):
    """Random Agent option sets (and run options over them): a request the app builds and
    does not refuse is accepted by the stand-in; every refusal the app predicts is refused
    at start_run's check (run_config) and by the stand-in."""
    chosen = {k: v for k, v in options.items() if v is not None}
    try:
        a = Agent(name="prop", register=False, tools=[lookup], **chosen)
        a.snapshot(run_options)
    except (ConfigurationError, InvalidOption):
        return  # refused where it is defined (a bad value, not a model rule)
    config = a.snapshot(run_options)
    params = agent_request_params(config)
    predicted = refusals(config["model"], params)
    refused = app_refuses(a, run_options or None)
    assert bool(refused) == bool(predicted), (refused, predicted)
    said = send(sdk, params)
    if predicted:
        assert said is not None, params
    else:
        assert said is None, (params, said)


# ---- the rules as data ------------------------------------------------------------------


def test_rules__each_names_its_sources_or_says_unsourced():
    keys = [rule.key for rule in RULES]
    assert len(keys) == len(set(keys))
    for rule in RULES:
        assert all(re.match(r"https://[a-z.]+/", url) for url in rule.sources), rule.key
    unsourced = {rule.key for rule in RULES if rule.unsourced}
    assert unsourced == {
        "thinking_x_effort_haiku_5_5",
        "forced_tool_choice_haiku_5_5",
        "display_x_effort",
        "server_tools",
        "cache_minimum",
    }


def test_rules__each_says_what_it_rests_on():
    """Official pages are Anthropic's own (or its platform's AWS pages); a third-party page
    is named as such; a rule with neither says UNSOURCED (issue #36)."""
    official = re.compile(r"https://(platform|docs)\.(claude|anthropic)\.com/|https://docs\.aws\.")
    for rule in RULES:
        assert all(official.match(url) for url in rule.sources), rule.key
        assert not any(official.match(url) for url in rule.third_party), rule.key
        assert rule.basis == (
            "official" if rule.sources else "third-party" if rule.third_party else "UNSOURCED"
        )
    table = readme_table()
    deprecated = next(r for r in RULES if r.key == "model_deprecated")
    assert f"third-party: [{deprecated.third_party[0].split('//')[1].split('/')[0]}]" in table
    assert BY_KEY["thinking_x_tool_choice"].basis == "official"
    assert BY_KEY["forced_tool_choice_haiku_5_5"].basis == "UNSOURCED"


def test_readme__the_refusals_table_is_generated_from_the_rules():
    # The table lives on the docs site's reference page of the model table (was the README).
    readme = (ROOT / "docs" / "reference" / "models.md").read_text()
    found = re.search(r"<!-- rules-table:[^\n]*-->\n(.*?)<!-- /rules-table -->", readme, re.S)
    assert found, "README lost its rules table markers"
    assert found.group(1) == readme_table(), "README table out of date: paste readme_table()"
    for rule in RULES:
        if rule.unsourced:
            assert f"| `{rule.key}` |" in found.group(1) and "UNSOURCED" in found.group(1)
    values = re.search(
        r"<!-- unsourced-values:[^\n]*-->\n(.*?)<!-- /unsourced-values -->", readme, re.S
    )
    assert values and values.group(1) == unsourced_values(SHIPPED)
    assert "`claude-haiku-5-5`: `cache_min_tokens`, `effort_by_thinking`" in values.group(1)


def test_overrides__a_project_corrects_a_coupling(settings):
    """AGENTRUN_MODELS merges the couplings like any other field (agentrun_models --json
    prints them in the same shape)."""
    params = {"thinking": {"type": "between_tools"}, "output_config": {"effort": "medium"}}
    assert refusals("claude-sonnet-5-5", params) == []
    settings.AGENTRUN_MODELS = {
        "claude-sonnet-5-5": {"effort_by_thinking": {"between_tools": ["low"]}, "unsourced": []}
    }
    assert refusals("claude-sonnet-5-5", params) == [
        "claude-sonnet-5-5 does not accept thinking.type 'between_tools' at output_config.effort "
        "'medium' (only at low)"
    ]
    assert refusals("claude-sonnet-5-5", params, shipped_only=True) == []
