"""Agent definitions and their registry (filled from installed apps' agents.py)."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from .conf import agentrun_settings
from .exceptions import ConfigurationError, UnknownAgent
from .servertools import ContextStrategy, check_server_tools, context_params
from .tools import Tool

logger = logging.getLogger(__name__)

_registry: dict[str, Agent] = {}


@dataclass(frozen=True)
class Budget:
    """Limits of a run; any subset. Checked before each turn against a conservative estimate."""

    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    max_cache_creation_tokens: int | None = None
    max_cache_read_tokens: int | None = None
    max_total_tokens: int | None = None
    max_cost_usd: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if value is not None}


class Agent:
    """A named agent: model, system prompt, tools and limits. Registered by name on creation."""

    def __init__(
        self,
        name: str,
        *,
        model: str | None = None,
        system: str = "",
        tools: list[Tool] | tuple[Tool, ...] = (),
        max_turns: int | None = None,
        max_tool_calls_per_turn: int | None = None,
        max_tokens: int | None = None,
        budget: Budget | None = None,
        repeat_threshold: int | None = None,
        repeat_window: int | None = None,
        deadline: timedelta | None = None,
        approval_timeout: timedelta | None = None,
        prompt_caching: bool | None = None,
        server_tools: list[dict[str, Any]] | tuple[dict[str, Any], ...] = (),
        defer_loading: list[str] | tuple[str, ...] = (),
        context_management: ContextStrategy | None = None,
        register: bool = True,
    ) -> None:
        if not name:
            raise ConfigurationError("An agent needs a name")
        for item in tools:
            if not isinstance(item, Tool):
                raise ConfigurationError(f"Agent {name}: {item!r} is not a @tool")
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"Agent {name}: duplicate tool names {names}")
        self.name = name
        self.model = model
        self.system = system
        self.tools = {t.name: t for t in tools}
        self.max_turns = max_turns
        self.max_tool_calls_per_turn = max_tool_calls_per_turn
        self.max_tokens = max_tokens
        self.budget = budget or Budget()
        self.repeat_threshold = repeat_threshold
        self.repeat_window = repeat_window
        self.deadline = deadline
        self.approval_timeout = approval_timeout
        self.prompt_caching = prompt_caching
        # Run by the API itself (servertools.server_tool); their blocks are never our calls.
        check_server_tools(name, server_tools, self.tools, defer_loading)
        self.server_tools = [dict(t) for t in server_tools]
        self.defer_loading = frozenset(defer_loading)
        # Compaction(...) or ClearToolUses(...) (servertools): what the API keeps of a long run.
        self.context_management = context_management
        self._context_params = context_params(context_management)
        if max_turns is not None and max_turns < 1:
            raise ConfigurationError(f"Agent {name}: max_turns must be at least 1")
        if repeat_window is not None and repeat_window < 1:
            raise ConfigurationError(f"Agent {name}: repeat_window must be at least 1")
        if register:
            _registry[name] = self

    def __repr__(self) -> str:
        return f"<Agent {self.name}>"

    @property
    def waits_for_approvals(self) -> bool:
        """Whether its runs may wait for a person (a tool that may need approval)."""
        return any(t.requires_approval is not False for t in self.tools.values())

    def snapshot(self) -> dict[str, Any]:
        """The configuration a run keeps, so later code changes don't alter its limits."""
        s = agentrun_settings
        return {
            "model": self.model or s.DEFAULT_MODEL,
            "system": self.system,
            "tools": [
                *(
                    {**t.definition(), "defer_loading": True}
                    if t.name in self.defer_loading
                    else t.definition()
                    for t in self.tools.values()
                ),
                *self.server_tools,
            ],
            "side_effects": {t.name: str(t.side_effect) for t in self.tools.values()},
            "max_turns": self.max_turns or s.DEFAULT_MAX_TURNS,
            "max_tool_calls_per_turn": self.max_tool_calls_per_turn
            or s.DEFAULT_MAX_TOOL_CALLS_PER_TURN,
            "max_tokens": self.max_tokens or s.DEFAULT_MAX_TOKENS,
            "budget": self.budget.as_dict(),
            "repeat_threshold": self.repeat_threshold or s.REPEAT_THRESHOLD,
            "repeat_window": self.repeat_window or s.REPEAT_WINDOW,
            "prompt_caching": s.PROMPT_CACHING
            if self.prompt_caching is None
            else self.prompt_caching,
            # The cache outlives a wait for a person: 1 hour where a tool may need approval.
            "cache_ttl": "1h" if self.waits_for_approvals else "5m",
            "context_management": self._context_params,
            # resume_run starts the agent's time limit over when a resumed run had passed it.
            "deadline_seconds": self.deadline.total_seconds() if self.deadline else None,
            "approval_timeout_seconds": (
                self.approval_timeout.total_seconds() if self.approval_timeout else None
            ),
        }


def get_agent(name: str) -> Agent:
    try:
        return _registry[name]
    except KeyError:
        raise UnknownAgent(
            f"No agent named {name!r}. Define Agent(name={name!r}, ...) in an installed app's agents.py."
        ) from None


def registered_agents() -> dict[str, Agent]:
    return dict(_registry)


def unregister_agent(name: str) -> None:
    """Forget the agent named `name` (if any): for tests that define an agent of their own."""
    _registry.pop(name, None)
