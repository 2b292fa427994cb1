"""What the Messages API refuses, as data: one `Rule` per request rule the app and the
stand-in apply, with the documentation pages it comes from (`sources`; none: UNSOURCED, the
stored docs do not say) and what the app does about it. `refusals` applies the per-model
rules to one request's params, reading each model's entry (table.py) for its values.

Both sides read these: the app before a run starts (manage.py check, start_run, a fork, a
conversation message) and the Messages API stand-in on every request, so a refusal the app
predicts is the refusal the stand-in makes. docs/reference/models.md "What the API refuses, and what the app
does about it" is generated from RULES (tests/pure/test_rules.py keeps it in step).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .vocabulary import EFFORT_LEVELS, SERVER_TOOL_PREFIXES, ModelInfo

SONNET_5_5 = "https://platform.claude.com/docs/en/models/sonnet-5-5/whats-new-sonnet-5-5"
OPUS_5_5 = "https://platform.claude.com/docs/en/models/opus-5-5/whats-new-opus-5-5"
MODELS = "https://platform.claude.com/docs/en/about-claude/models/overview"
SONNET_4_6 = "https://platform.claude.com/docs/en/models/sonnet-4-6/overview"
EFFORT = "https://platform.claude.com/docs/en/build-with-claude/effort"
THINKING = "https://platform.claude.com/docs/en/build-with-claude/thinking"
CACHING = "https://platform.claude.com/docs/en/build-with-claude/prompt-caching"
RESIDENCY = "https://platform.claude.com/docs/en/build-with-claude/data-residency"
PRICING = "https://platform.claude.com/docs/en/about-claude/pricing"
CREATE = "https://platform.claude.com/docs/en/api/messages/create"
DEPRECATIONS = "https://platform.claude.com/docs/en/about-claude/model-deprecations"
SONNET_4_5 = "https://platform.claude.com/docs/en/models/sonnet-4-5/overview"
REFUSALS = "https://platform.claude.com/docs/en/build-with-claude/refusals-and-fallback"
STREAMING_REFUSALS = (
    "https://platform.claude.com/docs/en/test-and-evaluate/strengthen-guardrails/"
    "handle-streaming-refusals"
)
RATE_LIMITS = "https://platform.claude.com/docs/en/api/rate-limits"
DEFINE_TOOLS = "https://platform.claude.com/docs/en/agents-and-tools/tool-use/define-tools"
SYSTEM_MESSAGES = (
    "https://platform.claude.com/docs/en/build-with-claude/mid-conversation-system-messages"
)
PTC = "https://platform.claude.com/docs/en/agents-and-tools/tool-use/programmatic-tool-calling"
PRESERVED = "https://platform.claude.com/docs/en/build-with-claude/preserved-thinking"
EXTENDED_THINKING = "https://platform.claude.com/docs/en/build-with-claude/extended-thinking"
# Third-party pages a rule rests on where the stored official docs are silent.
MODELPIN_0_5_7 = "https://github.com/samarthputhraya/Modelpin/releases/tag/v0.5.7"
CONTINUE_11446 = "https://github.com/continuedev/continue/issues/11446"

Check = Callable[[ModelInfo, Mapping[str, Any]], list[str]]


@dataclass(frozen=True)
class Rule:
    """One rule of the Messages API: what it refuses, where the docs say so, what we do."""

    key: str
    refuses: str  # what the API refuses (or does), in a sentence
    sources: tuple[str, ...]  # the official documentation pages
    app: str  # what the app does about it
    check: Check | None = None  # per-request check (None: enforced elsewhere, see `app`)
    note: str = ""
    # Pages that are not Anthropic's own (trackers, other projects quoting the docs), for a
    # rule the stored official pages do not state.
    third_party: tuple[str, ...] = ()

    @property
    def basis(self) -> str:
        """What the rule rests on: "official", "third-party", or "UNSOURCED" (nothing)."""
        if self.sources:
            return "official"
        return "third-party" if self.third_party else "UNSOURCED"

    @property
    def unsourced(self) -> bool:
        return self.basis == "UNSOURCED"


def _effort(params: Mapping[str, Any]) -> Any:
    output = params.get("output_config")
    return output.get("effort") if isinstance(output, Mapping) else None


def _thinking(params: Mapping[str, Any]) -> Mapping[str, Any] | None:
    thinking = params.get("thinking")
    return thinking if isinstance(thinking, Mapping) else None


def _off_hint(info: ModelInfo) -> str:
    if info.thinking_off == "between_tools":
        return (
            'Use "thinking.type.between_tools" to turn off up-front thinking (thinking='
            '"between_tools", or thinking="off" in an Agent).'
        )
    return (
        'Use "thinking.type.adaptive" and "output_config.effort" to control thinking '
        'behavior (leave thinking unset and lower the effort, e.g. effort="low").'
    )


def _max_tokens(info: ModelInfo, params: Mapping[str, Any]) -> list[str]:
    value = params.get("max_tokens")
    if isinstance(value, int) and not isinstance(value, bool) and info.max_output:
        if value > info.max_output:
            return [f"{info.id} does not accept max_tokens {value} (at most {info.max_output})"]
    return []


def _thinking_type(info: ModelInfo, params: Mapping[str, Any]) -> list[str]:
    thinking = _thinking(params)
    if thinking is None:
        return []
    kind = thinking.get("type")
    if kind in info.thinking:
        if kind == "enabled" and not info.thinking_budget:
            return [f"{info.id} does not accept thinking.budget_tokens"]
        return []
    accepted = ", ".join(sorted(info.thinking)) or "none"
    message = f"{info.id} does not accept thinking.type {kind!r} (accepts: {accepted})"
    if kind in ("disabled", "enabled"):
        message += f': "thinking.type.{kind}" is not supported for this model. ' + _off_hint(info)
    return [message]


def _thinking_display(info: ModelInfo, params: Mapping[str, Any]) -> list[str]:
    thinking = _thinking(params)
    display = thinking.get("display") if thinking is not None else None
    if display is not None and display not in info.thinking_display:
        return [f"{info.id} does not accept thinking.display {display!r}"]
    return []


def _effort_level(info: ModelInfo, params: Mapping[str, Any]) -> list[str]:
    effort = _effort(params)
    if effort is None or effort in info.effort:
        return []
    if not info.effort:
        return [f"{info.id} does not accept output_config.effort"]
    accepted = ", ".join(e for e in EFFORT_LEVELS if e in info.effort)
    return [f"{info.id} does not accept output_config.effort {effort!r} (accepts: {accepted})"]


def _thinking_x_effort(info: ModelInfo, params: Mapping[str, Any]) -> list[str]:
    thinking, effort = _thinking(params), _effort(params)
    if thinking is None or effort is None or effort not in info.effort:
        return []  # no effort: the model's default level, which every coupling accepts
    kind = thinking.get("type")
    if kind not in info.thinking:
        return []
    levels = info.efforts_for(kind)
    if effort in levels:
        return []
    allowed = ", ".join(e for e in EFFORT_LEVELS if e in levels) or "none"
    message = (
        f"{info.id} does not accept thinking.type {kind!r} at output_config.effort "
        f"{effort!r} (only at {allowed})"
    )
    if kind == "between_tools" and effort in ("xhigh", "max"):
        message += ": to run at xhigh or max, use adaptive thinking (leave thinking unset)"
    return [message]


def _output_format(info: ModelInfo, params: Mapping[str, Any]) -> list[str]:
    output = params.get("output_config")
    if isinstance(output, Mapping) and output.get("format") is not None:
        if not info.structured_output:
            return [f"{info.id} does not accept output_config.format"]
    return []


def _tool_choice(info: ModelInfo, params: Mapping[str, Any]) -> list[str]:
    choice = params.get("tool_choice")
    if isinstance(choice, Mapping) and choice.get("type") in ("any", "tool"):
        if not info.forced_tool_choice:
            return [f"{info.id} does not accept tool_choice {{'type': {choice['type']!r}}}"]
    return []


def _retired(info: ModelInfo, params: Mapping[str, Any]) -> list[str]:
    if info.lifecycle() != "retired":
        return []
    when = f" on {info.deprecated.isoformat()}" if info.deprecated is not None else ""
    instead = f"; use {info.replacement} (the recommended replacement)" if info.replacement else ""
    return [f"{info.id} retired{when}: requests to it fail{instead}"]


def _thinking_x_tool_choice(info: ModelInfo, params: Mapping[str, Any]) -> list[str]:
    """Only manual thinking (`enabled`, with a budget) refuses a forced tool_choice:
    "Adaptive thinking, including on models where thinking is on by default, supports
    forced tool use" (Thinking, "Thinking with tool use"). The models that refuse forced
    tool use whatever the thinking (Fable / Mythos 5.1, the 5.5 generation) are
    `forced_tool_choice`'s."""
    thinking, choice = _thinking(params), params.get("tool_choice")
    if thinking is None or thinking.get("type") != "enabled":
        return []
    if isinstance(choice, Mapping) and choice.get("type") in ("any", "tool"):
        return [
            f"{info.id} does not accept thinking.type {thinking.get('type')!r} with tool_choice "
            f"{{'type': {choice['type']!r}}}: Thinking may not be enabled when tool_choice "
            "forces tool use"
        ]
    return []


