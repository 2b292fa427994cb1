"""Agent definitions and their registry (filled from installed apps' agents.py)."""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from .access import api_rule, option_names, run_as_rule
from .agent_options import (
    RUN_OPTIONS,
    output_schema,
    request_options,
    strict_tool,
    system_blocks,
)
from .conf import agentrun_settings
from .exceptions import ConfigurationError, InvalidOption, UnknownAgent
from .mcp import MCPServer, snapshot_tools, tool_of_record
from .runconfig import RunConfig
from .servertools import ContextStrategy, MCPConnector, check_server_tools, context_params
from .tools import Tool

logger = logging.getLogger(__name__)

_registry: dict[str, Agent] = {}

SHARE_KEY_LENGTH = 200  # Run.share_key's max_length: a longer key is cut


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
    """A named agent: model, system prompt, tools and limits. Registered by name on creation.

    Among its options: `fair_share_key`, a function of a run naming the key its requests
    share the account's rate limit under (named once, when the run is created), and
    `max_concurrent_runs`, at most this many of its runs worked at once across every worker
    (docs/how-to/rate-limits.md)."""

    def __init__(
        self,
        name: str,
        *,
        model: str | None = None,
        system: str | list[dict[str, Any]] = "",
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
        server_tools: list[dict[str, Any] | MCPConnector]
        | tuple[dict[str, Any] | MCPConnector, ...] = (),
        defer_loading: list[str] | tuple[str, ...] = (),
        context_management: ContextStrategy | None = None,
        thinking: str | None = None,
        thinking_display: str | None = None,
        effort: str | None = None,
        output_format: Any = None,
        strict_tools: bool = False,
        tool_choice: str | Mapping[str, Any] | None = None,
        parallel_tool_use: bool | None = None,
        stop_sequences: list[str] | tuple[str, ...] = (),
        service_tier: str | None = None,
        continue_on_max_tokens: bool = False,
        context: Callable[[], str] | None = None,
        api_start: bool | str | Callable[[Any], bool] | None = None,
        client_options: Iterable[str] = (),
        run_as: str = "requester",
        fair_share_key: Callable[[Any], Any] | None = None,
        max_concurrent_runs: int | None = None,
        mcp_servers: list[MCPServer] | tuple[MCPServer, ...] = (),
        register: bool = True,
    ) -> None:
        if not name:
            raise ConfigurationError("An agent needs a name")
        for item in tools:
            if not isinstance(item, Tool):
                raise ConfigurationError(f"Agent {name}: {item!r} is not a @tool")
        _distinct(name, "tool names", [t.name for t in tools])
        self.name = name
        self.model = model
        self.system = system_blocks(system, f"Agent {name}")
        self.tools = {t.name: t for t in tools}
        # Tools from MCP servers (mcp/): listed when a run starts, kept in its snapshot.
        for server in mcp_servers:
            if not isinstance(server, MCPServer):
                raise ConfigurationError(f"Agent {name}: {server!r} is not an MCPServer")
        _distinct(name, "MCP server names", [s.name for s in mcp_servers])
        self.mcp_servers = {s.name: s for s in mcp_servers}
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
        # The Messages API's MCP connector (MCPConnector): a server tool with a server entry.
        connectors = [t for t in server_tools if isinstance(t, MCPConnector)]
        self.mcp_connectors = {c.name: c for c in connectors}
        if len(self.mcp_connectors) != len(connectors):
            raise ConfigurationError(f"Agent {name}: two MCP connectors of one name")
        server_tools = [t.toolset() if isinstance(t, MCPConnector) else t for t in server_tools]
        check_server_tools(name, server_tools, self.tools, defer_loading)
        self.server_tools = [dict(t) for t in server_tools]
        self.defer_loading = frozenset(defer_loading)
        # Compaction(...) or ClearToolUses(...) (servertools): what the API keeps of a long run.
        self.context_management = context_management
        self._context_params = context_params(context_management)
        self.options = {
            "thinking": thinking,
            "thinking_display": thinking_display,
            "effort": effort,
            "tool_choice": tool_choice,
            "parallel_tool_use": parallel_tool_use,
            "stop_sequences": stop_sequences,
            "service_tier": service_tier,
        }
        # Checked now, so a mistake fails where the agent is defined (ConfigurationError).
        try:
            request_options(self.options, tool_names=list(self.tools))
        except InvalidOption as exc:
            raise ConfigurationError(f"Agent {name}: {exc}") from None
        self.output_format = output_format
        self.output_schema = output_schema(output_format, f"Agent {name}")
        self.strict_tools = bool(strict_tools)
        self.continue_on_max_tokens = bool(continue_on_max_tokens)
        if context is not None and not callable(context):
            raise ConfigurationError(f"Agent {name}: context must be a callable returning text")
        self.context = context
        # Whose share of the account's rate limit a run's requests spend (the governor):
        # fair_share_key(run), e.g. its tenant; before AGENTRUN_FAIR_SHARE_KEY and the owner.
        if fair_share_key is not None and not callable(fair_share_key):
            raise ConfigurationError(
                f"Agent {name}: fair_share_key must be a callable taking the run"
            )
        self.fair_share_key = fair_share_key
        # At most this many of its runs worked at once (holding a lease), across workers.
        if max_concurrent_runs is not None and (
            isinstance(max_concurrent_runs, bool)
            or not isinstance(max_concurrent_runs, int)
            or max_concurrent_runs < 1
        ):
            raise ConfigurationError(
                f"Agent {name}: max_concurrent_runs must be a whole number of at least 1 "
                f"(or None), not {max_concurrent_runs!r}"
            )
        self.max_concurrent_runs = max_concurrent_runs
        # What API clients may do with it (access.py): start it, set these run options.
        self.api_start = api_rule(f"Agent {name}", api_start)
        self.client_options = option_names(f"Agent {name}", client_options, RUN_OPTIONS)
        self.run_as = run_as_rule(f"Agent {name}", run_as)
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
        return any(t.requires_approval is not False for t in self.tools.values()) or any(
            callable(o.get("requires_approval")) for s in self.mcp_servers.values()
            for o in s.tools.values()
        )  # fmt: skip

    def tool_of(self, config: RunConfig, name: str, run: Any = None) -> Tool | None:
        """The tool `name` of a run with this configuration: its own, or an MCP server's as
        the run's snapshot recorded it (None: neither has it any more)."""
        found = self.tools.get(name)
        if found is not None:
            return found
        record = config.mcp_tools.get(name)
        return tool_of_record(self.mcp_servers, record, run) if record is not None else None

    def run_config(self, overrides: Mapping[str, Any] | None = None) -> RunConfig:
        """The configuration a run of it with these options has, as the code reads it
        (without its MCP servers' tools: nothing is listed)."""
        return RunConfig.of(self.snapshot(overrides, mcp_tools=False))

    def snapshot(
        self,
        overrides: Mapping[str, Any] | None = None,
        *,
        owner: Any = None,
        mcp_tools: bool = True,
    ) -> dict[str, Any]:
        """The configuration a run keeps, so later code changes don't alter its limits.

        `overrides`: a run's own request options (`RUN_OPTIONS`), checked here (InvalidOption).
        With `mcp_tools`, its MCP servers' tools are listed now (with `owner`'s headers) and
        kept: the run sees them as they are now, however the servers change."""
        s = agentrun_settings
        options = dict(self.options)
        continue_on_max_tokens = self.continue_on_max_tokens
        if overrides:
            unknown = sorted(set(overrides) - set(RUN_OPTIONS))
            if unknown:
                raise InvalidOption(
                    f"Unknown run option(s) {', '.join(unknown)}; a run may set "
                    f"{', '.join(RUN_OPTIONS)}."
                )
            options.update({k: v for k, v in overrides.items() if k in options})
            if "continue_on_max_tokens" in overrides:
                if not isinstance(overrides["continue_on_max_tokens"], bool):
                    raise InvalidOption("continue_on_max_tokens must be true or false.")
                continue_on_max_tokens = overrides["continue_on_max_tokens"]
        model = self.model or s.DEFAULT_MODEL
        params = request_options(options, tool_names=list(self.tools), model=model)
        if self.mcp_connectors:  # tokens are added per request (model_turn), never kept
            params["mcp_servers"] = [c.server() for c in self.mcp_connectors.values()]
        if self.output_schema is not None:
            params.setdefault("output_config", {})["format"] = {
                "type": "json_schema",
                "schema": self.output_schema,
            }
        remote = (
            snapshot_tools(self.name, self.mcp_servers.values(), self.tools, owner)
            if mcp_tools and self.mcp_servers
            else {}
        )
        tools = [t.definition() for t in self.tools.values()]
        tools += [dict(r["definition"]) for r in remote.values()]
        if self.strict_tools:
            tools = [strict_tool(t) for t in tools]
        return {
            "model": model,
            "system": self.system,
            "tools": [
                *(
                    {**t, "defer_loading": True} if t["name"] in self.defer_loading else t
                    for t in tools
                ),
                *(dict(t) for t in self.server_tools),
            ],
            "options": params,
            "continue_on_max_tokens": continue_on_max_tokens,
            "side_effects": {
                **{t.name: str(t.side_effect) for t in self.tools.values()},
                **{name: r["side_effect"] for name, r in remote.items()},
            },
            "mcp_tools": remote,
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
            "cache_ttl": "1h"
            if self.waits_for_approvals or any(r["requires_approval"] for r in remote.values())
            else "5m",
            "context_management": self._context_params,
            # resume_run starts the agent's time limit over when a resumed run had passed it.
            "deadline_seconds": self.deadline.total_seconds() if self.deadline else None,
            "approval_timeout_seconds": (
                self.approval_timeout.total_seconds() if self.approval_timeout else None
            ),
        }


