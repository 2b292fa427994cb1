"""ToolCallAdmin: the queue of calls waiting for a person (the list's default), each call's
page as the decision page (`decisions.DecisionViewsMixin`), decisions in bulk through a
confirmation page (`bulk.ToolCallActionsMixin`); the calls of visible runs only."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..events import redact_secrets
from ..models import ToolCall
from ..permissions import APPROVE_PERMISSION
from ..states import ToolCallState
from .bulk import ToolCallActionsMixin
from .decisions import DecisionViewsMixin
from .display import (
    FIELD_FOLD_CHARS,
    argument_lines,
    pretty_json,
    run_link,
    state_badge,
    value_url,
    when,
)
from .filters import DecisionFilter, StateFilter
from .values import ValueViewMixin
from .visibility import VisibleRunsMixin

CALL_VALUES = {
    "arguments": lambda call: call.arguments,
    "original_arguments": lambda call: call.original_arguments,
    "result": lambda call: call.result,
    "approval_payload": lambda call: redact_secrets(call.approval_payload),
}


class ToolCallAdmin(
    VisibleRunsMixin, ValueViewMixin, DecisionViewsMixin, ToolCallActionsMixin, admin.ModelAdmin
):
    values = CALL_VALUES
    change_form_template = "admin/agentrun/toolcall/change_form.html"
    decision_template = "admin/agentrun/toolcall/decision.html"
    bulk_template = "admin/agentrun/toolcall/bulk_decision.html"
    list_display = (
        "call_display",
        "run_link",
        "arguments_display",
        "state_display",
        "waiting_display",
        "deadline_display",
    )
    list_display_links = ("call_display",)
    list_filter = (DecisionFilter, ("state", StateFilter), ("side_effect", StateFilter), "name")
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
                    "is_error_display",
                    "result_source",
                    "unknown_reason",
                )
            },
        ),
        (
            _("Decision"),
            {
                "fields": (
                    "approval_display",
                    "deadline_display",
                    "decided_by",
                    "decided_display",
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
                    "created_display",
                    "started_display",
                    "heartbeat_display",
                    "finished_display",
                ),
            },
        ),
    )

    def get_readonly_fields(self, request: HttpRequest, obj: ToolCall | None = None):
        return [name for fieldset in self.fieldsets for name in fieldset[1]["fields"]]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: ToolCall | None = None) -> bool:
        return False  # decisions go through the decision forms, never a model save

    def has_delete_permission(self, request: HttpRequest, obj: ToolCall | None = None) -> bool:
        return False

    # ----------------------------------------------------------------- columns

    @admin.display(description=_("tool call"), ordering="name")
    def call_display(self, obj: ToolCall) -> SafeString:
        return format_html(
            '{} <span class="agentrun-side-effect agentrun-{}">{}</span>',
            obj.name,
            obj.side_effect,
            obj.side_effect,
        )

    @admin.display(description=_("run"), ordering="run__created_at")
    def run_link(self, obj: ToolCall) -> SafeString:
        return run_link(obj)

    @admin.display(description=_("arguments"))
    def arguments_display(self, obj: ToolCall) -> SafeString:
        return argument_lines(obj.arguments)

    @admin.display(description=_("arguments"))
    def arguments_full(self, obj: ToolCall) -> SafeString:
        return pretty_json(obj.arguments, FIELD_FOLD_CHARS, value_url(obj, "arguments"))

    @admin.display(description=_("original arguments (before a person edited them)"))
    def original_arguments_display(self, obj: ToolCall) -> SafeString:
        return pretty_json(
            obj.original_arguments, FIELD_FOLD_CHARS, value_url(obj, "original_arguments")
        )

    @admin.display(description=_("result"))
    def result_display(self, obj: ToolCall) -> SafeString:
        return pretty_json(obj.result, FIELD_FOLD_CHARS, value_url(obj, "result"))

    @admin.display(description=_("approval payload"))
    def approval_payload_display(self, obj: ToolCall) -> SafeString:
        # Tokens are never shown from storage: the decision forms carry a fresh one.
        return pretty_json(
            redact_secrets(obj.approval_payload),
            FIELD_FOLD_CHARS,
            value_url(obj, "approval_payload"),
        )

    @admin.display(description=_("is error"))
    def is_error_display(self, obj: ToolCall) -> str:
        # No result yet is no error either: not a red ✗ on a call that waits.
        if obj.result is None and not obj.is_closed:
            return "—"
        return "yes" if obj.is_error else "no"

    @admin.display(description=_("state"), ordering="state")
    def state_display(self, obj: ToolCall) -> SafeString:
        return state_badge(obj)

    @admin.display(description=_("approval"))
    def approval_display(self, obj: ToolCall) -> str:
        """Pending, approved, rejected or not needed: never a ✗ that reads as "rejected"."""
        if obj.state == ToolCallState.AWAITING_APPROVAL:
            return "pending: waits for a decision"
        if obj.state == ToolCallState.UNKNOWN:
            return "pending: the outcome is unknown, a person settles it"
        if obj.state == ToolCallState.REJECTED:
            return "rejected"
        if obj.decided_at is not None:
            return "approved" if obj.result_source != "person" else "decided by a person"
        return "not needed"

    @admin.display(description=_("waiting since"), ordering="created_at")
    def waiting_display(self, obj: ToolCall) -> str:
        return when(obj.created_at)

    @admin.display(description=_("approval deadline"), ordering="approval_deadline")
    def deadline_display(self, obj: ToolCall) -> SafeString:
        if obj.approval_deadline is None:
            return format_html("{}", "—")
        passed = obj.approval_deadline <= timezone.now()
        return format_html(
            '<span class="{}">{}{}</span>',
            "agentrun-late" if passed else "",
            when(obj.approval_deadline),
            " (passed)" if passed else "",
        )

    @admin.display(description=_("decided"))
    def decided_display(self, obj: ToolCall) -> str:
        return when(obj.decided_at)

    @admin.display(description=_("created"))
    def created_display(self, obj: ToolCall) -> str:
        return when(obj.created_at)

    @admin.display(description=_("started"))
    def started_display(self, obj: ToolCall) -> str:
        return when(obj.started_at)

    @admin.display(description=_("heartbeat"))
    def heartbeat_display(self, obj: ToolCall) -> str:
        return when(obj.heartbeat_at)

    @admin.display(description=_("finished"))
    def finished_display(self, obj: ToolCall) -> str:
        return when(obj.finished_at)
