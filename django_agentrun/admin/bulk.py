"""Deciding on several tool calls at once, always through a confirmation page.

The page shows every selected call whole: its run, its side-effect class, its state and
all of its arguments, and carries a token per call (minted as the page is shown). Only
the calls listed there, with their tokens, are decided when it is confirmed: a call that
changed since is refused by its token, not decided on what nobody saw. A call whose
arguments are too long to show whole, or that is not in the state the decision needs,
is left out and must be decided on its own page.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from .. import services
from ..exceptions import InvalidToken
from ..models import ToolCall
from ..permissions import APPROVE_PERMISSION, can_decide
from ..states import ToolCallState
from .actions import ServiceActionsMixin
from .display import change_url, json_text, size, state_badge
from .forms import BulkApproveForm, BulkDoneForm, BulkNoteForm, BulkRejectForm, parse_result

#: Arguments longer than this (pretty JSON, characters) cannot be shown whole on the
#: confirmation page: such a call is decided on its own page.
BULK_MAX_ARGUMENT_CHARS = 4000


@dataclass(frozen=True)
class BulkDecision:
    verb: str  # "approve"
    state: str  # the state a call must be in
    form: type[forms.Form]
    done: tuple[str, str]
    apply: Callable[[Any, ToolCall, dict[str, Any], str], Any]  # (user, call, data, token)


DECISIONS: dict[str, BulkDecision] = {
    "approve_selected": BulkDecision(
        "approve",
        ToolCallState.AWAITING_APPROVAL,
        BulkApproveForm,
        ("Approved %(count)d tool call.", "Approved %(count)d tool calls."),
        lambda user, call, data, token: services.approve_tool_call(
            call, by=user, note=data["note"], token=token
        ),
    ),
    "reject_selected": BulkDecision(
        "reject",
        ToolCallState.AWAITING_APPROVAL,
        BulkRejectForm,
        ("Rejected %(count)d tool call.", "Rejected %(count)d tool calls."),
        lambda user, call, data, token: services.reject_tool_call(
            call, by=user, reason=data["reason"], token=token
        ),
    ),
    "mark_done": BulkDecision(
        "mark done",
        ToolCallState.UNKNOWN,
        BulkDoneForm,
        ("Marked %(count)d tool call done.", "Marked %(count)d tool calls done."),
        lambda user, call, data, token: services.resolve_tool_call(
            call,
            by=user,
            action="done",
            result=parse_result(data["result"]),
            note=data["note"],
            token=token,
        ),
    ),
    "retry_selected": BulkDecision(
        "retry",
        ToolCallState.UNKNOWN,
        BulkNoteForm,
        ("%(count)d tool call will be retried.", "%(count)d tool calls will be retried."),
        lambda user, call, data, token: services.resolve_tool_call(
            call, by=user, action="retry", note=data["note"], token=token
        ),
    ),
    "fail_selected": BulkDecision(
        "fail",
        ToolCallState.UNKNOWN,
        BulkNoteForm,
        ("Failed %(count)d tool call.", "Failed %(count)d tool calls."),
        lambda user, call, data, token: services.resolve_tool_call(
            call, by=user, action="fail", note=data["note"], token=token
        ),
    ),
}


def _label(call: ToolCall) -> str:
    return f"{call.name} ({call.tool_call_id})"


class ToolCallActionsMixin(ServiceActionsMixin):
    """The list's decision actions; each asks for confirmation on `bulk_template`."""

    bulk_template: str

    def has_approve_permission(self, request: HttpRequest) -> bool:
        return can_decide(request.user)

    def _bulk(self, request: HttpRequest, queryset: QuerySet[ToolCall], name: str):
        if not self.has_approve_permission(request):
            return self.refuse(request, APPROVE_PERMISSION)
        decision = DECISIONS[name]
        calls = list(queryset.select_related("run"))
        selected = request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME)
        gone = sorted(set(selected) - {str(call.pk) for call in calls})
        if "apply" in request.POST:
            form = decision.form(request.POST)
            if form.is_valid():
                return self._apply(request, calls, gone, decision, form.cleaned_data)
        else:
            form = decision.form()
        rows, left_out = [], []
        for call in calls:
            arguments = json_text(call.arguments)
            if call.state != decision.state:
                left_out.append((call, f"it is {call.state}, not {decision.state}"))
            elif len(arguments) > BULK_MAX_ARGUMENT_CHARS:
                left_out.append(
                    (
                        call,
                        f"its arguments ({size(len(arguments))}) are too long to show here: "
                        "decide on its own page",
                    )
                )
            else:
                rows.append(
                    {
                        "call": call,
                        "badge": state_badge(call),
                        "arguments": arguments,
                        "token": services.approval_token(call),
                    }
                )
        left_out += [(None, f"tool call {pk} is no longer listed here") for pk in gone]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": ngettext(
                "%(verb)s %(count)d tool call", "%(verb)s %(count)d tool calls", len(rows)
            )
            % {"verb": decision.verb.capitalize(), "count": len(rows)},
            "verb": decision.verb,
            "form": form,
            "rows": rows,
            "left_out": [(c, change_url(c) if c else "", why) for c, why in left_out],
            "action": request.POST.get("action", ""),
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, self.bulk_template, context)

    def _apply(
        self,
        request: HttpRequest,
        calls: list[ToolCall],
        gone: list[str],
        decision: BulkDecision,
        data: dict[str, Any],
    ) -> None:
        def apply(call: ToolCall) -> Any:
            token = request.POST.get(f"token-{call.pk}", "")
            if not token:
                raise InvalidToken(
                    "it was not confirmed on the confirmation page (no token). Nothing was changed."
                )
            return decision.apply(request.user, call, data, token)

        self.apply_each(
            request,
            calls,
            apply,
            label=_label,
            logged=decision.done[0] % {"count": 1},
            done_message=decision.done,
        )
        self.report_errors(
            request,
            [
                f"Tool call {pk}: no longer listed (decided meanwhile?); nothing done."
                for pk in gone
            ],
        )

    @admin.action(description=_("Approve selected tool calls…"), permissions=["approve"])
    def approve_selected(self, request: HttpRequest, queryset: QuerySet[ToolCall]):
        return self._bulk(request, queryset, "approve_selected")

    @admin.action(description=_("Reject selected tool calls…"), permissions=["approve"])
    def reject_selected(self, request: HttpRequest, queryset: QuerySet[ToolCall]):
        return self._bulk(request, queryset, "reject_selected")

    @admin.action(
        description=_("Unknown outcome: mark done with a result…"), permissions=["approve"]
    )
    def mark_done(self, request: HttpRequest, queryset: QuerySet[ToolCall]):
        return self._bulk(request, queryset, "mark_done")

    @admin.action(description=_("Unknown outcome: retry once…"), permissions=["approve"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet[ToolCall]):
        return self._bulk(request, queryset, "retry_selected")

    @admin.action(
        description=_("Unknown outcome: fail with an error result…"), permissions=["approve"]
    )
    def fail_selected(self, request: HttpRequest, queryset: QuerySet[ToolCall]):
        return self._bulk(request, queryset, "fail_selected")
