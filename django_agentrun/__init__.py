"""django-agentrun: durable Claude tool-use agent runs for Django and Celery."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

# The one version number is pyproject.toml's; the installed metadata carries it.
try:
    __version__ = version("django-agentrun")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "Agent",
    "Budget",
    "ClearToolUses",
    "Compaction",
    "Reconciliation",
    "SideEffect",
    "ToolContext",
    "ToolError",
    "ToolResult",
    "approve_tool_call",
    "cancel_run",
    "fork_run",
    "reject_tool_call",
    "replace_tool_result",
    "resolve_tool_call",
    "resume_run",
    "send_message",
    "server_tool",
    "start_conversation",
    "start_run",
    "stop_conversation",
    "tool",
]

_LAZY = {
    "Agent": "agents",
    "Budget": "agents",
    "ClearToolUses": "servertools",
    "Compaction": "servertools",
    "server_tool": "servertools",
    "Reconciliation": "tools",
    "ToolContext": "tools",
    "tool": "tools",
    "SideEffect": "states",
    "ToolError": "exceptions",
    "ToolResult": "content",
    "start_run": "services",
    "cancel_run": "services",
    "fork_run": "services",
    "resume_run": "services",
    "approve_tool_call": "services",
    "reject_tool_call": "services",
    "resolve_tool_call": "services",
    "replace_tool_result": "services",
    "start_conversation": "services",
    "send_message": "services",
    "stop_conversation": "services",
}

if TYPE_CHECKING:
    from .agents import Agent, Budget
    from .content import ToolResult
    from .exceptions import ToolError
    from .servertools import ClearToolUses, Compaction, server_tool
    from .services import (
        approve_tool_call,
        cancel_run,
        fork_run,
        reject_tool_call,
        replace_tool_result,
        resolve_tool_call,
        resume_run,
        send_message,
        start_conversation,
        start_run,
        stop_conversation,
    )
    from .states import SideEffect
    from .tools import Reconciliation, ToolContext, tool


def __getattr__(name: str) -> Any:
    # Lazy so that importing the package (e.g. for the AppConfig) does not load models early.
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
