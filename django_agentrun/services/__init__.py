"""The public commands: start, cancel and resume runs; decide on tool calls; start, message
and stop conversations. Admin actions, API views, tasks and management commands call these
(or the reaper); each command is one unit of work made of transitions (transitions.py); a
fork (forks.py) copies a run's history into a new run; a conversation's message
(conversations.py) starts a run whose history is read from the earlier runs; who may
begin a run on a person's behalf is asked first (authority.py)."""

from __future__ import annotations

from ..store import lost_race
from ..tokens import TOKEN_SALT, approval_token, check_approval_token
from .authority import check_begin, fork_owner, startable
from .conversations import send_message, start_conversation, stop_conversation
from .decisions import (
    approve_tool_call,
    reject_tool_call,
    replace_tool_result,
    resolve_tool_call,
)
from .describe import tool_definition, tool_description
from .forks import ForkPoint, ForkRefused, fork_points, fork_run
from .runs import add_cancel, cancel_run, resume_run, start_run, validate_input

__all__ = [
    "TOKEN_SALT",
    "add_cancel",
    "ForkPoint",
    "ForkRefused",
    "approval_token",
    "approve_tool_call",
    "cancel_run",
    "check_approval_token",
    "check_begin",
    "fork_owner",
    "fork_points",
    "fork_run",
    "lost_race",
    "reject_tool_call",
    "replace_tool_result",
    "resolve_tool_call",
    "resume_run",
    "send_message",
    "start_conversation",
    "start_run",
    "startable",
    "stop_conversation",
    "tool_definition",
    "tool_description",
    "validate_input",
]
