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
beside it; override it with AGENTRUN_MODELS when you know better. The request rules
(RULES, rules.py) each name the page they come from, or say UNSOURCED.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .overrides import CatalogError, catalog_errors, known_models, model_info, reset
from .rules import RULES, Rule, applied
from .table import SHIPPED, shipped_info
from .vocabulary import (
    CODE_EXECUTION,
    EFFORT_LEVELS,
    REFUSAL_BILLED_CATEGORIES,
    SERVER_TOOL_TYPES,
    THINKING_DISPLAYS,
    THINKING_TYPES,
    TOOL_SEARCH,
    US_ONLY_MULTIPLIER,
    WEB_FETCH,
    WEB_SEARCH,
    ModelInfo,
    Prices,
)

__all__ = [
    "CODE_EXECUTION",
    "RULES",
    "EFFORT_LEVELS",
    "REFUSAL_BILLED_CATEGORIES",
    "SERVER_TOOL_TYPES",
    "SHIPPED",
    "THINKING_DISPLAYS",
    "THINKING_TYPES",
    "TOOL_SEARCH",
    "US_ONLY_MULTIPLIER",
    "WEB_FETCH",
    "WEB_SEARCH",
    "CatalogError",
    "ModelInfo",
    "Prices",
    "Rule",
    "catalog_errors",
    "known_models",
    "model_info",
    "refusals",
    "reset",
    "shipped_info",
]


# ---- refusals ---------------------------------------------------------------------------


def refusals(model: str, params: Mapping[str, Any], *, shipped_only: bool = False) -> list[str]:
    """One message per option (or combination) in a Messages API request's `params` that
    `model` refuses, each from a rule of RULES (rules.py, with its source).

    Unknown model: [] (manage.py check warns about the model itself).
    """
    info = shipped_info(model) if shipped_only else model_info(model)
    if info is None:
        return []
    return [message for _, message in applied(info, params)]
