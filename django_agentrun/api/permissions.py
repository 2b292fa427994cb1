"""Who may see and act on runs and tool calls through the API.

Visibility is a queryset (`Run.objects.visible_to(user)`), so a run the user
may not see is a 404, never a 403: its existence does not leak. The permission
classes below only decide what a user may do with what they can already see.
"""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from ..models import Run, ToolCall

CANCEL_PERMISSION = "agentrun.cancel_run"
APPROVE_PERMISSION = "agentrun.approve_toolcall"


def visible_runs(user: Any):
    return Run.objects.visible_to(user)


def visible_tool_calls(user: Any):
    """Tool calls of the runs `user` may see."""
    return ToolCall.objects.filter(run__in=visible_runs(user).values("pk"))


def can_decide(user: Any) -> bool:
    return bool(user and user.is_authenticated and user.has_perm(APPROVE_PERMISSION))


class CanCancelRun(BasePermission):
    """The run's owner, or a user with `agentrun.cancel_run`."""

    message = "Only the run's owner or a user with agentrun.cancel_run may cancel or resume it."

    def has_object_permission(self, request: Request, view: Any, obj: Run) -> bool:
        user = request.user
        return (obj.owner_id is not None and obj.owner_id == user.pk) or user.has_perm(
            CANCEL_PERMISSION
        )


class CanDecideToolCalls(BasePermission):
    """Users with `agentrun.approve_toolcall` (being staff is not enough)."""

    message = "Deciding on tool calls needs the agentrun.approve_toolcall permission."

    def has_permission(self, request: Request, view: Any) -> bool:
        return can_decide(request.user)
