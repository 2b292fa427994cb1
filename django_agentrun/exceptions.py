"""One root exception; every error the app raises on purpose derives from it."""

from __future__ import annotations

from typing import Any


class AgentRunError(Exception):
    """django-agentrun error."""

    code = "agentrun_error"

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.__doc__ or self.code)


class InvalidTransition(AgentRunError):
    """This state change is not allowed from the current state."""

    code = "invalid_transition"


class ConcurrentUpdate(AgentRunError):
    """Someone else changed this object first; reload and decide again."""

    code = "concurrent_update"


class LeaseLost(AgentRunError):
    """This worker no longer holds the run's lease; its writes are refused."""

    code = "lease_lost"


class AppendOnlyError(AgentRunError):
    """Run events are append-only: they cannot be updated or deleted."""

    code = "append_only"


class UnknownAgent(AgentRunError):
    """No agent is registered under this name."""

    code = "unknown_agent"


class ApprovalError(AgentRunError):
    """This approval decision cannot be applied."""

    code = "approval_error"


class InvalidArguments(ApprovalError):
    """The edited arguments do not match the tool's input schema."""

    code = "invalid_arguments"


class InvalidToken(ApprovalError):
    """The approval token is invalid, stale or forged."""

    code = "invalid_token"


class ToolError(AgentRunError):
    """Raise from a tool handler to return an is_error result with this message to the model.

    `content`: what the model reads instead of the message (a ToolResult, or a JSON value),
    e.g. an MCP server's own error result."""

    code = "tool_error"

    def __init__(self, message: str = "", *, content: Any = None) -> None:
        super().__init__(message)
        self.content = content


class ToolCancelled(AgentRunError):
    """The tool was cancelled (the run was cancelled or timed out)."""

    code = "tool_cancelled"


class ToolOutcomeUnknown(ToolCancelled):
    """The handler cannot tell whether its effect happened (an MCP server's connection was
    lost while the call was out): nothing is recorded, the call stays in flight, and the
    recovery policy of its side-effect class applies, as after a crash."""

    code = "tool_outcome_unknown"


class MCPUnavailable(AgentRunError):
    """An MCP server the agent takes tools from cannot be reached to list them: the run (or
    conversation) is not started; try again later."""

    code = "mcp_unavailable"


class StartRefused(AgentRunError):
    """You may not start this agent (its `api_start` rule, `AGENTRUN_API_START`), or act
    with the credentials of another user's run: the API's 403 `permission_denied`."""

    code = "permission_denied"


class ConfigurationError(AgentRunError):
    """django-agentrun is misconfigured."""

    code = "configuration_error"


class InvalidInput(AgentRunError, ValueError):
    """The input is not valid for this operation."""

    code = "invalid_input"


class InvalidOption(InvalidInput):
    """A request option (of an agent or a run) has a value the Messages API refuses."""

    code = "invalid_option"


class OptionRefused(InvalidOption):
    """The agent's model refuses a request option the agent or the run sets."""

    code = "option_refused"


class IdempotencyConflict(AgentRunError):
    """The idempotency key was used for a request that asked for something else (another
    agent, input, metadata, deadline, options or context): the API's 422."""

    code = "idempotency_key_reused"


class RunNotActive(InvalidTransition):
    """The run is not active."""

    code = "run_not_active"


class InvalidContent(InvalidInput):
    """These content blocks are not what the Messages API accepts."""

    code = "invalid_content"


class ConversationBusy(InvalidTransition):
    """A run of this conversation is active, and the message's policy is `reject`."""

    code = "conversation_busy"


def stopping_cause(exc: BaseException) -> BaseException | None:
    """The SystemExit or KeyboardInterrupt behind `exc` (its causes and contexts, or named
    in the message of an exception that wrapped it without chaining it: pydantic-core's
    SchemaError when the stop lands in a lazy model build), or None. A process being
    stopped (Celery terminating a pool child) raises SystemExit wherever it is; code that
    turns exceptions into outcomes re-raises this instead, so the stop stays a stop (the run
    is recovered from its lease) and never becomes a failed request or a tool's error."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (SystemExit, KeyboardInterrupt)):
            return current
        current = current.__cause__ or current.__context__
    if type(exc).__name__ == "SchemaError" and "SystemExit" in str(exc):
        return SystemExit(1)
    return None
