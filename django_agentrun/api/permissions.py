"""Who may see and act on runs and tool calls through the API.

Visibility is a queryset (`Run.objects.visible_to(user)`), so a run the user
may not see is a 404, never a 403: its existence does not leak. The permission
classes below only decide what a user may do with what they can already see.
"""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from ..models import Conversation, Run, ToolCall
from ..permissions import APPROVE_PERMISSION, CANCEL_PERMISSION, can_act_on_run, can_decide

# The permission names and `can_decide` live in `django_agentrun.permissions`; kept
# importable from here, where they were first defined.
__all__ = [
    "APPROVE_PERMISSION",
    "CANCEL_PERMISSION",
    "CanCancelRun",
    "CanDecideToolCalls",
    "CanSendMessage",
    "CanStopConversation",
    "can_decide",
    "visible_conversations",
    "visible_runs",
    "visible_tool_calls",
]


def visible_runs(user: Any):
    return Run.objects.visible_to(user)


def visible_conversations(user: Any):
    """Conversations `user` may see: the rule of runs (`Conversation.objects.visible_to`)."""
    return Conversation.objects.visible_to(user)


def visible_tool_calls(user: Any):
    """Tool calls of the runs `user` may see."""
    return ToolCall.objects.filter(run__in=visible_runs(user).values("pk"))


class CanCancelRun(BasePermission):
    """The run's owner, or a user with `agentrun.cancel_run`."""

    message = (
        f"Only the run's owner or a user with {CANCEL_PERMISSION} may cancel, resume or fork it."
    )

    def has_object_permission(self, request: Request, view: Any, obj: Run) -> bool:
        return can_act_on_run(request.user, obj)


class CanDecideToolCalls(BasePermission):
    """Users with `agentrun.approve_toolcall` (being staff is not enough)."""

    message = f"Deciding on tool calls needs the {APPROVE_PERMISSION} permission."

    def has_permission(self, request: Request, view: Any) -> bool:
        return can_decide(request.user)


class CanSendMessage(BasePermission):
    """The conversation's owner only: a message starts a run that acts on the owner's
    behalf (the run is theirs), so nobody else speaks for them, whatever their permissions."""

    message = "Only the conversation's owner may send it messages."

    def has_object_permission(self, request: Request, view: Any, obj: Conversation) -> bool:
        return obj.owner_id is not None and obj.owner_id == request.user.pk


class CanStopConversation(BasePermission):
    """The conversation's owner, or a user with `agentrun.cancel_run` (stopping cancels its
    runs)."""

    message = f"Only the conversation's owner or a user with {CANCEL_PERMISSION} may stop it."

    def has_object_permission(self, request: Request, view: Any, obj: Conversation) -> bool:
        return can_act_on_run(request.user, obj)