def _sampling(info: ModelInfo, params: Mapping[str, Any]) -> list[str]:
    if info.sampling:
        return []
    out = []
    for option in ("temperature", "top_p", "top_k"):
        value = params.get(option)
        if value is None or (option == "temperature" and value == 1):
            continue  # absent, or the default (1.0) the API accepts
        out.append(f"{info.id} does not accept {option}")
    return out


def _server_tools(info: ModelInfo, params: Mapping[str, Any]) -> list[str]:
    out = []
    tools = params.get("tools")
    for tool in tools if isinstance(tools, list | tuple) else ():
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        if isinstance(kind, str) and kind.startswith(SERVER_TOOL_PREFIXES):
            if kind not in info.server_tools:
                out.append(f"{info.id} does not accept the server tool {kind}")
    return out


def _inference_geo(info: ModelInfo, params: Mapping[str, Any]) -> list[str]:
    if params.get("inference_geo") is not None and not info.inference_geo:
        return [f"{info.id} does not accept inference_geo (Claude Opus 4.6 and later only)"]
    return []


RULES: tuple[Rule, ...] = (
    Rule(
        "model_retired",
        "any request to a retired model (requests to it fail from its retirement date): "
        "claude-sonnet-4-5 since 2026-11-30",
        (DEPRECATIONS, SONNET_4_5),
        "refused before the run starts (check: agentrun.E021; start_run, a message, a fork, a "
        "resume: 400 option_refused), naming the recommended replacement",
        _retired,
        note="The status and wording the API answers a retired model with are UNSOURCED (the "
        "page says only that requests fail); the stand-in answers 400 with this rule's message.",
    ),
    Rule(
        "model_deprecated",
        "nothing until the retirement date: a deprecated model answers, with a retirement "
        "date and a recommended replacement (claude-opus-4-5: 2027-01-22, claude-opus-5-5)",
        (DEPRECATIONS,),
        "a warning at manage.py check (agentrun.W022) with the date and the replacement; "
        "refused from the retirement date on (model_retired)",
        note="Opus 4.5's deprecation is from a third-party page quoting the deprecations "
        "page (the stored Opus 4.5 page still says legacy).",
        third_party=(MODELPIN_0_5_7,),
    ),
    Rule(
        "max_tokens",
        "max_tokens above the model's maximum output",
        (MODELS,),
        "refused before the run starts (check, start_run, API 400)",
        _max_tokens,
    ),
    Rule(
        "max_tokens_zero",
        "max_tokens 0 (pre-warming the cache) with stream, thinking enabled, "
        "output_config.format or a forced tool_choice; alone it is accepted",
        (CACHING + "#pre-warming-the-cache",),
        "the app never sends max_tokens 0; the stand-in answers it with empty content, "
        "stop_reason max_tokens, and refuses the four combinations",
        note="The response's shape for max_tokens 0 and the refusal's wording are UNSOURCED.",
    ),
    Rule(
        "tool_name",
        "a tool name that does not match ^[a-zA-Z0-9_-]{1,64}$",
        (DEFINE_TOOLS,),
        "a @tool or an MCP tool (as the model sees it) with such a name is refused when it "
        "is defined or listed (ConfigurationError)",
    ),
    Rule(
        "whitespace_text",
        "a text block that is empty or holds only whitespace",
        (),
        "blank text blocks are left out of a recorded answer (history.sanitize_content)",
        note="No official page states it; clients quote the API's error 'text content blocks "
        "must contain non-whitespace text'.",
        third_party=(CONTINUE_11446,),
    ),
    Rule(
        "automatic_caching_ttl",
        "automatic caching (the top-level cache_control) whose TTL differs from the "
        "explicit cache_control of the last block",
        (CACHING + "#automatic-caching",),
        "no top-level marker where the host marked the last block itself (clients/caching)",
    ),
    Rule(
        "system_messages",
        'a role "system" entry in messages on a model without mid-conversation system '
        "messages, first, or placed other than after a user turn (or a server tool result) "
        "and before an assistant turn or the end",
        (SYSTEM_MESSAGES,),
        "the app sends none; the stand-in takes them where the page places them",
        note="The 5.2 and 5.5 models are newer than the page: taken there (UNSOURCED).",
    ),
    Rule(
        "programmatic_tool_calling",
        "nothing: a server tool use that called a client tool is answered in a later "
        "response, after the client's tool_result",
        (PTC,),
        "the stand-in takes such a history (it refused it before)",
    ),
    Rule(
        "thinking_prefix_check",
        "on the preserved-thinking models (Fable 5.1 and later), a thinking block after a "
        "changed prefix; on the earlier ones, an open tool loop's last assistant turn "
        "without the thinking it was answered with",
        (PRESERVED, EXTENDED_THINKING),
        "preserved_thinking per model: blocks after a change are left out there; elsewhere "
        "the open loop's last turn keeps its thinking",
        note="Which models besides Fable 5.1, Sonnet 5.5 and Haiku 5.5 run the check is "
        "UNSOURCED (see each entry's unsourced fields).",
    ),
    Rule(
        "thinking_type",
        "a thinking.type the model does not take: disabled on Sonnet 5.5 (use between_tools), "
        "disabled or enabled on Opus 5.5 and Fable 5.1 (thinking is always on), budgets "
        "(enabled) on the 5 generation",
        (SONNET_5_5, OPUS_5_5),
        'refused before the run starts; thinking="off" sends what the model takes (disabled, '
        "or between_tools on Sonnet 5.5) and is refused, naming the alternative, where "
        "thinking cannot be off",
        _thinking_type,
    ),
    Rule(
        "thinking_display",
        "thinking.display on a model without display, or with thinking between_tools "
        "(that type takes no other field)",
        (THINKING,),
        'refused before the run starts; thinking_display needs thinking="adaptive"',
        _thinking_display,
    ),
    Rule(
        "effort_levels",
        "an output_config.effort level the model does not take (xhigh on the 4.6 models and "
        "Mythos Preview; any effort on Sonnet / Haiku 4.5)",
        (EFFORT,),
        "refused before the run starts",
        _effort_level,
    ),
    Rule(
        "thinking_x_effort",
        "thinking between_tools on Sonnet 5.5 at effort xhigh or max; thinking disabled on "
        "Opus 5 above effort high",
        (SONNET_5_5, OPUS_5_5),
        "refused before the run starts, naming the levels it is accepted at",
        _thinking_x_effort,
    ),
    Rule(
        "thinking_x_effort_haiku_5_5",
        "thinking disabled on Haiku 5.5 above effort high",
        (),
        "refused before the run starts (the same check, from the Haiku 5.5 entry)",
        note="Neither the stored platform docs nor any stored third-party page say so (an "
        "earlier round cited third-party guides it did not record).",
    ),
    Rule(
        "effort_fixed_in_conversation",
        "with thinking between_tools, a change of effort within a conversation",
        (SONNET_5_5,),
        "a conversation keeps the options of its start: a message cannot set options "
        "(POST /conversations/{id}/messages/ with options is a 400)",
        note="The stand-in does not follow conversations across requests: not checked there.",
    ),
    Rule(
        "display_x_effort",
        "no display x effort coupling is documented",
        (),
        "no check",
        note="The stored docs name none; listed so that a later finding has its row.",
    ),
    Rule(
        "forced_tool_choice",
        'tool_choice {"type": "any"} or {"type": "tool"} on Sonnet 5.5, Opus 5.5 and Fable 5.1',
        (SONNET_5_5, OPUS_5_5),
        "refused before the run starts",
        _tool_choice,
        note="Fable / Mythos 5.2 refuse it here too, as their 5.1 siblings do: UNSOURCED.",
    ),
    Rule(
        "forced_tool_choice_haiku_5_5",
        'tool_choice {"type": "any"} or {"type": "tool"} on Haiku 5.5',
        (),
        "refused before the run starts (forced_tool_choice, from the Haiku 5.5 entry)",
        note="No official page says so; the issue that added it cites one third-party page, "
        "which the stored material does not hold. Override the entry "
        "(AGENTRUN_MODELS forced_tool_choice) when you know better.",
    ),
    Rule(
        "thinking_x_tool_choice",
        'manual thinking (thinking.type "enabled", with budget_tokens) with tool_choice "any" '
        'or "tool"; adaptive thinking, also where it is on by default, takes forced tool use',
        (THINKING,),
        "refused before the run starts",
        _thinking_x_tool_choice,
    ),
    Rule(
        "sampling",
        "temperature, top_p or top_k other than the defaults on the 5 generation",
        (MODELS,),
        "never sent (the SDK 1.0+ has no such options here)",
        _sampling,
    ),
    Rule(
        "structured_output",
        "output_config.format on a model without structured outputs",
        (MODELS,),
        "refused before the run starts",
        _output_format,
    ),
    Rule(
        "server_tools",
        "a server tool version the model does not take",
        (),
        "refused before the run starts",
        _server_tools,
        note="Which versions each generation takes is UNSOURCED per version.",
    ),
    Rule(
        "inference_geo",
        "inference_geo on a model before Claude Opus 4.6",
        (RESIDENCY,),
        "the app sends none; the stand-in refuses it as the API does",
        _inference_geo,
    ),
    Rule(
        "inference_geo_price",
        'nothing refused: usage.inference_geo "us" bills every token category at 1.1x',
        ("https://docs.aws.amazon.com/claude-platform/latest/userguide/data-residency.html",),
        "cost_usd (budgets too) priced at 1.1x for a response whose usage says us",
    ),
    Rule(
        "cache_minimum",
        "nothing refused: a prefix shorter than the model's minimum is not cached",
        (),
        "cache_min_tokens per model (512 on Sonnet / Haiku 5.5, 2,048 on Mythos Preview)",
        note="The stored platform docs give no 5.5 or Mythos Preview figure; third-party "
        "tables give 512 for the 5.5 models.",
    ),
    Rule(
        "refusal_billing",
        "nothing refused: a refusal before any output is billed only in the categories bio, "
        "frontier_llm and reasoning_extraction; one after output bills the input and the "
        "output streamed",
        (REFUSALS,),
        "cost_usd of a refused answer as billed (catalog.REFUSAL_BILLED_CATEGORIES); "
        "output.refusal.billed says which",
    ),
    Rule(
        "refusal_reset",
        "a conversation that sends a refused turn again is refused again (the turn must be "
        "removed or changed)",
        (STREAMING_REFUSALS,),
        "a refused answer runs no tool and is left out of what later requests send; the "
        "stand-in refuses a request that sends it back",
    ),
    Rule(
        "spend_cap",
        "every request once the tier's monthly spend cap is reached: 429 rate_limit_error, "
        "error.details.error_code enforced_spend_limit_reached, no retry-after (a limit set "
        "in the Console: 400 'You have reached your specified API usage limits')",
        (RATE_LIMITS,),
        "the run fails after one request (usage_limit_reached, the API's message); a 429 "
        "that may be retried parks the run for the wait the API states",
    ),
    Rule(
        "window_4_6",
        "Claude Sonnet 4.6: 1M context window, 128K output; effort max accepted",
        (SONNET_4_6, EFFORT),
        "in the table (it had a 64K output and no max)",
    ),
)

