"""The model table: what each Claude model accepts and what it costs.

The shipped table (SHIPPED, shipped_info) is plain data that imports without Django
settings: the Messages API stand-in reads it to refuse what each model refuses. The
functions that say so (model_info, refusals without shipped_only) also merge:

1. the capabilities `manage.py agentrun_models refresh` stored from the Models API (the
   JSON file named by AGENTRUN_MODELS_FILE), and
2. the host project's AGENTRUN_MODELS overrides (partial dicts merged over an entry),
   with the legacy AGENTRUN_PRICES folded in.

Sources: the platform docs' model overview pages and pricing page (platform.claude.com,
"Models & pricing", read 2026-12). A figure the docs did not give is marked UNSOURCED
beside it; override it with AGENTRUN_MODELS when you know better.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = [
    "EFFORT_LEVELS",
    "SHIPPED",
    "THINKING_DISPLAYS",
    "THINKING_TYPES",
    "ModelInfo",
    "Prices",
    "catalog_errors",
    "known_models",
    "model_info",
    "refusals",
    "shipped_info",
]

D = Decimal

# The Messages API's own vocabularies (anthropic 2.16: ThinkingConfigParam,
# ThinkingConfigAdaptiveParam.display, OutputConfigParam.effort).
THINKING_TYPES = frozenset({"adaptive", "enabled", "disabled", "between_tools"})
THINKING_DISPLAYS = frozenset({"summarized", "omitted"})
EFFORT_LEVELS = ("low", "medium", "high", "xhigh", "max")
STATUSES = frozenset({"current", "legacy"})

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
_SERVER_TOOL_PREFIXES = ("web_search_", "web_fetch_", "code_execution_", "tool_search_tool_")

# Which versions each generation accepts is UNSOURCED per version (the Models API says
# only whether web search / code execution are supported at all): every version the SDK
# knows is accepted by the 4.6-and-later models, the first versions by the older ones.
_ALL_SERVER_TOOLS = SERVER_TOOL_TYPES
_EARLY_SERVER_TOOLS = frozenset(
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
    # cannot bill it per response; see README "Pricing".
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


def _p(inp: str, out: str, w5: str, w1: str, read: str, **kw: Any) -> Prices:
    return Prices(D(inp), D(out), D(w5), D(w1), D(read), **kw)


_ALL_EFFORT = frozenset(EFFORT_LEVELS)
_DISPLAY = THINKING_DISPLAYS


def _m(id: str, status: str, **kw: Any) -> ModelInfo:
    defaults: dict[str, Any] = {
        "context_window": 1_000_000,
        "max_output": 128_000,
        "thinking_display": _DISPLAY,
        "structured_output": True,
        "server_tools": _ALL_SERVER_TOOLS,
    }
    defaults.update(kw)
    return ModelInfo(id=id, status=status, **defaults)


# Haiku 5.5 bills by prompt length (input + cache writes + cache reads): up to 100,000
# tokens, and over (model overview page, "Pricing").
_HAIKU_5_5_LONG = _p("0.50", "2.50", "0.625", "1.00", "0.05")

_TABLE: tuple[ModelInfo, ...] = (
    # ---- current generation -------------------------------------------------------------
    # Fable 5.2 / Mythos 5.2: $8 / $40, cache writes $10 / $16, reads $0.20. These figures
    # are from price trackers quoting the pricing page (checked 2026-12-01); the stored
    # platform docs had no Fable 5.2 page: UNSOURCED in the docs themselves. Capabilities
    # as Fable 5.1 (adaptive thinking always on, forced tool use refused): UNSOURCED.
    _m(
        "claude-fable-5-2",
        "current",
        thinking=frozenset({"adaptive"}),
        effort=_ALL_EFFORT,
        forced_tool_choice=False,
        sampling=False,
        thinking_budget=False,
        cache_min_tokens=512,  # UNSOURCED for 5.2 (Fable 5: 512)
        prices=_p("8", "40", "10", "16", "0.20"),
    ),
    _m(
        "claude-mythos-5-2",
        "current",
        thinking=frozenset({"adaptive"}),
        effort=_ALL_EFFORT,
        forced_tool_choice=False,
        sampling=False,
        thinking_budget=False,
        cache_min_tokens=512,  # UNSOURCED (Mythos 5: 512)
        prices=_p("8", "40", "10", "16", "0.20"),  # as Fable 5.2, see above
    ),
    # Opus 5.5: 1M / 128K, $4 / $20, writes $5 / $8, reads $0.20; thinking cannot be
    # disabled, forced tool use returns an error (overview page, "Breaking changes").
    _m(
        "claude-opus-5-5",
        "current",
        thinking=frozenset({"adaptive"}),
        effort=_ALL_EFFORT,  # xhigh / max on Opus 5.5: UNSOURCED (the levels the SDK knows)
        forced_tool_choice=False,
        sampling=False,
        thinking_budget=False,
        cache_min_tokens=512,  # UNSOURCED for 5.5 (Opus 5: 512)
        prices=_p("4", "20", "5", "8", "0.20"),
    ),
    # Sonnet 5.5: 1M / 128K, $2 / $10, writes $2.50 / $4; cache reads cut to $0.10 (0.05x)
    # on 2026-10-07 (pricing page as quoted by price trackers; the stored overview page
    # still shows $0.20). Thinking adaptive, off with "disabled" or "between_tools";
    # forced tool use returns an error (overview page).
    _m(
        "claude-sonnet-5-5",
        "current",
        thinking=frozenset({"adaptive", "disabled", "between_tools"}),
        effort=_ALL_EFFORT,  # xhigh / max: UNSOURCED
        forced_tool_choice=False,
        sampling=False,
        thinking_budget=False,
        cache_min_tokens=1024,  # UNSOURCED for 5.5 (Sonnet 5: 1,024)
        prices=_p("2", "10", "2.50", "4", "0.10"),
    ),
    # Haiku 5.5: 1M / 128K; $0.10 / $0.50, writes $0.125 / $0.20, reads $0.01 for prompts
    # up to 100,000 tokens; $0.50 / $2.50, $0.625 / $1.00, $0.05 over (overview page).
    # Effort low..max, adaptive thinking by default (overview page, API guide).
    _m(
        "claude-haiku-5-5",
        "current",
        thinking=frozenset({"adaptive", "disabled"}),
        effort=_ALL_EFFORT,
        forced_tool_choice=False,  # "current models refuse" (issue #19); page: UNSOURCED
        sampling=False,
        thinking_budget=False,
        cache_min_tokens=1024,  # UNSOURCED
        prices=_p("0.10", "0.50", "0.125", "0.20", "0.01", bands=((100_000, _HAIKU_5_5_LONG),)),
    ),
    # ---- legacy, still served --------------------------------------------------------------
    # Fable 5.1 / Mythos 5.1: $10 / $50, writes $12.50 / $20, reads $0.25 (pricing page);
    # adaptive thinking only, forced tool use refused (Opus 5.5 page: "the first three
    # also apply to Claude Fable 5.1").
    _m(
        "claude-fable-5-1",
        "legacy",
        thinking=frozenset({"adaptive"}),
        effort=_ALL_EFFORT,
        forced_tool_choice=False,
        sampling=False,
        thinking_budget=False,
        cache_min_tokens=512,  # UNSOURCED for 5.1 (Fable 5: 512)
        prices=_p("10", "50", "12.50", "20", "0.25"),
    ),
    _m(
        "claude-mythos-5-1",
        "legacy",
        thinking=frozenset({"adaptive"}),
        effort=_ALL_EFFORT,
        forced_tool_choice=False,
        sampling=False,
        thinking_budget=False,
        cache_min_tokens=512,  # UNSOURCED
        prices=_p("10", "50", "12.50", "20", "0.25"),
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
    ),
    # Mythos Preview: adaptive thinking only (Bedrock page). Prices: UNSOURCED (not on the
    # stored pricing page); $25 / $125 as announced for the research preview.
    _m(
        "claude-mythos-preview",
        "legacy",
        thinking=frozenset({"adaptive"}),
        effort=_ALL_EFFORT,
        forced_tool_choice=True,
        sampling=False,  # UNSOURCED
        thinking_budget=False,
        cache_min_tokens=1024,  # UNSOURCED
        prices=_p("25", "125", "31.25", "50", "2.50"),  # UNSOURCED
    ),
    # Opus 4.6 / Sonnet 4.6: adaptive, or budgets (deprecated); effort low..high, max on
    # Opus 4.6 only; minimums 4,096 (Opus 4.6) and 1,024 (Sonnet 4.6).
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
        max_output=64_000,  # 4.6 windows / outputs (1M / 128K, 1M / 64K): UNSOURCED
        thinking=frozenset({"adaptive", "enabled", "disabled"}),
        effort=frozenset({"low", "medium", "high"}),
        forced_tool_choice=True,
        sampling=True,
        thinking_budget=True,
        cache_min_tokens=1024,
        prices=_p("3", "15", "3.75", "6", "0.30"),
    ),
    # Opus 4.5: 200K / 64K, $5 / $25, budgets, effort low..high; minimum 4,096.
    _m(
        "claude-opus-4-5",
        "legacy",
        context_window=200_000,
        max_output=64_000,
        thinking=frozenset({"enabled", "disabled"}),
        thinking_display=frozenset(),  # display: UNSOURCED for 4.5, refused here
        effort=frozenset({"low", "medium", "high"}),
        forced_tool_choice=True,
        sampling=True,
        thinking_budget=True,
        server_tools=_EARLY_SERVER_TOOLS,
        cache_min_tokens=4096,
        prices=_p("5", "25", "6.25", "10", "0.50"),
    ),
    # Sonnet 4.5: 200K / 64K, $3 / $15, writes $3.75 / $6, reads $0.30; minimum 1,024.
    # Still on the pricing page; kept for the projects that run it.
    _m(
        "claude-sonnet-4-5",
        "legacy",
        context_window=200_000,
        max_output=64_000,
        thinking=frozenset({"enabled", "disabled"}),
        thinking_display=frozenset(),
        effort=frozenset(),
        forced_tool_choice=True,
        sampling=True,
        thinking_budget=True,
        server_tools=_EARLY_SERVER_TOOLS,
        cache_min_tokens=1024,
        prices=_p("3", "15", "3.75", "6", "0.30"),
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
        server_tools=_EARLY_SERVER_TOOLS,
        cache_min_tokens=4096,
        prices=_p("1", "5", "1.25", "2", "0.10"),
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


def _lookup(table: Mapping[str, ModelInfo], model: str) -> ModelInfo | None:
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
    return _lookup(SHIPPED, model)


# ---- settings and the refreshed file ----------------------------------------------------

_PRICE_FIELDS = tuple(f.name for f in fields(Prices) if f.name != "bands")
_INFO_FIELDS = {f.name for f in fields(ModelInfo)} - {"id"}
_SET_FIELDS = {"thinking", "thinking_display", "effort", "server_tools"}
_INT_FIELDS = {"context_window", "max_output", "cache_min_tokens"}
_BOOL_FIELDS = {"forced_tool_choice", "sampling", "thinking_budget", "structured_output"}


class CatalogError(ValueError):
    """An AGENTRUN_MODELS / AGENTRUN_MODELS_FILE entry that does not make a model."""


def _decimal(value: Any, where: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise CatalogError(f"{where}: expected a number, got {value!r}")
    try:
        result = D(str(value))
    except InvalidOperation:
        raise CatalogError(f"{where}: expected a number, got {value!r}") from None
    if not result.is_finite() or result < 0:
        raise CatalogError(f"{where}: expected a number >= 0, got {value!r}")
    return result


def _merge_prices(base: Prices | None, raw: Any, where: str) -> Prices:
    if isinstance(raw, Prices):
        return raw
    if not isinstance(raw, Mapping):
        raise CatalogError(f"{where}: expected a dict of prices, got {type(raw).__name__}")
    unknown = set(raw) - set(_PRICE_FIELDS) - {"bands"}
    if unknown:
        raise CatalogError(
            f"{where}: unknown price field(s) {sorted(unknown)} (known: {', '.join(_PRICE_FIELDS)}, bands)"
        )
    values: dict[str, Any] = {}
    for name in _PRICE_FIELDS:
        if name in raw:
            values[name] = _decimal(raw[name], f"{where}.{name}")
        elif base is not None:
            values[name] = getattr(base, name)
        elif name in ("input", "output", "cache_write_5m", "cache_write_1h", "cache_read"):
            raise CatalogError(f"{where}: a new model needs prices.{name}")
    bands: tuple[tuple[int, Prices], ...] = base.bands if base is not None else ()
    if "bands" in raw:
        if not isinstance(raw["bands"], list | tuple):
            raise CatalogError(f"{where}.bands: expected a list of [threshold, prices]")
        built = []
        for i, band in enumerate(raw["bands"]):
            if not (isinstance(band, list | tuple) and len(band) == 2):
                raise CatalogError(f"{where}.bands[{i}]: expected [threshold, prices]")
            threshold, band_prices = band
            if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0:
                raise CatalogError(f"{where}.bands[{i}]: threshold must be an int >= 0")
            top = Prices(**{k: v for k, v in values.items()})
            built.append((threshold, _merge_prices(top, band_prices, f"{where}.bands[{i}]")))
        bands = tuple(built)
    return Prices(**values, bands=bands)


def _merge(base: ModelInfo | None, model: str, raw: Any, where: str) -> ModelInfo:
    """`raw` (a partial dict) merged over `base`; a new model names every field (or `like`)."""
    if not isinstance(raw, Mapping):
        raise CatalogError(f"{where}: expected a dict, got {type(raw).__name__}")
    raw = dict(raw)
    like = raw.pop("like", None)
    if like is not None:
        base = shipped_info(like) if isinstance(like, str) else None
        if base is None:
            raise CatalogError(f"{where}.like: {like!r} is not a model of the shipped table")
    unknown = set(raw) - _INFO_FIELDS
    if unknown:
        raise CatalogError(
            f"{where}: unknown field(s) {sorted(unknown)} (known: {', '.join(sorted(_INFO_FIELDS))}, like)"
        )
    values: dict[str, Any] = {}
    for name in sorted(_INFO_FIELDS):
        if name not in raw:
            if base is None:
                raise CatalogError(
                    f"{where}: {model!r} is not in the shipped table: give every field, "
                    f"or 'like' a shipped model (missing {name!r})"
                )
            values[name] = getattr(base, name)
            continue
        value = raw[name]
        if name == "prices":
            values[name] = _merge_prices(base.prices if base else None, value, f"{where}.prices")
        elif name in _SET_FIELDS:
            if isinstance(value, str) or not isinstance(value, Iterable):
                raise CatalogError(f"{where}.{name}: expected a list of strings")
            items = frozenset(value)
            allowed = {
                "thinking": THINKING_TYPES,
                "thinking_display": THINKING_DISPLAYS,
                "effort": frozenset(EFFORT_LEVELS),
                "server_tools": None,
            }[name]
            bad = sorted(str(i) for i in items if not isinstance(i, str))
            if not bad and allowed is not None:
                bad = sorted(items - allowed)
            if bad:
                raise CatalogError(f"{where}.{name}: unknown value(s) {bad}")
            values[name] = items
        elif name in _INT_FIELDS:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise CatalogError(f"{where}.{name}: expected an int >= 0, got {value!r}")
            values[name] = value
        elif name in _BOOL_FIELDS:
            if not isinstance(value, bool):
                raise CatalogError(f"{where}.{name}: expected true or false, got {value!r}")
            values[name] = value
        elif name == "status":
            if value not in STATUSES:
                raise CatalogError(f"{where}.status: expected 'current' or 'legacy'")
            values[name] = value
    return ModelInfo(id=model, **values)


_file_cache: dict[str, Any] = {"key": None, "data": {}}
_file_lock = threading.Lock()


def _refreshed() -> dict[str, dict[str, Any]]:
    """The capabilities `agentrun_models refresh` stored, re-read when the file changes."""
    from .conf import agentrun_settings

    path = agentrun_settings.MODELS_FILE
    if not path:
        return {}
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return {}
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    with _file_lock:
        if _file_cache["key"] == key:
            return _file_cache["data"]
        try:
            with open(path, encoding="utf-8") as fh:
                payload = json.load(fh)
        except (OSError, ValueError) as exc:
            raise CatalogError(f"AGENTRUN_MODELS_FILE {path}: cannot be read: {exc}") from None
        data = payload.get("models", {}) if isinstance(payload, dict) else None
        if not isinstance(data, dict):
            raise CatalogError(f"AGENTRUN_MODELS_FILE {path}: expected {{'models': {{...}}}}")
        _file_cache["key"] = key
        _file_cache["data"] = data
        return data


def _legacy_prices() -> dict[str, dict[str, Any]]:
    """AGENTRUN_PRICES (deprecated) in the AGENTRUN_MODELS price vocabulary."""
    from .conf import agentrun_settings

    out: dict[str, dict[str, Any]] = {}
    for model, raw in (agentrun_settings.PRICES or {}).items():
        if not isinstance(raw, Mapping):
            raise CatalogError(f"AGENTRUN_PRICES[{model!r}]: expected a dict")
        prices = {k: v for k, v in raw.items() if k != "cache_write"}
        if "cache_write" in raw:  # the old single cache-write price was the 5-minute one
            prices.setdefault("cache_write_5m", raw["cache_write"])
        out[model] = prices
    return out


def _effective(model: str) -> ModelInfo | None:
    from .conf import agentrun_settings

    overrides = agentrun_settings.MODELS or {}
    if not isinstance(overrides, Mapping):
        raise CatalogError("AGENTRUN_MODELS: expected a dict of model id -> dict")
    key = model
    base = shipped_info(model)
    if model not in overrides and base is not None:
        key = base.id
    refreshed = _refreshed().get(key)
    info = base
    if refreshed is not None and info is not None:
        info = _merge(info, key, refreshed, f"AGENTRUN_MODELS_FILE[{key!r}]")
    legacy = _legacy_prices()
    if key in legacy or model in legacy:
        raw_prices = legacy.get(model, legacy.get(key))
        if info is None:
            # A price-only entry for a model the table lacks: priced, capabilities unknown
            # (nothing is refused for it).
            info = _unknown_capabilities(key)
        info = _merge(info, key, {"prices": raw_prices}, f"AGENTRUN_PRICES[{key!r}]")
    if key in overrides:
        info = _merge(info, key, overrides[key], f"AGENTRUN_MODELS[{key!r}]")
    return info


def _unknown_capabilities(model: str) -> ModelInfo:
    return ModelInfo(
        id=model,
        status="legacy",
        context_window=0,
        max_output=0,
        thinking=THINKING_TYPES,
        thinking_display=THINKING_DISPLAYS,
        effort=frozenset(EFFORT_LEVELS),
        forced_tool_choice=True,
        sampling=True,
        thinking_budget=True,
        structured_output=True,
        server_tools=SERVER_TOOL_TYPES,
        cache_min_tokens=0,
        prices=Prices(D(0), D(0), D(0), D(0), D(0)),
    )


def model_info(model: str) -> ModelInfo | None:
    """`model`'s entry: shipped, with the refreshed capabilities and AGENTRUN_MODELS over it.

    Raises django.core.exceptions.ImproperlyConfigured for an override that does not make
    a model (manage.py check reports the same as agentrun.E020).
    """
    try:
        return _effective(model)
    except CatalogError as exc:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(str(exc)) from None


def known_models() -> list[str]:
    """Every id model_info answers for (shipped, AGENTRUN_MODELS, AGENTRUN_PRICES)."""
    from .conf import agentrun_settings

    ids = set(SHIPPED) | set(agentrun_settings.MODELS or {}) | set(agentrun_settings.PRICES or {})
    return sorted(ids)


def catalog_errors() -> list[str]:
    """What is wrong with AGENTRUN_MODELS / AGENTRUN_PRICES / AGENTRUN_MODELS_FILE."""
    from .conf import agentrun_settings

    errors: list[str] = []
    overrides = agentrun_settings.MODELS
    if overrides is not None and not isinstance(overrides, Mapping):
        return ["AGENTRUN_MODELS: expected a dict of model id -> dict"]
    prices = agentrun_settings.PRICES
    if prices is not None and not isinstance(prices, Mapping):
        return ["AGENTRUN_PRICES: expected a dict of model id -> dict"]
    for model in sorted(set(overrides or {}) | set(prices or {}) | set(SHIPPED)):
        try:
            _effective(model)
        except CatalogError as exc:
            errors.append(str(exc))
    return sorted(set(errors))


# ---- refusals ---------------------------------------------------------------------------


def _is_server_tool(tool_type: Any) -> bool:
    return isinstance(tool_type, str) and tool_type.startswith(_SERVER_TOOL_PREFIXES)


def refusals(model: str, params: Mapping[str, Any], *, shipped_only: bool = False) -> list[str]:
    """One message per option in a Messages API request's `params` that `model` refuses.

    Unknown model: [] (manage.py check warns about the model itself).
    """
    info = shipped_info(model) if shipped_only else model_info(model)
    if info is None:
        return []
    out: list[str] = []
    name = model

    max_tokens = params.get("max_tokens")
    if (
        isinstance(max_tokens, int)
        and not isinstance(max_tokens, bool)
        and info.max_output
        and max_tokens > info.max_output
    ):
        out.append(f"{name} does not accept max_tokens {max_tokens} (at most {info.max_output})")

    thinking = params.get("thinking")
    if isinstance(thinking, Mapping):
        kind = thinking.get("type")
        if kind not in info.thinking:
            accepted = ", ".join(sorted(info.thinking)) or "none"
            out.append(f"{name} does not accept thinking.type {kind!r} (accepts: {accepted})")
        elif kind == "enabled" and not info.thinking_budget:
            out.append(f"{name} does not accept thinking.budget_tokens")
        display = thinking.get("display")
        if display is not None and display not in info.thinking_display:
            out.append(f"{name} does not accept thinking.display {display!r}")

    output_config = params.get("output_config")
    if isinstance(output_config, Mapping):
        effort = output_config.get("effort")
        if effort is not None and effort not in info.effort:
            if info.effort:
                accepted = ", ".join(e for e in EFFORT_LEVELS if e in info.effort)
                out.append(
                    f"{name} does not accept output_config.effort {effort!r} (accepts: {accepted})"
                )
            else:
                out.append(f"{name} does not accept output_config.effort")
        if output_config.get("format") is not None and not info.structured_output:
            out.append(f"{name} does not accept output_config.format")

    tool_choice = params.get("tool_choice")
    if isinstance(tool_choice, Mapping) and tool_choice.get("type") in ("any", "tool"):
        if not info.forced_tool_choice:
            out.append(f"{name} does not accept tool_choice {{'type': {tool_choice['type']!r}}}")

    if not info.sampling:
        for option in ("temperature", "top_p", "top_k"):
            value = params.get(option)
            if value is None or (option == "temperature" and value == 1):
                continue  # absent, or the default (1.0) the API accepts
            out.append(f"{name} does not accept {option}")

    tools = params.get("tools")
    if isinstance(tools, list | tuple):
        for tool in tools:
            if not isinstance(tool, Mapping):
                continue
            tool_type = tool.get("type")
            if _is_server_tool(tool_type) and tool_type not in info.server_tools:
                out.append(f"{name} does not accept the server tool {tool_type}")
    return out
