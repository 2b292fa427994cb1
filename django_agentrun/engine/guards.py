"""Loop guards and budgets: decided inside the state machine, before anything is sent."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from ..conf import agentrun_settings
from ..media import block_tokens
from ..tools import canonical_json

FINAL_TURN_NOTICE = (
    "This is your final turn: the turn limit of this run is reached and no tools are "
    "available any more. Answer now with your best result from what you have. If the task "
    "is not finished, give a structured partial-progress handoff: what was done, what is "
    "left, and what the next person should do."
)


def cost_of(model: str, usage: dict[str, int]) -> Decimal:
    """USD cost of one response's usage, from the price table (0 for an unpriced model)."""
    price = agentrun_settings.price_for(model)
    if price is None:
        return Decimal(0)
    total = (
        usage.get("input_tokens", 0) * price["input"]
        + usage.get("output_tokens", 0) * price["output"]
        + usage.get("cache_creation_input_tokens", 0) * price["cache_write"]
        + usage.get("cache_read_input_tokens", 0) * price["cache_read"]
    )
    return Decimal(str(round(total / 1_000_000, 6)))


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


def check_budget(
    budget: dict[str, Any],
    *,
    model: str,
    totals: dict[str, int],
    cost_usd: Decimal,
    next_prompt_tokens: int,
    max_tokens: int,
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
        price = agentrun_settings.price_for(model) or {}
        prompt_price = max(price.get("input", 0), price.get("cache_write", 0))
        next_cost = (next_prompt_tokens * prompt_price + max_tokens * price.get("output", 0)) / 1e6
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
