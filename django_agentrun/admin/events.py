"""RunEventAdmin: the append-only event log, read-only, approval tokens redacted."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..events import redact_secrets
from ..models import RunEvent
from .display import pretty_json, run_link, summary


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
        return run_link(obj)

    # Staff may read whole payloads (the run page shows the config too), but approval
    # tokens are decisions' credentials: only the decision forms carry them.
    @admin.display(description=_("payload"))
    def payload_summary(self, obj: RunEvent) -> str:
        return summary(redact_secrets(obj.payload), limit=120)

    @admin.display(description=_("payload"))
    def payload_display(self, obj: RunEvent) -> SafeString:
        return pretty_json(redact_secrets(obj.payload))
