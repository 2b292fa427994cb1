"""The permissions of agent runs, named once for every surface (admin, API).

The models declare them (`Meta.permissions` of Run and ToolCall); a test checks that
each name here is declared there and that every declared one is named here. This
module imports nothing from the app, so any layer may use it.
"""

from __future__ import annotations

from typing import Any

#: Cancel and resume runs (the API also lets a run's owner do that).
CANCEL_PERMISSION = "agentrun.cancel_run"
#: Approve, reject and resolve tool calls that wait for a person (being staff is not enough).
APPROVE_PERMISSION = "agentrun.approve_toolcall"
#: See every run, not only one's own.
VIEW_ALL_PERMISSION = "agentrun.view_all_runs"


def can_decide(user: Any) -> bool:
    """Whether `user` may decide on tool calls: approve, reject, resolve."""
    return bool(user and user.is_authenticated and user.has_perm(APPROVE_PERMISSION))


def can_cancel(user: Any) -> bool:
    """Whether `user` may cancel and resume any run (owners may also act on their own)."""
    return bool(user and user.is_authenticated and user.has_perm(CANCEL_PERMISSION))
