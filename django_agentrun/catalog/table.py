"""The shipped table: each model's capabilities and prices, with where each figure comes
from (a figure the docs did not give is marked UNSOURCED beside it)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import date
from decimal import Decimal
from typing import Any

from .vocabulary import (
    ALL_SERVER_TOOLS,
    EARLY_SERVER_TOOLS,
    EFFORT_LEVELS,
    THINKING_DISPLAYS,
    ModelInfo,
    Prices,
)

D = Decimal


def _p(inp: str, out: str, w5: str, w1: str, read: str, **kw: Any) -> Prices:
    return Prices(D(inp), D(out), D(w5), D(w1), D(read), **kw)


_ALL_EFFORT = frozenset(EFFORT_LEVELS)
_UP_TO_HIGH = frozenset({"low", "medium", "high"})
_DISPLAY = THINKING_DISPLAYS


def _m(id: str, status: str, **kw: Any) -> ModelInfo:
    defaults: dict[str, Any] = {
        "context_window": 1_000_000,
        "max_output": 128_000,
        "thinking_display": _DISPLAY,
        "structured_output": True,
        "server_tools": ALL_SERVER_TOOLS,
    }
    defaults.update(kw)
    return ModelInfo(id=id, status=status, **defaults)


# Haiku 5.5 bills by prompt length (input + cache writes + cache reads): up to 100,000
# tokens, and over (model overview page, "Pricing").
_HAIKU_5_5_LONG = _p("0.50", "2.50", "0.625", "1.00", "0.05")

# preserved_thinking (the prefix check of thinking blocks sent back): "Starting with Claude
# Fable 5.1" (preserved thinking); Sonnet 5.5's and Haiku 5.5's blocks are also bound to the
# account (the same page). For Mythos 5.1, Opus 5.5 and the 5.2 models the page does not
# say: UNSOURCED (marked so in each entry), taken as the generation's rule.
_TABLE: tuple[ModelInfo, ...] = (
    # ---- current generation -------------------------------------------------------------
    # Fable 5.2 / Mythos 5.2: $8 / $40, cache writes $10 / $16, reads $0.20. These figures
    # are from price trackers quoting the pricing page (checked 2026-12-01); the stored
    # platform docs had no Fable 5.2 page: UNSOURCED in the docs themselves. Capabilities
    # as Fable 5.1 (adaptive thinking always on, forced tool use refused): UNSOURCED.
    _m(
        "claude-fable-5-2",
        "current",
        preserved_thinking=True,
        thinking=frozenset({"adaptive"}),
        effort=_ALL_EFFORT,
        forced_tool_choice=False,
        sampling=False,
        thinking_budget=False,
        cache_min_tokens=512,  # UNSOURCED for 5.2 (Fable 5: 512)
        prices=_p("8", "40", "10", "16", "0.20"),
        thinking_off=None,
        unsourced=frozenset(
            (
                "cache_min_tokens",
                "effort",
                "forced_tool_choice",
                "prices",
                "thinking",
                "preserved_thinking",
            )
        ),
    ),
    _m(
        "claude-mythos-5-2",
        "current",
        preserved_thinking=True,
        thinking=frozenset({"adaptive"}),
        effort=_ALL_EFFORT,
        forced_tool_choice=False,
        sampling=False,
        thinking_budget=False,
        cache_min_tokens=512,  # UNSOURCED (Mythos 5: 512)
        prices=_p("8", "40", "10", "16", "0.20"),  # as Fable 5.2, see above
        thinking_off=None,
        unsourced=frozenset(
            (
                "cache_min_tokens",
                "effort",
                "forced_tool_choice",
                "prices",
                "thinking",
                "preserved_thinking",
            )
        ),
    ),
    # Opus 5.5: 1M / 128K, $4 / $20, writes $5 / $8, reads $0.20; thinking cannot be
    # disabled, forced tool use returns an error (overview page, "Breaking changes").
    _m(
        "claude-opus-5-5",
        "current",
        preserved_thinking=True,
        thinking=frozenset({"adaptive"}),
        effort=_ALL_EFFORT,  # xhigh / max on Opus 5.5: UNSOURCED (the levels the SDK knows)
        forced_tool_choice=False,
        sampling=False,
        thinking_budget=False,
        cache_min_tokens=512,  # UNSOURCED for 5.5 (Opus 5: 512)
        prices=_p("4", "20", "5", "8", "0.20"),
        thinking_off=None,
        unsourced=frozenset(("cache_min_tokens", "effort", "preserved_thinking")),
    ),
    # Sonnet 5.5: 1M / 128K, $2 / $10, writes $2.50 / $4; cache reads cut to $0.10 (0.05x)
    # on 2026-10-07 (pricing page as quoted by price trackers; the stored overview page
    # still shows $0.20). Thinking adaptive, or off up front with "between_tools" (its
    # lowest setting, at effort low / medium / high only, the effort then fixed for the
    # conversation); "disabled" returns 400; forced tool use returns an error (What's new
    # in Claude Sonnet 5.5).
    _m(
        "claude-sonnet-5-5",
        "current",
        preserved_thinking=True,
        thinking=frozenset({"adaptive", "between_tools"}),
        effort=_ALL_EFFORT,  # xhigh and max named on the Sonnet 5.5 page (between_tools)
        forced_tool_choice=False,
        sampling=False,
        thinking_budget=False,
        cache_min_tokens=512,  # UNSOURCED in the platform docs (third-party tables: 512)
        prices=_p("2", "10", "2.50", "4", "0.10"),
        effort_by_thinking=(("between_tools", _UP_TO_HIGH),),
        thinking_off="between_tools",
        fixed_effort_with=frozenset({"between_tools"}),
        unsourced=frozenset(("cache_min_tokens", "prices")),
    ),
    # Haiku 5.5: 1M / 128K; $0.10 / $0.50, writes $0.125 / $0.20, reads $0.01 for prompts
    # up to 100,000 tokens; $0.50 / $2.50, $0.625 / $1.00, $0.05 over (overview page).
    # Effort low..max, adaptive thinking by default (overview page, API guide).
    _m(
        "claude-haiku-5-5",
        "current",
        preserved_thinking=True,
        thinking=frozenset({"adaptive", "disabled"}),
        effort=_ALL_EFFORT,
        forced_tool_choice=False,  # "current models refuse" (issue #19); page: UNSOURCED
        sampling=False,
        thinking_budget=False,
        cache_min_tokens=512,  # UNSOURCED in the platform docs (third-party tables: 512)
        prices=_p("0.10", "0.50", "0.125", "0.20", "0.01", bands=((100_000, _HAIKU_5_5_LONG),)),
        # "disabled only at high effort or below": UNSOURCED in the platform docs.
        effort_by_thinking=(("disabled", _UP_TO_HIGH),),
        unsourced=frozenset(("cache_min_tokens", "effort_by_thinking", "forced_tool_choice")),
    ),
    # ---- legacy, still served --------------------------------------------------------------
    # Fable 5.1 / Mythos 5.1: $10 / $50, writes $12.50 / $20, reads $0.25 (pricing page);
    # adaptive thinking only, forced tool use refused (Opus 5.5 page: "the first three
    # also apply to Claude Fable 5.1").
    _m(
        "claude-fable-5-1",
        "legacy",
        preserved_thinking=True,
        thinking=frozenset({"adaptive"}),
        effort=_ALL_EFFORT,
        forced_tool_choice=False,
        sampling=False,
        thinking_budget=False,
        cache_min_tokens=512,  # UNSOURCED for 5.1 (Fable 5: 512)
        prices=_p("10", "50", "12.50", "20", "0.25"),
        thinking_off=None,
        unsourced=frozenset(("cache_min_tokens",)),
    ),
    _m(
        "claude-mythos-5-1",
        "legacy",
        preserved_thinking=True,
        thinking=frozenset({"adaptive"}),
        effort=_ALL_EFFORT,
        forced_tool_choice=False,
        sampling=False,
        thinking_budget=False,
        cache_min_tokens=512,  # UNSOURCED
        prices=_p("10", "50", "12.50", "20", "0.25"),
        thinking_off=None,
        unsourced=frozenset(
            ("cache_min_tokens", "forced_tool_choice", "thinking", "preserved_thinking")
        ),
    ),
    # Fable 5 / Mythos 5: $10 / $50, writes $12.50 / $20, reads $1 (pricing page);
    # adaptive thinking only (Bedrock adaptive-thinking page); cache minimum 512.
    _m(
        "claude-fable-5",
        "legacy",
        thinking=frozenset({"adaptive"}),
        effort=_ALL_EFFORT,
        forced_tool_choice=True,
        sampling=False,  # UNSOURCED
        thinking_budget=False,
        cache_min_tokens=512,
        prices=_p("10", "50", "12.50", "20", "1"),
        thinking_off=None,
        unsourced=frozenset(("sampling",)),
    ),
    _m(
        "claude-mythos-5",
        "legacy",
        thinking=frozenset({"adaptive"}),
        effort=_ALL_EFFORT,
        forced_tool_choice=True,
        sampling=False,  # UNSOURCED
        thinking_budget=False,
        cache_min_tokens=512,
        prices=_p("10", "50", "12.50", "20", "1"),
        thinking_off=None,
        unsourced=frozenset(("sampling",)),
    ),
    # Opus 5: 1M / 128K, $5 / $25, writes $6.25 / $10, reads $0.50; thinking on by
    # default, disabled only at effort high or below (overview page); minimum 512.
    _m(
        "claude-opus-5",
        "legacy",
        thinking=frozenset({"adaptive", "disabled"}),
        effort=_ALL_EFFORT,
        forced_tool_choice=True,
        sampling=False,  # UNSOURCED (Sonnet 5 refuses them)
        thinking_budget=False,
        cache_min_tokens=512,
        prices=_p("5", "25", "6.25", "10", "0.50"),
        # Disabled accepted at effort high or below (What's new in Claude Opus 5.5).
        effort_by_thinking=(("disabled", _UP_TO_HIGH),),
        unsourced=frozenset(("sampling",)),
    ),
    # Sonnet 5: 1M / 128K, $2 / $10, writes $2.50 / $4, reads $0.20; manual extended
    # thinking and non-default sampling parameters return 400 (overview page); min 1,024.
    _m(
        "claude-sonnet-5",
        "legacy",
        thinking=frozenset({"adaptive", "disabled"}),
        effort=_ALL_EFFORT,
        forced_tool_choice=True,
        sampling=False,
        thinking_budget=False,
        cache_min_tokens=1024,
        prices=_p("2", "10", "2.50", "4", "0.20"),
    ),
    # Opus 4.8 / 4.7: $5 / $25 (pricing page); adaptive thinking only, budgets return 400
    # (Bedrock adaptive-thinking page, 4.7); minimums 1,024 (4.8) and 2,048 (4.7).
    _m(
        "claude-opus-4-8",
        "legacy",
        thinking=frozenset({"adaptive", "disabled"}),
        effort=_ALL_EFFORT,
        forced_tool_choice=True,
        sampling=False,  # UNSOURCED
        thinking_budget=False,
        cache_min_tokens=1024,
        prices=_p("5", "25", "6.25", "10", "0.50"),
        unsourced=frozenset(("sampling",)),
    ),
    _m(
        "claude-opus-4-7",
        "legacy",
        thinking=frozenset({"adaptive", "disabled"}),
        effort=_ALL_EFFORT,
        forced_tool_choice=True,
        sampling=False,  # UNSOURCED
        thinking_budget=False,
        cache_min_tokens=2048,
        prices=_p("5", "25", "6.25", "10", "0.50"),
        unsourced=frozenset(("sampling",)),
    ),
    # Mythos Preview: adaptive thinking only (Bedrock page). Prices: UNSOURCED (not on the
    # stored pricing page); $25 / $125 as announced for the research preview.
    _m(
        "claude-mythos-preview",
        "legacy",
        thinking=frozenset({"adaptive"}),
        effort=frozenset({"low", "medium", "high", "max"}),  # no xhigh (effort page)
        forced_tool_choice=True,
        sampling=False,  # UNSOURCED
        thinking_budget=False,
        cache_min_tokens=2048,  # UNSOURCED (issue #24 quotes 2,048)
        prices=_p("25", "125", "31.25", "50", "2.50"),  # UNSOURCED
        thinking_off=None,
        unsourced=frozenset(("cache_min_tokens", "prices", "sampling")),
    ),
    # Opus 4.6 / Sonnet 4.6: adaptive, or budgets (deprecated); effort low..high and max on
    # both (effort page); 1M / 128K both (model pages); minimums 4,096 (Opus 4.6) and
    # 1,024 (Sonnet 4.6).
    _m(
        "claude-opus-4-6",
        "legacy",
        thinking=frozenset({"adaptive", "enabled", "disabled"}),
        effort=frozenset({"low", "medium", "high", "max"}),
        forced_tool_choice=True,
        sampling=True,
        thinking_budget=True,
        cache_min_tokens=4096,
        prices=_p("5", "25", "6.25", "10", "0.50"),
    ),
    _m(
        "claude-sonnet-4-6",
        "legacy",
        thinking=frozenset({"adaptive", "enabled", "disabled"}),
        effort=frozenset({"low", "medium", "high", "max"}),
        forced_tool_choice=True,
        sampling=True,
        thinking_budget=True,
        cache_min_tokens=1024,
        prices=_p("3", "15", "3.75", "6", "0.30"),
    ),
    # Opus 4.5: 200K / 64K, $5 / $25, budgets, effort low..high; minimum 4,096. Deprecated
    # on 2026-11-23, retiring 2027-01-22 (replacement Opus 5.5): a third-party page quoting
    # the deprecations page (modelpin 0.5.7 release notes,
    # https://github.com/samarthputhraya/Modelpin/releases/tag/v0.5.7); the stored Opus 4.5
    # page still says legacy.
    _m(
        "claude-opus-4-5",
        "legacy",
        deprecated=date(2027, 1, 22),
        replacement="claude-opus-5-5",
        context_window=200_000,
        max_output=64_000,
        thinking=frozenset({"enabled", "disabled"}),
        thinking_display=frozenset(),  # display: UNSOURCED for 4.5, refused here
        effort=frozenset({"low", "medium", "high"}),
        forced_tool_choice=True,
        sampling=True,
        thinking_budget=True,
        server_tools=EARLY_SERVER_TOOLS,
        cache_min_tokens=4096,
        prices=_p("5", "25", "6.25", "10", "0.50"),
        inference_geo=False,
        unsourced=frozenset(("thinking_display",)),
    ),
    # Sonnet 4.5: 200K / 64K, $3 / $15, writes $3.75 / $6, reads $0.30; minimum 1,024.
    # Retired on 2026-11-30, replacement Sonnet 5.5 (the Sonnet 4.5 model page: "retires on
    # November 30, 2026. Recommended replacement: Claude Sonnet 5.5",
    # https://platform.claude.com/docs/en/models/sonnet-4-5/overview): kept so that its
    # recorded runs are priced and a request to it is refused naming the replacement.
    _m(
        "claude-sonnet-4-5",
        "legacy",
        deprecated=date(2026, 11, 30),
        retired=True,
        replacement="claude-sonnet-5-5",
        context_window=200_000,
        max_output=64_000,
        thinking=frozenset({"enabled", "disabled"}),
        thinking_display=frozenset(),
        effort=frozenset(),
        forced_tool_choice=True,
        sampling=True,
        thinking_budget=True,
        server_tools=EARLY_SERVER_TOOLS,
        cache_min_tokens=1024,
        prices=_p("3", "15", "3.75", "6", "0.30"),
        inference_geo=False,
    ),
    # Haiku 4.5: 200K / 64K, $1 / $5, writes $1.25 / $2, reads $0.10; minimum 4,096.
    _m(
        "claude-haiku-4-5",
        "legacy",
        context_window=200_000,
        max_output=64_000,
        thinking=frozenset({"enabled", "disabled"}),
        thinking_display=frozenset(),
        effort=frozenset(),
        forced_tool_choice=True,
        sampling=True,
        thinking_budget=True,
        server_tools=EARLY_SERVER_TOOLS,
        cache_min_tokens=4096,
        prices=_p("1", "5", "1.25", "2", "0.10"),
        inference_geo=False,
    ),
)

# Dated snapshot ids the SDK lists, to their alias.
_ALIASES = {
    "claude-haiku-4-5-20251001": "claude-haiku-4-5",
    "claude-opus-4-5-20251101": "claude-opus-4-5",
    "claude-sonnet-4-5-20250929": "claude-sonnet-4-5",
}

SHIPPED: Mapping[str, ModelInfo] = {m.id: m for m in _TABLE} | {
    alias: {m.id: m for m in _TABLE}[target] for alias, target in _ALIASES.items()
}

_DATED = re.compile(r"^(?P<base>.+)-(?P<date>20\d{6})$")


def lookup(table: Mapping[str, ModelInfo], model: str) -> ModelInfo | None:
    """Exact id, else a dated id (claude-x-20260101) by its undated alias."""
    if not isinstance(model, str):
        return None
    if model in table:
        return table[model]
    dated = _DATED.match(model)
    if dated and dated["base"] in table:
        return table[dated["base"]]
    return None


def shipped_info(model: str) -> ModelInfo | None:
    """The shipped table's entry for `model` (no Django, no overrides)."""
    return lookup(SHIPPED, model)
