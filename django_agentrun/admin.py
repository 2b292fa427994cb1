"""Django admin for runs, tool-call decisions and the event log.

Everything here is read-only except through `services`: the run actions call
`cancel_run`/`resume_run`, the decision actions and forms call
`approve_tool_call`, `reject_tool_call` and `resolve_tool_call`. No admin path
saves a model, so no state field is ever written by a form.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext
from django.views.decorators.http import require_POST

from . import services
from .events import redact_secrets
from .exceptions import AgentRunError, ApprovalError, InvalidToken
from .models import Run, RunEvent, ToolCall, Turn
from .permissions import APPROVE_PERMISSION, CANCEL_PERMISSION, can_cancel, can_decide
from .states import RunState, ToolCallState, TurnState
from .tools import ToolArgumentsError

MAX_TIMELINE_EVENTS = 500
MAX_LISTED_ERRORS = 10

# Badge colours, one per state value (a guard test checks every member is covered).
RUN_STATE_COLOURS: dict[str, str] = {
    RunState.QUEUED: "#6c757d",
    RunState.RUNNING: "#0d6efd",
    RunState.AWAITING_TOOL: "#138496",
    RunState.AWAITING_APPROVAL: "#d9480f",
    RunState.COMPLETED: "#198754",
    RunState.FAILED: "#dc3545",
    RunState.CANCELLED: "#495057",
    RunState.TIMED_OUT: "#6f42c1",
}
TURN_STATE_COLOURS: dict[str, str] = {
    TurnState.RUNNING: "#0d6efd",
    TurnState.AWAITING_TOOL: "#138496",
    TurnState.COMPLETED: "#198754",
    TurnState.CANCELLED: "#495057",
    TurnState.FAILED: "#dc3545",
}
TOOL_CALL_STATE_COLOURS: dict[str, str] = {
    ToolCallState.REQUESTED: "#6c757d",
    ToolCallState.AWAITING_APPROVAL: "#d9480f",
    ToolCallState.IN_FLIGHT: "#0d6efd",
    ToolCallState.UNKNOWN: "#c2255c",
    ToolCallState.SUCCEEDED: "#198754",
    ToolCallState.ERRORED: "#dc3545",
    ToolCallState.REJECTED: "#a61e4d",
    ToolCallState.SKIPPED: "#868e96",
    ToolCallState.CANCELLED: "#495057",
}
_COLOURS = {
    Run: (RUN_STATE_COLOURS, RunState),
    Turn: (TURN_STATE_COLOURS, TurnState),
    ToolCall: (TOOL_CALL_STATE_COLOURS, ToolCallState),
}


def state_badge(obj: Run | Turn | ToolCall) -> SafeString:
    colours, choices = _COLOURS[type(obj)]
    return format_html(
        '<span class="agentrun-badge" style="background:{};color:#fff;padding:2px 8px;'
        'border-radius:10px;font-size:11px;font-weight:600;white-space:nowrap;">{}</span>',
        colours.get(obj.state, "#343a40"),
        choices(obj.state).label if obj.state in choices.values else obj.state,
    )


def _json_text(value: Any) -> str:
    """Pretty JSON; a string that holds JSON (a tool result) is pretty-printed too."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        if not isinstance(parsed, (dict, list)):
            return value
        value = parsed
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def pretty_json(value: Any, limit: int | None = None) -> SafeString:
    """Escaped, pretty-printed JSON in a <pre>, optionally cut at `limit` characters."""
    if value is None:
        return format_html('<span class="quiet">{}</span>', "—")
    text = _json_text(value)
    if limit is not None and len(text) > limit:
        text = text[:limit] + "\n…"
    return format_html(
        '<pre class="agentrun-json" style="margin:0;white-space:pre-wrap;word-break:break-word;">'
        "{}</pre>",
        text,
    )


def _summary(payload: Any, limit: int = 160) -> str:
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit] + "…"


