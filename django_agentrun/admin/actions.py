"""List actions: they call `services`, report counts and errors, and check permissions.

Django hides an action from a user without its permission but does not refuse it
when posted anyway, and django-fsm-2's admin does not re-check permissions either:
every action here checks its permission itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from .. import services
from ..exceptions import AgentRunError
from ..models import Run, ToolCall
from ..permissions import APPROVE_PERMISSION, CANCEL_PERMISSION, can_cancel, can_decide
from .display import pretty_json
from .forms import BulkDoneForm, BulkRejectForm, parse_result

MAX_LISTED_ERRORS = 10


def cancel_reason(request: HttpRequest) -> str:
    """The reason typed with a cancel, or one that names who cancelled."""
    reason = request.POST.get("reason", "").strip()
    return reason or f"Cancelled in admin by {request.user.get_username()}"


class ServiceActionsMixin:
    """Shared plumbing: messages for service errors, refusing actions a user may not run."""

    #: action name -> the permission it needs ("app_label.codename"; each action checks it too).
    guarded_actions: dict[str, str] = {}

    def report_errors(self, request: HttpRequest, errors: list[str]) -> None:
        for text in errors[:MAX_LISTED_ERRORS]:
            self.message_user(request, text, messages.ERROR)
        if len(errors) > MAX_LISTED_ERRORS:
            self.message_user(
                request,
                ngettext(
                    "… and %(count)d more error.",
                    "… and %(count)d more errors.",
                    len(errors) - MAX_LISTED_ERRORS,
                )
                % {"count": len(errors) - MAX_LISTED_ERRORS},
                messages.ERROR,
            )

    def apply_each(
        self,
        request: HttpRequest,
        objects: Iterable[Any],
        apply: Callable[[Any], Any],
        *,
        label: Callable[[Any], str],
        logged: str,
        done_message: tuple[str, str],
    ) -> None:
        """Apply a service to each object: a change-log entry for each one done, one
        message with the count, one error message per refusal (labelled by `label`)."""
        done, errors = 0, []
        for obj in objects:
            try:
                apply(obj)
            except AgentRunError as exc:
                errors.append(f"{label(obj)}: {exc}")
            else:
                done += 1
                self.log_change(request, obj, logged)
        if done:
            self.message_user(
                request,
                ngettext(done_message[0], done_message[1], done) % {"count": done},
                messages.SUCCESS,
            )
        self.report_errors(request, errors)

    def refuse(self, request: HttpRequest, perm: str) -> None:
        self.message_user(
            request,
            _("You do not have permission to do this (%(perm)s needed). Nothing was changed.")
            % {"perm": perm},
            messages.ERROR,
        )

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None):
        # An action hidden from this user (no permission) is refused with a clear message
        # instead of Django's silent "No action selected".
        if request.method == "POST":
            name = request.POST.get("action", "")
            perm = self.guarded_actions.get(name)
            if perm and not request.user.has_perm(perm):
                self.refuse(request, perm)
                return HttpResponseRedirect(request.get_full_path())
        return super().changelist_view(request, extra_context)  # type: ignore[misc]


def _run_label(run: Run) -> str:
    return f"Run {run.pk}"


class RunActionsMixin(ServiceActionsMixin):
    """Cancel and resume the selected runs (`cancel_run`, `resume_run`)."""

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return can_cancel(request.user)

    @admin.action(description=_("Cancel selected runs"), permissions=["cancel"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        if not self.has_cancel_permission(request):
            return self.refuse(request, CANCEL_PERMISSION)
        reason = cancel_reason(request)
        self.apply_each(
            request,
            queryset,
            lambda run: services.cancel_run(run, by=request.user, reason=reason),
            label=_run_label,
            logged="Cancellation requested in the admin.",
            done_message=(
                "Cancellation requested for %(count)d run.",
                "Cancellation requested for %(count)d runs.",
            ),
        )
        return None

    @admin.action(description=_("Resume selected runs"), permissions=["cancel"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        if not self.has_cancel_permission(request):
            return self.refuse(request, CANCEL_PERMISSION)
        self.apply_each(
            request,
            queryset,
            lambda run: services.resume_run(run, by=request.user),
            label=_run_label,
            logged="Resumed in the admin.",
            done_message=("Resumed %(count)d run.", "Resumed %(count)d runs."),
        )
        return None


class ToolCallActionsMixin(ServiceActionsMixin):
    """Decide on the selected tool calls; those that need input ask for it on a page of
    their own (`bulk_template`)."""

    bulk_template: str

    def has_approve_permission(self, request: HttpRequest) -> bool:
        return can_decide(request.user)

    def _bulk(
        self,
        request: HttpRequest,
        queryset: QuerySet[ToolCall],
        apply: Callable[[ToolCall], Any],
        done_message: tuple[str, str],
    ) -> None:
        if not self.has_approve_permission(request):
            return self.refuse(request, APPROVE_PERMISSION)
        self.apply_each(
            request,
            queryset.select_related("run"),
            apply,
            label=lambda call: f"{call.name} ({call.tool_call_id})",
            logged=ngettext(*done_message, 1) % {"count": 1},
            done_message=done_message,
        )
        return None

    def _bulk_form_page(
        self,
        request: HttpRequest,
        queryset: QuerySet[ToolCall],
        form_class: type[forms.Form],
        title: str,
        initial: dict[str, Any] | None = None,
    ) -> forms.Form | TemplateResponse:
        """The intermediate page of an action that needs input; the bound valid form once posted."""
        if "apply" in request.POST:
            form = form_class(request.POST)
            if form.is_valid():
                return form
        else:
            form = form_class(initial=initial)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": title,
            "form": form,
            "queryset": queryset,
            "calls": [(call, pretty_json(call.arguments, limit=600)) for call in queryset],
            "action": request.POST.get("action", ""),
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, self.bulk_template, context)

    @admin.action(description=_("Approve selected tool calls"), permissions=["approve"])
    def approve_selected(self, request: HttpRequest, queryset: QuerySet[ToolCall]) -> None:
        self._bulk(
            request,
            queryset,
            lambda call: services.approve_tool_call(call, by=request.user),
            ("Approved %(count)d tool call.", "Approved %(count)d tool calls."),
        )

    @admin.action(description=_("Reject selected tool calls…"), permissions=["approve"])
    def reject_selected(self, request: HttpRequest, queryset: QuerySet[ToolCall]):
        if not self.has_approve_permission(request):
            return self.refuse(request, APPROVE_PERMISSION)
        form = self._bulk_form_page(
            request,
            queryset,
            BulkRejectForm,
            _("Reject tool calls"),
            {"reason": f"Rejected in admin by {request.user.get_username()}"},
        )
        if not isinstance(form, forms.Form):
            return form
        reason = form.cleaned_data["reason"]
        self._bulk(
            request,
            queryset,
            lambda call: services.reject_tool_call(call, by=request.user, reason=reason),
            ("Rejected %(count)d tool call.", "Rejected %(count)d tool calls."),
        )
        return None

    @admin.action(
        description=_("Unknown outcome: mark done with a result…"), permissions=["approve"]
    )
    def mark_done(self, request: HttpRequest, queryset: QuerySet[ToolCall]):
        if not self.has_approve_permission(request):
            return self.refuse(request, APPROVE_PERMISSION)
        form = self._bulk_form_page(request, queryset, BulkDoneForm, _("Mark tool calls done"))
        if not isinstance(form, forms.Form):
            return form
        result = parse_result(form.cleaned_data["result"])
        note = form.cleaned_data["note"]
        self._bulk(
            request,
            queryset,
            lambda call: services.resolve_tool_call(
                call, by=request.user, action="done", result=result, note=note
            ),
            ("Marked %(count)d tool call done.", "Marked %(count)d tool calls done."),
        )
        return None

    @admin.action(description=_("Unknown outcome: retry once"), permissions=["approve"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet[ToolCall]) -> None:
        note = f"Retried in admin by {request.user.get_username()}"
        self._bulk(
            request,
            queryset,
            lambda call: services.resolve_tool_call(
                call, by=request.user, action="retry", note=note
            ),
            ("%(count)d tool call will be retried.", "%(count)d tool calls will be retried."),
        )

    @admin.action(
        description=_("Unknown outcome: fail with an error result"), permissions=["approve"]
    )
    def fail_selected(self, request: HttpRequest, queryset: QuerySet[ToolCall]) -> None:
        note = f"Failed in admin by {request.user.get_username()}"
        self._bulk(
            request,
            queryset,
            lambda call: services.resolve_tool_call(
                call, by=request.user, action="fail", note=note
            ),
            ("Failed %(count)d tool call.", "Failed %(count)d tool calls."),
        )
