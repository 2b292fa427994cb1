"""RunAdmin: runs read-only, the conversation first on each run's page (with "Fork from
this turn"), cancel/resume through `services` (list actions and buttons), the runs a user
may see only (`visibility`), and filters for the runs that look stuck."""

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
from ..events import redact_secrets, shown_content
from ..exceptions import AgentRunError
from ..models import Run, RunEvent, ToolCall, Turn
from ..permissions import can_act_on_run
from ..states import RunState
from .actions import RunActionsMixin, cancel_reason, check_may_act
from .conversation import conversation
from .display import (
    FIELD_FOLD_CHARS,
    change_url,
    input_summary,
    pretty_json,
    state_badge,
    summary,
    value_url,
    when,
)
from .filters import StateFilter, StuckFilter
from .forks import ForkViewsMixin
from .overview import OverviewMixin
from .values import ValueViewMixin
from .visibility import VisibleRunsMixin

MAX_TIMELINE_EVENTS = 500
# Turns shown on a run's page (the last ones; `?turns=all` shows every one).
MAX_CONVERSATION_TURNS = 50
RUN_VALUES = {
    "input": lambda run: run.input,
    "output": lambda run: redact_secrets(run.output),
    "metadata": lambda run: run.metadata,
    "config": lambda run: run.config,
}


