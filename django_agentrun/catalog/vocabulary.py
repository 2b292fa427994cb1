"""The model table's vocabulary: the Messages API's option values, and Prices / ModelInfo."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal

D = Decimal

# The Messages API's own vocabularies (anthropic 2.16: ThinkingConfigParam,
# ThinkingConfigAdaptiveParam.display, OutputConfigParam.effort).
THINKING_TYPES = frozenset({"adaptive", "enabled", "disabled", "between_tools"})
THINKING_DISPLAYS = frozenset({"summarized", "omitted"})
EFFORT_LEVELS = ("low", "medium", "high", "xhigh", "max")
STATUSES = frozenset({"current", "legacy"})
# US-only inference (usage.inference_geo "us") bills every token category at 1.1x the
# standard price (Claude Platform on AWS, Data residency:
# https://docs.aws.amazon.com/claude-platform/latest/userguide/data-residency.html; the
# platform.claude.com data-residency page names the parameter and the models).
US_ONLY_MULTIPLIER = Decimal("1.1")

# A refusal that arrives before any output is billed only in these stop_details categories
# (Refusals and fallback, "How refusals are billed",
# https://platform.claude.com/docs/en/build-with-claude/refusals-and-fallback#how-refusals-are-billed;
# release notes 2026-09-24): any other category, or none, is not billed. A refusal after
# output (mid-stream) bills the input and the output streamed, as any answer.
REFUSAL_BILLED_CATEGORIES = frozenset({"bio", "frontier_llm", "reasoning_extraction"})

# Server tool type names (anthropic 2.16 ToolUnionParam), by family.
WEB_SEARCH = ("web_search_20250305", "web_search_20260209", "web_search_20260318")
WEB_FETCH = (
    "web_fetch_20250910",
    "web_fetch_20260209",
    "web_fetch_20260309",
    "web_fetch_20260318",
)
CODE_EXECUTION = (
    "code_execution_20250522",
    "code_execution_20250825",
    "code_execution_20260120",
    "code_execution_20260521",
)
TOOL_SEARCH = (
    "tool_search_tool_bm25_20251119",
    "tool_search_tool_bm25",
    "tool_search_tool_regex_20251119",
    "tool_search_tool_regex",
)
SERVER_TOOL_TYPES = frozenset(WEB_SEARCH + WEB_FETCH + CODE_EXECUTION + TOOL_SEARCH)
SERVER_TOOL_PREFIXES = ("web_search_", "web_fetch_", "code_execution_", "tool_search_tool_")

# Which versions each generation accepts is UNSOURCED per version (the Models API says
# only whether web search / code execution are supported at all): every version the SDK
# knows is accepted by the 4.6-and-later models, the first versions by the older ones.
ALL_SERVER_TOOLS = SERVER_TOOL_TYPES
EARLY_SERVER_TOOLS = frozenset(
    ("web_search_20250305", "web_fetch_20250910", "code_execution_20250522")
    + ("code_execution_20250825",)
    + TOOL_SEARCH
)


@dataclass(frozen=True)
class Prices:
    """USD per million tokens; server tools per 1,000 requests or per container hour."""

    input: Decimal
    output: Decimal
    cache_write_5m: Decimal
    cache_write_1h: Decimal
    cache_read: Decimal
    # (prompt tokens above which, prices): the highest threshold the prompt passes wins.
    bands: tuple[tuple[int, Prices], ...] = ()
    # Web search: $10 per 1,000 searches (pricing page, "Web search tool").
    web_search_per_1k: Decimal = D(10)
    # Web fetch: no charge beyond the tokens of the fetched content (pricing page).
    web_fetch_per_1k: Decimal = D(0)
    # Code execution: $0.05 per container hour past the free hours a month
    # (pricing page). The response's usage carries no container time, so cost_of
    # cannot bill it per response; see docs/reference/models.md.
    code_execution_per_hour: Decimal = D("0.05")

    def for_prompt(self, prompt_tokens: int) -> Prices:
        """The prices that apply to a request whose prompt has `prompt_tokens` tokens."""
        chosen = self
        for threshold, prices in sorted(self.bands, key=lambda b: b[0]):
            if prompt_tokens > threshold:
                chosen = prices
        return chosen


@dataclass(frozen=True)
class ModelInfo:
    id: str
    status: str  # "current" | "legacy"
    context_window: int
    max_output: int
    thinking: frozenset[str]  # accepted thinking.type values
    thinking_display: frozenset[str]  # accepted thinking.display values
    effort: frozenset[str]  # accepted output_config.effort levels; empty = refused
    forced_tool_choice: bool  # tool_choice {"type": "any" | "tool"} accepted
    sampling: bool  # temperature / top_p / top_k accepted
    thinking_budget: bool  # thinking {"type": "enabled", "budget_tokens"} accepted
    structured_output: bool  # output_config.format accepted
    server_tools: frozenset[str]  # server tool type names accepted
    cache_min_tokens: int
    prices: Prices
    # The couplings (catalog/rules.py says where each comes from):
    # thinking type -> the output_config.effort levels it is accepted at (a type not named
    # here: at every level the model accepts). Unset effort is the model's default level,
    # which every shipped coupling accepts.
    effort_by_thinking: tuple[tuple[str, frozenset[str]], ...] = ()
    # What the Agent option thinking="off" sends on this model: "disabled", "between_tools"
    # (the lowest setting where "disabled" is refused), or None: thinking cannot be off.
    thinking_off: str | None = "disabled"
    # Thinking types with which the effort may not change within a conversation.
    fixed_effort_with: frozenset[str] = frozenset()
    # The request's inference_geo accepted (Claude Opus 4.6 and later).
    inference_geo: bool = True
    # The API checks a thinking block sent back against what preceded it ("Starting with
    # Claude Fable 5.1", preserved thinking,
    # https://platform.claude.com/docs/en/build-with-claude/preserved-thinking): a block
    # after a changed prefix is refused or dropped. Earlier models take a block back
    # whatever preceded it, and need the open tool loop's last turn to keep its thinking.
    preserved_thinking: bool = False
    # The fields of this entry the stored platform docs do not give (UNSOURCED: from
    # third-party pages, a sibling model, or this project's earlier beliefs).
    unsourced: frozenset[str] = frozenset()
    # The lifecycle ("Model deprecations": active, legacy, deprecated, retired,
    # https://platform.claude.com/docs/en/about-claude/model-deprecations): a deprecated
    # model's retirement date (requests fail from that day on), `retired` once the docs say
    # so, and the replacement they recommend.
    deprecated: date | None = None
    retired: bool = False
    replacement: str = ""

    def lifecycle(self, today: date | None = None) -> str:
        """ "retired" (requests to it fail), "deprecated" (it retires on `deprecated`), or its
        status ("current", "legacy"), on `today` (UTC)."""
        today = today or datetime.now(UTC).date()
        if self.retired or (self.deprecated is not None and self.deprecated <= today):
            return "retired"
        return "deprecated" if self.deprecated is not None else self.status

    def efforts_for(self, thinking: str) -> frozenset[str]:
        """The effort levels `thinking` (a thinking.type) is accepted at on this model."""
        return dict(self.effort_by_thinking).get(thinking, self.effort)
