"""A run's configuration as the code reads it: `RunConfig`, frozen and typed.

Its stored form is the JSON snapshot a run (and a conversation) keeps, `Run.config`: what
`Agent.snapshot` made of the Agent, the run's own options and the model table (the options
as the model takes them) when it started, so that later code changes don't alter its
limits. `RunConfig.of(stored)` reads that form once, applying the defaults
(AGENTRUN_DEFAULT_MAX_TOKENS and the rest) here and nowhere else; whoever needs a run's
configuration is given the RunConfig (the engine's `Step.config`, built once per claim),
never the dict. `Agent.run_config(options)` builds one from an agent directly.

Its dicts and lists are the stored form's values: read them, copy them to change them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .conf import agentrun_settings


@dataclass(frozen=True)
class RunConfig:
    """A run's configuration (see the module's docstring). Field names are the stored
    form's keys."""

    model: str
    max_tokens: int
    max_turns: int
    max_tool_calls_per_turn: int
    repeat_threshold: int
    repeat_window: int
    # The system prompt as stored: text, or text blocks (`system_blocks`: always blocks).
    system: str | list[dict[str, Any]] = ""
    tools: list[dict[str, Any]] = field(default_factory=list)
    # The agent's and the run's options as request params (agent_options.request_options).
    options: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    budget: dict[str, Any] = field(default_factory=dict)
    prompt_caching: bool = True
    cache_ttl: str = "5m"
    context_management: dict[str, Any] | None = None
    continue_on_max_tokens: bool = False
    side_effects: dict[str, str] = field(default_factory=dict)
    # The tools of its agent's MCP servers as listed when it began: name -> record (mcp/).
    mcp_tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    deadline_seconds: float | None = None
    # Whether the snapshot says the agent's time limit (runs snapshotted before it was
    # kept do not: their agent as registered now says it).
    deadline_snapshotted: bool = False
    approval_timeout_seconds: float | None = None

    @classmethod
    def of(cls, stored: Mapping[str, Any] | None) -> RunConfig:
        """The RunConfig of a stored configuration snapshot (None or {}: the defaults)."""
        s = agentrun_settings
        stored = stored or {}
        return cls(
            model=stored.get("model") or "",
            max_tokens=stored.get("max_tokens") or s.DEFAULT_MAX_TOKENS,
            max_turns=stored.get("max_turns") or s.DEFAULT_MAX_TURNS,
            max_tool_calls_per_turn=stored.get("max_tool_calls_per_turn")
            or s.DEFAULT_MAX_TOOL_CALLS_PER_TURN,
            repeat_threshold=stored.get("repeat_threshold") or s.REPEAT_THRESHOLD,
            repeat_window=stored.get("repeat_window") or s.REPEAT_WINDOW,
            system=stored.get("system") or "",
            tools=stored.get("tools") or [],
            options=stored.get("options") or {},
            metadata=stored.get("metadata") or {},
            budget=stored.get("budget") or {},
            prompt_caching=bool(stored.get("prompt_caching", True)),
            cache_ttl=stored.get("cache_ttl") or "5m",
            context_management=stored.get("context_management"),
            continue_on_max_tokens=bool(stored.get("continue_on_max_tokens")),
            side_effects=stored.get("side_effects") or {},
            mcp_tools=stored.get("mcp_tools") or {},
            deadline_seconds=stored.get("deadline_seconds"),
            deadline_snapshotted="deadline_seconds" in stored,
            approval_timeout_seconds=stored.get("approval_timeout_seconds"),
        )

    # The system prompt as the request sends it: text blocks (made from `system`).
    system_blocks: list[dict[str, Any]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        system = self.system
        if isinstance(system, str):
            system = [{"type": "text", "text": system}] if system else []
        object.__setattr__(self, "system_blocks", system)

    @property
    def output_format(self) -> dict[str, Any] | None:
        """The structured output's `output_config.format` (its JSON schema), if any."""
        return (self.options.get("output_config") or {}).get("format")

    def request_params(self) -> dict[str, Any]:
        """The Messages API params a run sends beside its messages: model, max_tokens,
        system, tools and the options (what `catalog.refusals(model, params)` checks)."""
        params: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens}
        if self.system:
            params["system"] = self.system
        if self.tools:
            params["tools"] = list(self.tools)
        params.update(self.options)
        return params
