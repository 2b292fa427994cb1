"""ToolCallAdmin: tool calls read-only, decided through `services` by list actions
(`actions.ToolCallActionsMixin`) and on each call's page (`decisions.DecisionViewsMixin`)."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..events import redact_secrets
from ..models import ToolCall
from ..permissions import APPROVE_PERMISSION
from .actions import ToolCallActionsMixin
from .decisions import DecisionFilter, DecisionViewsMixin
from .display import pretty_json, run_link, state_badge


class ToolCallAdmin(DecisionViewsMixin, ToolCallActionsMixin, admin.ModelAdmin):
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
        return False  # decisions go through the decision forms, never a model save

    def has_delete_permission(self, request: HttpRequest, obj: ToolCall | None = None) -> bool:
        return False

    # ----------------------------------------------------------------- columns

    @admin.display(description=_("run"), ordering="run__created_at")
    def run_link(self, obj: ToolCall) -> SafeString:
        return run_link(obj)

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