def _parse_result(raw: str) -> Any:
    """A person's result: JSON when it parses, the text itself otherwise."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _change_url(obj: Run | ToolCall) -> str:
    return reverse(f"admin:agentrun_{obj._meta.model_name}_change", args=[obj.pk])


class _ServiceActionsMixin:
    """Shared plumbing: messages for service errors, refusing actions a user may not run."""

    #: action name -> the permission it needs ("app_label.codename"; each action checks it too).
    guarded_actions: dict[str, str] = {}

    def _report_errors(self, request: HttpRequest, errors: list[str]) -> None:
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

    def _refuse(self, request: HttpRequest, perm: str) -> None:
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
                self._refuse(request, perm)
                return HttpResponseRedirect(request.get_full_path())
        return super().changelist_view(request, extra_context)  # type: ignore[misc]


# --------------------------------------------------------------------------- runs


@admin.register(Run)
class RunAdmin(_ServiceActionsMixin, admin.ModelAdmin):
    change_form_template = "admin/agentrun/run/change_form.html"
    list_display = (
        "short_id",
        "agent",
        "state_display",
        "owner",
        "turn_count",
        "usage_display",
        "cost_usd",
        "created_at",
    )
    list_filter = ("state", "agent", "created_at")
    search_fields = ("id", "correlation_id", "agent", "owner__username")
    list_select_related = ("owner",)
    date_hierarchy = "created_at"
    actions = ("cancel_selected", "resume_selected")
    guarded_actions = {"cancel_selected": CANCEL_PERMISSION, "resume_selected": CANCEL_PERMISSION}
    fieldsets = (
        (None, {"fields": ("id", "agent", "state_display", "owner", "correlation_id")}),
        (_("Input and output"), {"fields": ("input_display", "output_display", "stop_reason")}),
        (
            _("Usage"),
            {
                "fields": (
                    "turn_count",
                    "input_tokens",
                    "output_tokens",
                    "cache_creation_input_tokens",
                    "cache_read_input_tokens",
                    "cost_usd",
                )
            },
        ),
        (
            _("Failure and cancellation"),
            {
                "classes": ("collapse",),
                "fields": (
                    "error_code",
                    "error_message",
                    "failure_phase",
                    "last_checkpoint",
                    "cancel_requested_at",
                    "cancel_reason",
                    "cancel_requested_by",
                    "deadline",
                ),
            },
        ),
        (
            _("Lease and recovery"),
            {
                "classes": ("collapse",),
                "fields": (
                    "lease_owner",
                    "lease_expires_at",
                    "lease_epoch",
                    "recovery_attempts",
                    "last_seq",
                ),
            },
        ),
        (
            _("Configuration"),
            {
                "classes": ("collapse",),
                "fields": ("config_display", "metadata_display", "idempotency_key"),
            },
        ),
        (
            _("Times"),
            {"fields": ("created_at", "queued_at", "started_at", "finished_at", "updated_at")},
        ),
    )

    def get_readonly_fields(self, request: HttpRequest, obj: Run | None = None):
        # Every field is machine-owned: runs change only through services.
        return [name for fieldset in self.fieldsets for name in fieldset[1]["fields"]]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # runs are created with start_run

    def has_change_permission(self, request: HttpRequest, obj: Run | None = None) -> bool:
        return False  # view-only: a form save would write stale machine fields

    def has_delete_permission(self, request: HttpRequest, obj: Run | None = None) -> bool:
        return request.user.is_superuser

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return can_cancel(request.user)

    def get_deleted_objects(self, objs, request):
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        # Turns, tool calls and events go with their run; they have no delete permission
        # of their own (the event log is append-only), so do not count them as lacking.
        children = {str(model._meta.verbose_name) for model in (Turn, ToolCall, RunEvent)}
        perms_needed = {name for name in perms_needed if str(name) not in children}
        return deleted, counts, perms_needed, protected

    # ----------------------------------------------------------------- columns

    @admin.display(description=_("run"), ordering="id")
    def short_id(self, obj: Run) -> str:
        return str(obj.pk)[:8]

    @admin.display(description=_("state"), ordering="state")
    def state_display(self, obj: Run) -> SafeString:
        return state_badge(obj)

    @admin.display(description=_("usage (in / out / cache write / cache read)"))
    def usage_display(self, obj: Run) -> str:
        return (
            f"{obj.input_tokens} / {obj.output_tokens} / "
            f"{obj.cache_creation_input_tokens} / {obj.cache_read_input_tokens}"
        )

    @admin.display(description=_("input"))
    def input_display(self, obj: Run) -> SafeString:
        return pretty_json(obj.input)

    @admin.display(description=_("output"))
    def output_display(self, obj: Run) -> SafeString:
        return pretty_json(obj.output)

    @admin.display(description=_("configuration snapshot"))
    def config_display(self, obj: Run) -> SafeString:
        return pretty_json(obj.config)

    @admin.display(description=_("metadata"))
    def metadata_display(self, obj: Run) -> SafeString:
        return pretty_json(obj.metadata)

    # ----------------------------------------------------------------- actions

    @admin.action(description=_("Cancel selected runs"), permissions=["cancel"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        if not self.has_cancel_permission(request):
            return self._refuse(request, CANCEL_PERMISSION)
        done, errors = 0, []
        for run in queryset:
            try:
                services.cancel_run(run, by=request.user, reason=self._cancel_reason(request))
            except AgentRunError as exc:
                errors.append(f"Run {run.pk}: {exc}")
            else:
                done += 1
                self.log_change(request, run, "Cancellation requested in the admin.")
        if done:
            self.message_user(
                request,
                ngettext(
                    "Cancellation requested for %(count)d run.",
                    "Cancellation requested for %(count)d runs.",
                    done,
                )
                % {"count": done},
                messages.SUCCESS,
            )
        self._report_errors(request, errors)

    @admin.action(description=_("Resume selected runs"), permissions=["cancel"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        if not self.has_cancel_permission(request):
            return self._refuse(request, CANCEL_PERMISSION)
        done, errors = 0, []
        for run in queryset:
            try:
                services.resume_run(run, by=request.user)
            except AgentRunError as exc:
                errors.append(f"Run {run.pk}: {exc}")
            else:
                done += 1
                self.log_change(request, run, "Resumed in the admin.")
        if done:
            self.message_user(
                request,
                ngettext("Resumed %(count)d run.", "Resumed %(count)d runs.", done)
                % {"count": done},
                messages.SUCCESS,
            )
        self._report_errors(request, errors)

    @staticmethod
    def _cancel_reason(request: HttpRequest) -> str:
        reason = request.POST.get("reason", "").strip()
        return reason or f"Cancelled in admin by {request.user.get_username()}"

    # ----------------------------------------------------------------- page buttons

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path(
                "<path:object_id>/cancel/",
                wrap(require_POST(self.cancel_view)),
                name="agentrun_run_cancel",
            ),
            path(
                "<path:object_id>/resume/",
                wrap(require_POST(self.resume_view)),
                name="agentrun_run_resume",
            ),
            *super().get_urls(),
        ]

    def _get_run(self, request: HttpRequest, object_id: str) -> Run:
        run = self.get_object(request, unquote(object_id))
        if run is None or not self.has_view_permission(request, run):
            raise Http404(f"No run {object_id}")
        return run

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        run = self._get_run(request, object_id)
        if not self.has_cancel_permission(request):
            self._refuse(request, CANCEL_PERMISSION)
        else:
            try:
                run = services.cancel_run(run, by=request.user, reason=self._cancel_reason(request))
            except AgentRunError as exc:
                self.message_user(request, f"Run {run.pk}: {exc}", messages.ERROR)
            else:
                self.log_change(request, run, "Cancellation requested in the admin.")
                self.message_user(
                    request, f"Cancellation requested; the run is {run.state}.", messages.SUCCESS
                )
        return HttpResponseRedirect(_change_url(run))

    def resume_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        run = self._get_run(request, object_id)
        if not self.has_cancel_permission(request):
            self._refuse(request, CANCEL_PERMISSION)
        else:
            try:
                run = services.resume_run(run, by=request.user)
            except AgentRunError as exc:
                self.message_user(request, f"Run {run.pk}: {exc}", messages.ERROR)
            else:
                self.log_change(request, run, "Resumed in the admin.")
                self.message_user(request, "The run was queued again.", messages.SUCCESS)
        return HttpResponseRedirect(_change_url(run))

    # ----------------------------------------------------------------- timeline

    def change_view(self, request, object_id, form_url="", extra_context=None):
        run = self.get_object(request, unquote(object_id))
        if run is not None:
            extra_context = {**(extra_context or {}), **self._timeline(request, run)}
        return super().change_view(request, object_id, form_url, extra_context)

    def _timeline(self, request: HttpRequest, run: Run) -> dict[str, Any]:
        calls_by_turn: dict[int, list[dict[str, Any]]] = {}
        for call in run.tool_calls.order_by("turn_index", "position"):
            calls_by_turn.setdefault(call.turn_id, []).append(
                {
                    "call": call,
                    "url": _change_url(call),
                    "badge": state_badge(call),
                    "arguments": pretty_json(call.arguments),
                    "result": pretty_json(call.result, limit=4000),
                    "pending": call.state
                    in (ToolCallState.AWAITING_APPROVAL, ToolCallState.UNKNOWN),
                }
            )
        turns = [
            {
                "turn": turn,
                "badge": state_badge(turn),
                "usage": turn.usage(),
                "calls": calls_by_turn.get(turn.pk, []),
            }
            for turn in run.turns.order_by("index")
        ]
        total = run.events.count()
        events = [
            {"event": event, "summary": _summary(redact_secrets(event.payload))}
            for event in run.events.order_by("-seq")[:MAX_TIMELINE_EVENTS]
        ][::-1]
        pending = run.tool_calls.pending_decision().count()
        return {
            "timeline_turns": turns,
            "timeline_events": events,
            "timeline_events_total": total,
            "timeline_events_cut": total > len(events),
            "pending_decisions": pending,
            "pending_url": reverse("admin:agentrun_toolcall_changelist")
            + f"?decision=pending&run__id__exact={run.pk}",
            "can_cancel": self.has_cancel_permission(request),
            "cancel_url": reverse("admin:agentrun_run_cancel", args=[run.pk]),
            "resume_url": reverse("admin:agentrun_run_resume", args=[run.pk]),
            "show_cancel": run.is_active,
            "show_resume": run.state in (RunState.FAILED, RunState.CANCELLED, RunState.TIMED_OUT),
        }


# --------------------------------------------------------------------------- tool calls


class DecisionFilter(admin.SimpleListFilter):
    """Pending decisions by default (unless another filter narrows the list)."""

    title = _("decision")
    parameter_name = "decision"

    def __init__(self, request, params, model, model_admin):
        self._other_filters = any(key != self.parameter_name for key in params)
        super().__init__(request, params, model, model_admin)

    def lookups(self, request, model_admin):
        return [
            ("pending", _("Pending decision")),
            ("approval", _("Awaiting approval")),
            ("unknown", _("Unknown outcome")),
            ("all", _("All")),
        ]

    def effective(self) -> str:
        return self.value() or ("all" if self._other_filters else "pending")

    def queryset(self, request, queryset):
        value = self.effective()
        if value == "pending":
            return queryset.pending_decision()
        if value == "approval":
            return queryset.filter(state=ToolCallState.AWAITING_APPROVAL)
        if value == "unknown":
            return queryset.filter(state=ToolCallState.UNKNOWN)
        return queryset

    def choices(self, changelist):
        current = self.effective()
        for lookup, title in self.lookup_choices:
            yield {
                "selected": current == lookup,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }


class _JSONObjectField(forms.CharField):
    widget = forms.Textarea(attrs={"rows": 8, "cols": 80, "class": "vLargeTextField"})

    def to_python(self, value: Any) -> Any:
        raw = super().to_python(value).strip()
        if not raw:
            return None
        try:
            parsed = json.loads(raw)
        except ValueError as exc:
            raise ValidationError(
                _("Not valid JSON: %(error)s"), params={"error": exc}, code="json"
            ) from exc
        if not isinstance(parsed, dict):
            raise ValidationError(_("The arguments must be a JSON object."), code="json_object")
        return parsed


class ApproveForm(forms.Form):
    token = forms.CharField(widget=forms.HiddenInput)
    note = forms.CharField(
        label=_("Note"), required=False, widget=forms.Textarea(attrs={"rows": 2, "cols": 80})
    )
    arguments = _JSONObjectField(
        label=_("Arguments"),
        required=False,
        help_text=_(
            "Edit to approve different arguments (a JSON object); "
            "the tool's input schema checks them again."
        ),
    )


class RejectForm(forms.Form):
    token = forms.CharField(widget=forms.HiddenInput)
    reason = forms.CharField(
        label=_("Reason"),
        widget=forms.Textarea(attrs={"rows": 2, "cols": 80}),
        help_text=_("Sent to the model as the tool result."),
    )


class ResolveForm(forms.Form):
    ACTIONS = [
        ("done", _("Mark done: it happened, record this result")),
        ("retry", _("Retry: it did not happen, run it once more")),
        ("fail", _("Fail: close it with an error result")),
    ]
    action = forms.ChoiceField(label=_("Decision"), choices=ACTIONS, widget=forms.RadioSelect)
    result = forms.CharField(
        label=_("Result"),
        required=False,
        widget=forms.Textarea(attrs={"rows": 4, "cols": 80}),
        help_text=_("The tool's result for “done”: JSON, or plain text."),
    )
    note = forms.CharField(
        label=_("Note"), required=False, widget=forms.Textarea(attrs={"rows": 2, "cols": 80})
    )

    def clean(self):
        data = super().clean()
        if data.get("action") == "done" and not data.get("result", "").strip():
            self.add_error("result", _("“Mark done” needs the tool's result."))
        return data


class BulkRejectForm(forms.Form):
    reason = forms.CharField(label=_("Reason"), widget=forms.Textarea(attrs={"rows": 2}))


class BulkDoneForm(forms.Form):
    result = forms.CharField(
        label=_("Result"),
        widget=forms.Textarea(attrs={"rows": 4}),
        help_text=_("Recorded as the result of every selected call: JSON, or plain text."),
    )
    note = forms.CharField(label=_("Note"), required=False)


@admin.register(ToolCall)
class ToolCallAdmin(_ServiceActionsMixin, admin.ModelAdmin):
    change_form_template = "admin/agentrun/toolcall/change_form.html"
    decision_template = "admin/agentrun/toolcall/decision.html"
    bulk_template = "admin/agentrun/toolcall/bulk_decision.html"
    list_display = (
        "id",
        "run_link",
        "name",
        "arguments_display",
        "side_effect",
        "state_display",
        "created_at",
        "approval_deadline",
    )
    list_display_links = ("id", "name")
    list_filter = (DecisionFilter, "state", "side_effect", "name")
    search_fields = ("name", "tool_call_id", "run__id")
    list_select_related = ("run",)
    actions = (
        "approve_selected",
        "reject_selected",
        "mark_done",
        "retry_selected",
        "fail_selected",
    )
    guarded_actions = dict.fromkeys(actions, APPROVE_PERMISSION)
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "run_link",
                    "turn_index",
                    "position",
                    "tool_call_id",
                    "name",
                    "side_effect",
                    "state_display",
                    "attempt",
                )
            },
        ),
        (
            _("Arguments and result"),
            {
                "fields": (
                    "arguments_full",
                    "original_arguments_display",
                    "arguments_hash",
                    "result_display",
                    "is_error",
                    "result_source",
                    "unknown_reason",
                )
            },
        ),
        (
            _("Decision"),
            {
                "fields": (
                    "approved",
                    "approval_deadline",
                    "decided_by",
                    "decided_at",
                    "decision_note",
                    "approval_payload_display",
                )
            },
        ),
        (
            _("Execution"),
            {
                "classes": ("collapse",),
                "fields": (
                    "idempotency_key",
                    "created_at",
                    "started_at",
                    "heartbeat_at",
                    "finished_at",
                ),
            },
        ),
    )

    def get_readonly_fields(self, request: HttpRequest, obj: ToolCall | None = None):
        return [name for fieldset in self.fieldsets for name in fieldset[1]["fields"]]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: ToolCall | None = None) -> bool:
        return False  # decisions go through the forms below, never a model save

    def has_delete_permission(self, request: HttpRequest, obj: ToolCall | None = None) -> bool:
        return False

    def has_approve_permission(self, request: HttpRequest) -> bool:
        return can_decide(request.user)

    # ----------------------------------------------------------------- columns

    @admin.display(description=_("run"), ordering="run__created_at")
    def run_link(self, obj: ToolCall) -> SafeString:
        return format_html(
            '<a href="{}">{} · {}</a>', _change_url(obj.run), obj.run.agent, str(obj.run_id)[:8]
        )

    @admin.display(description=_("arguments"))
    def arguments_display(self, obj: ToolCall) -> SafeString:
        return pretty_json(obj.arguments, limit=600)

    @admin.display(description=_("arguments"))
    def arguments_full(self, obj: ToolCall) -> SafeString:
        return pretty_json(obj.arguments)

    @admin.display(description=_("original arguments (before a person edited them)"))
    def original_arguments_display(self, obj: ToolCall) -> SafeString:
        return pretty_json(obj.original_arguments)

    @admin.display(description=_("result"))
    def result_display(self, obj: ToolCall) -> SafeString:
        return pretty_json(obj.result)

    @admin.display(description=_("approval payload"))
    def approval_payload_display(self, obj: ToolCall) -> SafeString:
        return pretty_json(redact_secrets(obj.approval_payload))  # the form has a fresh token

    @admin.display(description=_("state"), ordering="state")
    def state_display(self, obj: ToolCall) -> SafeString:
        return state_badge(obj)

    # ----------------------------------------------------------------- list actions

    def _bulk(
        self,
        request: HttpRequest,
        queryset: QuerySet[ToolCall],
        apply,
        done_message: tuple[str, str],
    ) -> None:
        if not self.has_approve_permission(request):
            return self._refuse(request, APPROVE_PERMISSION)
        done, errors = 0, []
        for call in queryset.select_related("run"):
            try:
                apply(call)
            except AgentRunError as exc:
                errors.append(f"{call.name} ({call.tool_call_id}): {exc}")
            else:
                done += 1
                self.log_change(request, call, ngettext(*done_message, 1) % {"count": 1})
        if done:
            self.message_user(
                request,
                ngettext(done_message[0], done_message[1], done) % {"count": done},
                messages.SUCCESS,
            )
        self._report_errors(request, errors)

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
            return self._refuse(request, APPROVE_PERMISSION)
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
            return self._refuse(request, APPROVE_PERMISSION)
        form = self._bulk_form_page(request, queryset, BulkDoneForm, _("Mark tool calls done"))
        if not isinstance(form, forms.Form):
            return form
        result = _parse_result(form.cleaned_data["result"])
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

    # ----------------------------------------------------------------- page decisions

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
            *super().get_urls(),
        ]

    def _forms_for(self, request: HttpRequest, call: ToolCall) -> dict[str, forms.Form]:
        """Unbound decision forms for the call's current state, carrying a fresh token."""
        if call.state == ToolCallState.AWAITING_APPROVAL:
            token = services.approval_token(call)
            return {
                "approve": ApproveForm(
                    initial={"token": token, "arguments": _json_text(call.arguments)},
                    prefix="approve",
                ),
                "reject": RejectForm(
                    initial={
                        "token": token,
                        "reason": f"Rejected in admin by {request.user.get_username()}",
                    },
                    prefix="reject",
                ),
            }
        if call.state == ToolCallState.UNKNOWN:
            return {"resolve": ResolveForm(prefix="resolve")}
        return {}

    def change_view(self, request, object_id, form_url="", extra_context=None):
        call = self.get_object(request, unquote(object_id))
        if call is not None:
            extra_context = {**(extra_context or {}), **self._decision_context(request, call)}
        return super().change_view(request, object_id, form_url, extra_context)

    def _decision_context(
        self, request: HttpRequest, call: ToolCall, bound: dict[str, forms.Form] | None = None
    ) -> dict[str, Any]:
        can_decide = self.has_approve_permission(request)
        decision_forms = {**self._forms_for(request, call), **(bound or {})} if can_decide else {}
        return {
            "call": call,
            "call_badge": state_badge(call),
            "call_arguments": pretty_json(call.arguments),
            "run_url": _change_url(call.run),
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
        self, request: HttpRequest, object_id: str, kind: str, form_class, decide
    ) -> HttpResponse:
        """GET: the decision form alone. POST: apply it through the service.

        Errors in what the person typed (bad JSON, arguments the schema refuses) are form
        errors; every other refusal (stale or forged token, the call moved on) is an
        error message on the call's page. Nothing changes in either case.
        """
        call = self._get_call(request, object_id)
        back = HttpResponseRedirect(_change_url(call))
        if not self.has_approve_permission(request):
            self._refuse(request, APPROVE_PERMISSION)
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
            result = _parse_result(data["result"]) if action == "done" else None
            services.resolve_tool_call(
                call, by=request.user, action=action, result=result, note=data["note"]
            )
            return f"Resolved {call.name} ({call.tool_call_id}): {action}."

        return self._decision_view(request, object_id, "resolve", ResolveForm, decide)


# --------------------------------------------------------------------------- events


@admin.register(RunEvent)
class RunEventAdmin(admin.ModelAdmin):
    list_display = ("seq", "run_link", "type", "created_at", "payload_summary")
    list_display_links = ("seq",)
    list_filter = ("type",)
    search_fields = ("run__id",)
    list_select_related = ("run",)
    fields = ("run_link", "seq", "type", "created_at", "payload_display")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: RunEvent | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: RunEvent | None = None) -> bool:
        return False  # append-only

    @admin.display(description=_("run"), ordering="run__created_at")
    def run_link(self, obj: RunEvent) -> SafeString:
        return format_html(
            '<a href="{}">{} · {}</a>', _change_url(obj.run), obj.run.agent, str(obj.run_id)[:8]
        )

    # Staff may read whole payloads (the run page shows the config too), but approval
    # tokens are decisions' credentials: only the decision forms carry them.
    @admin.display(description=_("payload"))
    def payload_summary(self, obj: RunEvent) -> str:
        return _summary(redact_secrets(obj.payload), limit=120)

    @admin.display(description=_("payload"))
    def payload_display(self, obj: RunEvent) -> SafeString:
        return pretty_json(redact_secrets(obj.payload))
