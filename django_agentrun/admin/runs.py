"""RunAdmin: runs read-only, with a timeline of turns, tool calls and events, and
cancel/resume through `services` (list actions and buttons on the run's page)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import path, reverse
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_POST

from .. import services
from ..events import redact_secrets
from ..exceptions import AgentRunError
from ..models import Run, RunEvent, ToolCall, Turn
from ..permissions import CANCEL_PERMISSION
from ..states import RunState, ToolCallState
from .actions import RunActionsMixin, cancel_reason
from .display import change_url, pretty_json, state_badge, summary

MAX_TIMELINE_EVENTS = 500


class RunAdmin(RunActionsMixin, admin.ModelAdmin):
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
            self.refuse(request, CANCEL_PERMISSION)
        else:
            try:
                run = services.cancel_run(run, by=request.user, reason=cancel_reason(request))
            except AgentRunError as exc:
                self.message_user(request, f"Run {run.pk}: {exc}", messages.ERROR)
            else:
                self.log_change(request, run, "Cancellation requested in the admin.")
                self.message_user(
                    request, f"Cancellation requested; the run is {run.state}.", messages.SUCCESS
                )
        return HttpResponseRedirect(change_url(run))

    def resume_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        run = self._get_run(request, object_id)
        if not self.has_cancel_permission(request):
            self.refuse(request, CANCEL_PERMISSION)
        else:
            try:
                run = services.resume_run(run, by=request.user)
            except AgentRunError as exc:
                self.message_user(request, f"Run {run.pk}: {exc}", messages.ERROR)
            else:
                self.log_change(request, run, "Resumed in the admin.")
                self.message_user(request, "The run was queued again.", messages.SUCCESS)
        return HttpResponseRedirect(change_url(run))

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
                    "url": change_url(call),
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
            {"event": event, "summary": summary(redact_secrets(event.payload))}
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
