"""Deciding on one tool call from its admin page (approve, reject, resolve an unknown
outcome), with what the decision is about in view: the run's input, the conversation so
far, the call's arguments (a diff when a person edited them), the tool's description, its
side-effect class and idempotency key, the approval deadline. Each form carries a token
minted as the page is shown: a decision on a call that changed since is refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.admin.utils import unquote
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone

from .. import services
from ..exceptions import AgentRunError, ApprovalError, InvalidToken
from ..models import ToolCall
from ..permissions import APPROVE_PERMISSION
from ..side_effects import meaning
from ..states import ToolCallState
from ..tools import ToolArgumentsError
from .conversation import arguments_diff, conversation
from .display import (
    FIELD_FOLD_CHARS,
    change_url,
    json_text,
    pretty_json,
    state_badge,
    value_url,
    when,
)
from .forms import ApproveForm, RejectForm, ResolveForm, parse_result


class DecisionViewsMixin:
    """The decision panel on a tool call's page and the views its forms post to.

    Needs `has_approve_permission` and `refuse` (ToolCallActionsMixin has both) and a
    `decision_template`.
    """

    decision_template: str

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path(
                "<path:object_id>/approve/",
                wrap(self.approve_view),
                name="agentrun_toolcall_approve",
            ),
            path(
                "<path:object_id>/reject/", wrap(self.reject_view), name="agentrun_toolcall_reject"
            ),
            path(
                "<path:object_id>/resolve/",
                wrap(self.resolve_view),
                name="agentrun_toolcall_resolve",
            ),
            *super().get_urls(),  # type: ignore[misc]
        ]

    def _forms_for(self, request: HttpRequest, call: ToolCall) -> dict[str, forms.Form]:
        """Unbound decision forms for the call's current state, carrying a fresh token."""
        token = services.approval_token(call)
        if call.state == ToolCallState.AWAITING_APPROVAL:
            arguments = json_text(call.arguments)
            return {
                "approve": ApproveForm(
                    # Too long to edit here: left empty, it approves the arguments as they are.
                    initial={
                        "token": token,
                        "arguments": arguments if len(arguments) <= FIELD_FOLD_CHARS else "",
                    },
                    prefix="approve",
                ),
                # No reason until the person writes one: the model reads it.
                "reject": RejectForm(initial={"token": token}, prefix="reject"),
            }
        if call.state == ToolCallState.UNKNOWN:
            return {"resolve": ResolveForm(initial={"token": token}, prefix="resolve")}
        return {}

    def change_view(self, request, object_id, form_url="", extra_context=None):
        call = self.get_object(request, unquote(object_id))
        if call is not None:
            extra_context = {**(extra_context or {}), **self._decision_context(request, call)}
        return super().change_view(request, object_id, form_url, extra_context)  # type: ignore[misc]

    def _decision_context(
        self, request: HttpRequest, call: ToolCall, bound: dict[str, forms.Form] | None = None
    ) -> dict[str, Any]:
        can_decide = self.has_approve_permission(request)
        decision_forms = {**self._forms_for(request, call), **(bound or {})} if can_decide else {}
        deadline = call.approval_deadline
        return {
            "call": call,
            "call_badge": state_badge(call),
            "call_arguments": pretty_json(
                call.arguments, FIELD_FOLD_CHARS, value_url(call, "arguments")
            ),
            "call_diff": arguments_diff(call),
            "call_description": services.tool_description(call),
            "call_side_effect": meaning(call.side_effect).admin,
            "call_deadline": when(deadline) if deadline else "",
            "call_deadline_passed": bool(deadline and deadline <= timezone.now()),
            "call_created": when(call.created_at),
            "conversation": conversation(call.run, upto=call.turn_index, current=call.pk),
            "run_url": change_url(call.run),
            "run_badge": state_badge(call.run),
            "pending": call.state in (ToolCallState.AWAITING_APPROVAL, ToolCallState.UNKNOWN),
            "can_decide": can_decide,
            "decision_forms": decision_forms,
            "approve_url": reverse("admin:agentrun_toolcall_approve", args=[call.pk]),
            "reject_url": reverse("admin:agentrun_toolcall_reject", args=[call.pk]),
            "resolve_url": reverse("admin:agentrun_toolcall_resolve", args=[call.pk]),
        }

    def _get_call(self, request: HttpRequest, object_id: str) -> ToolCall:
        call = self.get_object(request, unquote(object_id))
        if call is None or not self.has_view_permission(request, call):
            raise Http404(f"No tool call {object_id}")
        return call

    def _decision_view(
        self,
        request: HttpRequest,
        object_id: str,
        kind: str,
        form_class: type[forms.Form],
        decide: Callable[[ToolCall, dict[str, Any]], str],
    ) -> HttpResponse:
        """GET: the decision form alone. POST: apply it through the service.

        Errors in what the person typed (bad JSON, arguments the schema refuses) are form
        errors; every other refusal (stale or forged token, the call moved on) is an
        error message on the call's page. Nothing changes in either case.
        """
        call = self._get_call(request, object_id)
        back = HttpResponseRedirect(change_url(call))
        if not self.has_approve_permission(request):
            self.refuse(request, APPROVE_PERMISSION)
            return back
        if request.method == "POST":
            form = form_class(request.POST, prefix=kind)
            if form.is_valid():
                try:
                    text = decide(call, form.cleaned_data)
                except InvalidToken as exc:
                    self.message_user(
                        request,
                        f"Refused: {exc} The call may have changed since the page was shown; "
                        "review it again. Nothing was changed.",
                        messages.ERROR,
                    )
                    return back
                except ApprovalError as exc:
                    if not isinstance(exc.__cause__, ToolArgumentsError):
                        self.message_user(request, f"Refused: {exc}", messages.ERROR)
                        return back
                    form.add_error("arguments", str(exc))
                except AgentRunError as exc:
                    self.message_user(request, f"Refused: {exc}", messages.ERROR)
                    return back
                else:
                    self.log_change(request, call, text)
                    self.message_user(request, text, messages.SUCCESS)
                    return back
        else:
            form = self._forms_for(request, call).get(kind)
            if form is None:
                self.message_user(
                    request,
                    f"Tool call {call.tool_call_id} is {call.state}: there is nothing to decide.",
                    messages.WARNING,
                )
                return back
        context = {
            **self.admin_site.each_context(request),
            **self._decision_context(request, call),
            "opts": self.model._meta,
            "original": call,
            "title": f"{kind.capitalize()} {call.name} ({call.tool_call_id})",
            "form": form,
            "kind": kind,
            "form_url": request.path,
        }
        return TemplateResponse(request, self.decision_template, context)

    def approve_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        def decide(call: ToolCall, data: dict[str, Any]) -> str:
            arguments = data["arguments"]
            services.approve_tool_call(
                call,
                by=request.user,
                note=data["note"],
                # Unchanged arguments are no edit: only a real edit is re-validated and recorded.
                arguments=arguments
                if arguments is not None and arguments != call.arguments
                else None,
                token=data["token"],
            )
            return f"Approved {call.name} ({call.tool_call_id})."

        return self._decision_view(request, object_id, "approve", ApproveForm, decide)

    def reject_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        def decide(call: ToolCall, data: dict[str, Any]) -> str:
            services.reject_tool_call(
                call, by=request.user, reason=data["reason"], token=data["token"]
            )
            return f"Rejected {call.name} ({call.tool_call_id})."

        return self._decision_view(request, object_id, "reject", RejectForm, decide)

    def resolve_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        def decide(call: ToolCall, data: dict[str, Any]) -> str:
            action = data["action"]
            result = parse_result(data["result"]) if action == "done" else None
            services.resolve_tool_call(
                call,
                by=request.user,
                action=action,
                result=result,
                note=data["note"],
                token=data["token"],
            )
            return f"Resolved {call.name} ({call.tool_call_id}): {action}."

        return self._decision_view(request, object_id, "resolve", ResolveForm, decide)
