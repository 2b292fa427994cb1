"""ConversationAdmin: conversations read-only, the ones a user may see (the rule of runs:
`Conversation.objects.visible_to`), each page listing its runs in order with links to
their pages. (A run's own page, with the model's words, is `RunAdmin`'s; `conversation.py`
renders one run as a conversation.)"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..models import Conversation
from ..states import ConversationStatus
from .display import change_url, cut, input_summary, pretty_json, state_badge, when

STATUS_COLOURS: dict[str, str] = {
    ConversationStatus.IDLE: "#198754",
    ConversationStatus.BUSY: "#0d6efd",
    ConversationStatus.WAITING: "#d9480f",
    ConversationStatus.INTERRUPTED: "#495057",
    ConversationStatus.FAILED: "#dc3545",
}


class ConversationAdmin(admin.ModelAdmin):
    list_display = ("short_id", "agent", "status_display", "owner", "runs_count", "created")
    list_display_links = ("short_id",)
    list_filter = ("agent", "policy")
    search_fields = ("id", "agent", "owner__username")
    list_select_related = ("owner",)
    fields = (
        "id",
        "agent",
        "status_display",
        "owner",
        "policy",
        "runs_display",
        "metadata_display",
        "config_display",
        "created",
        "updated",
    )
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Conversation]:
        runs = Count("runs")  # one query for the list, not one per row
        return Conversation.objects.visible_to(request.user).with_status().annotate(run_total=runs)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # services.start_conversation

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description=_("id"), ordering="id")
    def short_id(self, obj: Conversation) -> str:
        return str(obj.pk)[:8]

    @admin.display(description=_("status"))
    def status_display(self, obj: Conversation) -> SafeString:
        status = obj.status
        return format_html(
            '<span class="agentrun-badge" style="background:{};color:#fff;padding:2px 8px;'
            'border-radius:10px;font-size:11px;font-weight:600;white-space:nowrap;" title="{}">'
            "{}</span>",
            STATUS_COLOURS.get(status, "#343a40"),
            ConversationStatus(status).label,
            status,
        )

    @admin.display(description=_("runs"), ordering="run_total")
    def runs_count(self, obj: Conversation) -> int:
        return obj.run_total

    @admin.display(description=_("created"), ordering="created_at")
    def created(self, obj: Conversation) -> str:
        return when(obj.created_at)

    @admin.display(description=_("updated"), ordering="updated_at")
    def updated(self, obj: Conversation) -> str:
        return when(obj.updated_at)

    @admin.display(description=_("runs, in order"))
    def runs_display(self, obj: Conversation) -> SafeString:
        rows = format_html_join(
            "",
            '<tr><td>{}</td><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td></tr>',
            (
                (
                    run.conversation_position,
                    change_url(run),
                    str(run.pk)[:8],
                    state_badge(run),
                    cut(input_summary(run.input), 120),
                    _("rolled back") if run.rolled_back else "",
                )
                for run in obj.runs.order_by("conversation_position")
            ),
        )
        return format_html("<table>{}</table>", rows) if rows else "—"

    @admin.display(description=_("metadata"))
    def metadata_display(self, obj: Conversation) -> SafeString:
        return pretty_json(obj.metadata)

    @admin.display(description=_("configuration"))
    def config_display(self, obj: Conversation) -> SafeString:
        return pretty_json(obj.config, limit=3000)