def _distinct(agent: str, what: str, names: list[str]) -> None:
    if len(set(names)) != len(names):
        raise ConfigurationError(f"Agent {agent}: duplicate {what} {names}")


def agent_request_params(
    agent_or_config: Agent | RunConfig | Mapping[str, Any],
) -> dict[str, Any]:
    """The Messages API params a run of an agent (or of a run's config snapshot) sends
    beside its messages: model, max_tokens, system, tools and the options, what
    `catalog.refusals(model, params)` checks (at manage.py check and at start_run)."""
    if isinstance(agent_or_config, Agent):
        return agent_or_config.run_config().request_params()
    if isinstance(agent_or_config, RunConfig):
        return agent_or_config.request_params()
    return RunConfig.of(agent_or_config).request_params()


def owner_user_id(owner: Any) -> str | None:
    """`metadata.user_id` for a run's owner: an opaque HMAC of its primary key (keyed by
    SECRET_KEY, salted), never an e-mail or a name; None without an owner."""
    pk = getattr(owner, "pk", None)
    if pk is None:
        return None
    key = hashlib.sha256(b"django_agentrun.metadata.user_id" + settings.SECRET_KEY.encode())
    return hmac.new(key.digest(), str(pk).encode(), hashlib.sha256).hexdigest()[:32]