class RunAdmin(
    OverviewMixin,
    VisibleRunsMixin,
    ForkViewsMixin,
    ValueViewMixin,
    RunActionsMixin,
    admin.ModelAdmin,
):
    run_path = ""
    values = RUN_VALUES
    change_form_template = "admin/agentrun/run/change_form.html"
    list_display = (
        "short_id",
        "input_display_short",
        "agent",
        "state_display",
        "owner",
        "turns_display",
        "cost_display",
        "created_display",
    )
    list_display_links = ("short_id", "input_display_short")
    list_filter = (("state", StateFilter), StuckFilter, "agent")
    search_fields = ("id", "correlation_id", "agent", "owner__username")
    list_select_related = ("owner",)
    actions = ("cancel_selected", "resume_selected")
    fieldsets = (
        (None, {"fields": ("id", "agent", "state_display", "owner", "correlation_id", "forked")}),
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
                    "cancel_requested_display",
                    "cancel_reason",
                    "cancel_requested_by",
                    "deadline_display",
                ),
            },
        ),
        (
            _("Lease and recovery"),
            {
                "classes": ("collapse",),
                "fields": (
                    "lease_owner",
                    "lease_expires_display",
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
            {
                "fields": (
                    "created_display",
                    "queued_display",
                    "started_display",
                    "finished_display",
                )
            },
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
        # Superusers, and never a run a worker may still advance (cancel it first).
        return request.user.is_superuser and (obj is None or not obj.is_active)

    def get_deleted_objects(self, objs, request):
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        # Turns, tool calls and events go with their run; they have no delete permission
        # of their own (the event log is append-only), so do not count them as lacking.
        children = {str(model._meta.verbose_name) for model in (Turn, ToolCall, RunEvent)}
        perms_needed = {name for name in perms_needed if str(name) not in children}
        return deleted, counts, perms_needed, protected

    def value(self, obj: Run, name: str) -> Any:
        if name.startswith("turn-"):
            return shown_content(obj.turns.get(index=int(name.removeprefix("turn-"))).content)
        return super().value(obj, name)

    # ----------------------------------------------------------------- columns

    @admin.display(description=_("run"), ordering="id")
    def short_id(self, obj: Run) -> str:
        return str(obj.pk)[:8]

    @admin.display(description=_("input"))
    def input_display_short(self, obj: Run) -> str:
        return input_summary(obj.input, 70)

    @admin.display(description=_("state"), ordering="state")
    def state_display(self, obj: Run) -> SafeString:
        return state_badge(obj)

    @admin.display(description=_("input"))
    def input_display(self, obj: Run) -> SafeString:
        return pretty_json(obj.input, FIELD_FOLD_CHARS, value_url(obj, "input"))

    @admin.display(description=_("output"))
    def output_display(self, obj: Run) -> SafeString:
        return pretty_json(redact_secrets(obj.output), FIELD_FOLD_CHARS, value_url(obj, "output"))

    @admin.display(description=_("configuration snapshot"))
    def config_display(self, obj: Run) -> SafeString:
        return pretty_json(obj.config, FIELD_FOLD_CHARS, value_url(obj, "config"))

    @admin.display(description=_("metadata"))
    def metadata_display(self, obj: Run) -> SafeString:
        return pretty_json(obj.metadata, FIELD_FOLD_CHARS, value_url(obj, "metadata"))

    @admin.display(description=_("forked from"))
    def forked(self, obj: Run) -> str:
        if obj.forked_from_id is None:
            return "—"
        return f"{obj.forked_from_id} (turn {obj.forked_at_turn})"

    @admin.display(description=_("turns"), ordering="turn_count")
    def turns_display(self, obj: Run) -> int:
        return obj.turn_count

    @admin.display(description=_("cost ($)"), ordering="cost_usd")
    def cost_display(self, obj: Run) -> str:
        return f"{obj.cost_usd:.4f}"

    @admin.display(description=_("created"), ordering="created_at")
    def created_display(self, obj: Run) -> str:
        return when(obj.created_at)

    @admin.display(description=_("queued"))
    def queued_display(self, obj: Run) -> str:
        return when(obj.queued_at)

    @admin.display(description=_("started"))
    def started_display(self, obj: Run) -> str:
        return when(obj.started_at)

    @admin.display(description=_("finished"))
    def finished_display(self, obj: Run) -> str:
        return when(obj.finished_at)

    @admin.display(description=_("cancel requested"))
    def cancel_requested_display(self, obj: Run) -> str:
        return when(obj.cancel_requested_at)

    @admin.display(description=_("deadline"))
    def deadline_display(self, obj: Run) -> str:
        return when(obj.deadline)

    @admin.display(description=_("lease expires"))
    def lease_expires_display(self, obj: Run) -> str:
        return when(obj.lease_expires_at)

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
        try:
            check_may_act(request, run, "cancel")
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
        try:
            check_may_act(request, run, "resume")
            services.check_begin(request.user, run, "resume")
            run = services.resume_run(run, by=request.user)
        except AgentRunError as exc:
            self.message_user(request, f"Run {run.pk}: {exc}", messages.ERROR)
        else:
            self.log_change(request, run, "Resumed in the admin.")
            self.message_user(request, "The run was queued again.", messages.SUCCESS)
        return HttpResponseRedirect(change_url(run))

    # ----------------------------------------------------------------- the page

    def change_view(self, request, object_id, form_url="", extra_context=None):
        run = self.get_object(request, unquote(object_id))
        if run is not None:
            extra_context = {**(extra_context or {}), **self._page(request, run)}
        return super().change_view(request, object_id, form_url, extra_context)

    def _page(self, request: HttpRequest, run: Run) -> dict[str, Any]:
        total = run.events.count()
        events = [
            {
                "event": event,
                "time": when(event.created_at),
                "summary": summary(redact_secrets(event.payload), 200),
                "url": change_url(event),
            }
            for event in run.events.order_by("-seq")[:MAX_TIMELINE_EVENTS]
        ][::-1]
        pending = run.tool_calls.pending_decision().count()
        may_act = can_act_on_run(request.user, run)
        forks = list(self.get_queryset(request).filter(forked_from=run).order_by("created_at"))
        original = (
            self.get_queryset(request).filter(pk=run.forked_from_id).first()
            if run.forked_from_id
            else None
        )
        return {
            "conversation": conversation(
                run, last=None if request.GET.get("turns") == "all" else MAX_CONVERSATION_TURNS
            ),
            "fork_urls": self.fork_points(request, run),
            "run_badge": state_badge(run),
            "forks": [(fork, change_url(fork), when(fork.created_at)) for fork in forks],
            "forked_from": (original, change_url(original)) if original else None,
            "timeline_events": events,
            "timeline_events_total": total,
            "timeline_events_cut": total > len(events),
            "pending_decisions": pending,
            "pending_url": reverse("admin:agentrun_toolcall_changelist")
            + f"?decision=pending&run__id__exact={run.pk}",
            "can_cancel": may_act,
            "cancel_url": reverse("admin:agentrun_run_cancel", args=[run.pk]),
            "resume_url": reverse("admin:agentrun_run_resume", args=[run.pk]),
            "show_cancel": run.is_active,
            "show_resume": run.state in (RunState.FAILED, RunState.CANCELLED, RunState.TIMED_OUT),
            "failed": run.state == RunState.FAILED,
        }
