"""Loop guards and budgets: decided inside the state machine, before anything is sent."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from ..catalog import REFUSAL_BILLED_CATEGORIES, US_ONLY_MULTIPLIER, Prices, model_info
from ..media import block_tokens
from ..tools import canonical_json

FINAL_TURN_NOTICE = (
    "This is your final turn: the turn limit of this run is reached and no tools are "
    "available any more. Answer now with your best result from what you have. If the task "
    "is not finished, give a structured partial-progress handoff: what was done, what is "
    "left, and what the next person should do."
)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def cost_of(model: str, usage: Mapping[str, Any]) -> Decimal:
    """USD cost of one response's usage at `model`'s prices (catalog/): see `price`."""
    info = model_info(model)
    return price(info.prices if info is not None else None, usage)


def price(prices: Prices | None, usage: Mapping[str, Any]) -> Decimal:
    """USD cost of one response's usage at `prices` (a model's, catalog/), rounded to the
    micro-dollar the run's counter keeps; 0 for a model the table does not price (None).

    Cache writes are priced by TTL (usage.cache_creation; the flat
    cache_creation_input_tokens as 5-minute writes when the response has no split), and
    the whole request at the price band its prompt (input + cache writes + cache reads)
    falls in. Server tools: web search and web fetch requests per 1,000. Tokens of a
    response whose usage.inference_geo is "us" (US-only inference) at 1.1x, on every token
    category; the server tools' per-request fees at their price (UNSOURCED either way).
    """
    if prices is None:
        return Decimal(0)
    inp = _int(usage.get("input_tokens"))
    out = _int(usage.get("output_tokens"))
    read = _int(usage.get("cache_read_input_tokens"))
    split = usage.get("cache_creation")
    if isinstance(split, Mapping):
        write_5m = _int(split.get("ephemeral_5m_input_tokens"))
        write_1h = _int(split.get("ephemeral_1h_input_tokens"))
    else:
        write_5m, write_1h = _int(usage.get("cache_creation_input_tokens")), 0
    if prices.bands:
        prices = prices.for_prompt(inp + write_5m + write_1h + read)
    tokens = (
        inp * prices.input
        + out * prices.output
        + write_5m * prices.cache_write_5m
        + write_1h * prices.cache_write_1h
        + read * prices.cache_read
    ) / MILLION
    if usage.get("inference_geo") == "us":
        tokens *= US_ONLY_MULTIPLIER
    tools = usage.get("server_tool_use")
    requests = Decimal(0)
    if isinstance(tools, Mapping):
        requests = (
            _int(tools.get("web_search_requests")) * prices.web_search_per_1k
            + _int(tools.get("web_fetch_requests")) * prices.web_fetch_per_1k
        ) / THOUSAND
    return (tokens + requests).quantize(MICRO, rounding=ROUND_HALF_EVEN)


def refusal_billed(content: Sequence[Any], stop_details: Mapping[str, Any] | None) -> bool:
    """Whether a refused answer is billed: one that streamed output is (its input and the
    output streamed); one refused before any output only in the categories the docs name
    (catalog.REFUSAL_BILLED_CATEGORIES, with their source)."""
    if content:
        return True
    category = (stop_details or {}).get("category")
    return category in REFUSAL_BILLED_CATEGORIES


MILLION = Decimal(1_000_000)
THOUSAND = Decimal(1000)
MICRO = Decimal("0.000001")


def estimate_tokens(value: Any) -> int:
    """A cheap upper-ish estimate of tokens in a JSON-able value: 4 characters a token,
    except images and PDFs in content blocks, priced as the API bills them (media.py)
    rather than by the length of their base64."""
    media = 0

    def without_media(item: Any) -> Any:
        nonlocal media
        if isinstance(item, dict):
            tokens = block_tokens(item)
            if tokens is not None:
                media += tokens
                return {key: v for key, v in item.items() if key != "source"}
            return {key: without_media(v) for key, v in item.items()}
        if isinstance(item, list | tuple):
            return [without_media(v) for v in item]
        return item

    rest = without_media(value)
    text = rest if isinstance(rest, str) else canonical_json(rest)
    return len(text) // 4 + 1 + media


@dataclass(frozen=True)
class Breach:
    limit: str
    projected: float
    allowed: float

    def message(self) -> str:
        return (
            f"Budget {self.limit}={self.allowed} would be exceeded by the next turn "
            f"(projected {self.projected}); the run halted before sending it."
        )


def next_turn_cost(
    model: str, prompt_tokens: int, max_tokens: int, *, us_only: bool = False
) -> Decimal:
    """The most the next turn can cost at `model`'s prices: the whole prompt at the
    dearest prompt price (a 1-hour cache write, in the band that prompt falls in), and
    all of max_tokens of output (1.1x when the run's inference is US-only); 0 for a model
    the table does not price."""
    info = model_info(model)
    if info is None:
        return Decimal(0)
    prices = info.prices.for_prompt(prompt_tokens)
    prompt_price = max(prices.input, prices.cache_write_5m, prices.cache_write_1h)
    cost = (prompt_tokens * prompt_price + max_tokens * prices.output) / MILLION
    return cost * US_ONLY_MULTIPLIER if us_only else cost


def check_budget(
    budget: dict[str, Any],
    *,
    model: str,
    totals: dict[str, int],
    cost_usd: Decimal,
    next_prompt_tokens: int,
    max_tokens: int,
    us_only: bool = False,
) -> Breach | None:
    """Would the next turn breach a limit? Conservative: the whole next prompt may land
    in any one input counter, and the response may use all of max_tokens."""
    if not budget:
        return None
    projected = {
        "max_input_tokens": totals["input_tokens"] + next_prompt_tokens,
        "max_output_tokens": totals["output_tokens"] + max_tokens,
        "max_cache_creation_tokens": totals["cache_creation_input_tokens"] + next_prompt_tokens,
        "max_cache_read_tokens": totals["cache_read_input_tokens"] + next_prompt_tokens,
        "max_total_tokens": sum(totals.values()) + next_prompt_tokens + max_tokens,
    }
    for limit, value in projected.items():
        allowed = budget.get(limit)
        if allowed is not None and value > allowed:
            return Breach(limit, value, allowed)
    allowed_cost = budget.get("max_cost_usd")
    if allowed_cost is not None:
        next_cost = float(next_turn_cost(model, next_prompt_tokens, max_tokens, us_only=us_only))
        value = float(cost_usd) + next_cost
        if value > float(allowed_cost):
            return Breach("max_cost_usd", round(value, 6), allowed_cost)
    return None


def repeated(previous_hashes: Sequence[str], current: str, threshold: int, window: int) -> bool:
    """Is `current` the Nth identical call (N = threshold) among the last `window` calls,
    itself included? A window smaller than the threshold counts as the threshold, so N
    identical calls in a row are always caught."""
    if threshold < 2:
        return False
    recent = previous_hashes[-(max(window, threshold) - 1) :]
    return sum(1 for h in recent if h == current) >= threshold - 1