BY_KEY = {rule.key: rule for rule in RULES}


def applied(info: ModelInfo, params: Mapping[str, Any]) -> list[tuple[Rule, str]]:
    """Each refusal of `params` on `info`'s model, with the rule that makes it."""
    return [(rule, m) for rule in RULES if rule.check for m in rule.check(info, params)]


def readme_table() -> str:
    """The docs table (docs/reference/models.md) "What the API refuses, and what the app does about it": one row a
    rule, UNSOURCED where the stored docs do not say (a row added to RULES shows up here)."""
    rows = [
        "| rule | what the API refuses | source | what the app does |",
        "| --- | --- | --- | --- |",
    ]
    for rule in RULES:
        links = [f"[{_label(url)}]({url})" for url in rule.sources]
        links += [f"third-party: [{_label(url)}]({url})" for url in rule.third_party]
        source = ", ".join(links) or "UNSOURCED"
        said = rule.refuses + (f" ({rule.note})" if rule.note else "")
        rows.append(f"| `{rule.key}` | {said} | {source} | {rule.app} |")
    return "\n".join(rows) + "\n"


def unsourced_values(table: Mapping[str, ModelInfo]) -> str:
    """The docs list (docs/reference/models.md) of the model table's values the stored docs do not give, by model."""
    lines = [
        f"- `{info.id}`: {', '.join(f'`{f}`' for f in sorted(info.unsourced))}"
        for info in sorted({i.id: i for i in table.values()}.values(), key=lambda i: i.id)
        if info.unsourced
    ]
    return "\n".join(lines) + "\n"


def _label(url: str) -> str:
    return url.split("/docs/en/")[-1] if "/docs/en/" in url else url.split("//")[-1].split("/")[0]