def share_key(run: Any) -> str:
    """The fair-share key of a new run: what its agent's `fair_share_key(run)` names, else
    what AGENTRUN_FAIR_SHARE_KEY's function names, else its owner ("owner:<pk>"). A key
    function that raises (or names nothing) is logged and the next is asked: a run never
    fails for its share's name. Named once, when the run is created (Run.share_key)."""
    agent = _registry.get(run.agent)
    found = agent.fair_share_key if agent is not None else None
    if found is not None:
        key = _named_key(found, run, f"fair_share_key of agent {run.agent}")
        if key:
            return key
    path = agentrun_settings.FAIR_SHARE_KEY
    if path:
        key = _named_key(import_string(path), run, f"AGENTRUN_FAIR_SHARE_KEY {path}")
        if key:
            return key
    return f"owner:{run.owner_id or '-'}"


def _named_key(function: Callable[[Any], Any], run: Any, what: str) -> str | None:
    try:
        key = function(run)
    except Exception:  # noqa: BLE001 - the host's function: fall back, say so
        logger.warning("%s failed; the next key is used run_id=%s", what, run.pk, exc_info=True)
        return None
    key = "" if key is None else str(key)
    return key[:SHARE_KEY_LENGTH] or None


def run_tool(
    run: Any, name: str, *, agent: Agent | None = None, config: RunConfig | None = None
) -> Tool | None:
    """The tool `name` of `run` (the engine's, the decisions' and the surfaces' one lookup):
    its agent's own tool, or an MCP tool from the run's snapshot; None when neither has it.
    `agent`, `config`: the run's, when the caller has them (else looked up)."""
    agent = agent if agent is not None else _registry.get(run.agent)
    if agent is None:
        return None
    return agent.tool_of(config if config is not None else RunConfig.of(run.config), name, run)


def get_agent(name: str) -> Agent:
    try:
        return _registry[name]
    except KeyError:
        raise UnknownAgent(
            f"No agent named {name!r}. Define Agent(name={name!r}, ...) in an installed app's agents.py."
        ) from None


def capped_agents() -> bool:
    """Whether some agent caps its runs worked at once (max_concurrent_runs)."""
    return any(agent.max_concurrent_runs for agent in _registry.values())


def registered_agents() -> dict[str, Agent]:
    return dict(_registry)


def unregister_agent(name: str) -> None:
    """Forget the agent named `name` (if any): for tests that define an agent of their own."""
    _registry.pop(name, None)
