"""The permissions of agent runs, named once for every surface (admin, API).

The models declare them (`Meta.permissions` of Run and ToolCall); a test checks that
each name here is declared there and that every declared one is named here. This
module imports nothing from the app, so any layer may use it.
"""

from __future__ import annotations

from typing import Any

#: Cancel, resume and fork any run (a run's owner may do that to their own).
CANCEL_PERMISSION = "agentrun.cancel_run"
#: Approve, reject and resolve tool calls that wait for a person (being staff is not enough).
APPROVE_PERMISSION = "agentrun.approve_toolcall"
#: See every run, not only one's own.
VIEW_ALL_PERMISSION = "agentrun.view_all_runs"
#: Start runs and conversations through the API: the rule of an agent that sets none
#: (`Agent(api_start=...)`, `AGENTRUN_API_START`).
START_PERMISSION = "agentrun.start_run"
#: See the admin overview (charts of runs, cost, latency, waiting calls, failures) of the
#: runs one may see; staff only.
OVERVIEW_PERMISSION = "agentrun.view_overview"
#: Add, change and remove webhook subscriptions in the admin, and resend deliveries.
MANAGE_WEBHOOKS_PERMISSION = "agentrun.manage_webhooks"


def can_decide(user: Any) -> bool:
    """Whether `user` may decide on tool calls: approve, reject, resolve."""
    return bool(user and user.is_authenticated and user.has_perm(APPROVE_PERMISSION))


def can_view_overview(user: Any) -> bool:
    """Whether `user` may open the admin overview: active staff with OVERVIEW_PERMISSION."""
    return bool(
        user
        and user.is_authenticated
        and user.is_active
        and user.is_staff
        and user.has_perm(OVERVIEW_PERMISSION)
    )


def can_manage_webhooks(user: Any) -> bool:
    """Whether `user` may manage webhook subscriptions and resend deliveries."""
    return bool(
        user
        and user.is_authenticated
        and user.is_staff
        and user.has_perm(MANAGE_WEBHOOKS_PERMISSION)
    )


def can_cancel(user: Any) -> bool:
    """Whether `user` may cancel and resume any run (owners may also act on their own)."""
    return bool(user and user.is_authenticated and user.has_perm(CANCEL_PERMISSION))


def can_act_on_run(user: Any, run: Any) -> bool:
    """Whether `user` may cancel, resume or fork `run`: its owner, or with CANCEL_PERMISSION.
    (Seeing the run at all is `Run.objects.visible_to(user)`: check that first.)"""
    if not (user and user.is_authenticated):
        return False
    return (run.owner_id is not None and run.owner_id == user.pk) or can_cancel(user)


def may_start(user: Any, rule: Any) -> bool:
    """Whether `user` may start runs of an agent whose API rule is `rule`: True (any
    authenticated user), False (nobody), a permission name, or a callable `(user) -> bool`."""
    if not (user and user.is_authenticated) or rule is False or rule is None:
        return False
    if rule is True:
        return True
    if isinstance(rule, str):
        return bool(user.has_perm(rule))
    return bool(rule(user))
