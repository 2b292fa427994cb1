"""RunEventAdmin: the append-only event log of the runs a user may see, read-only,
approval tokens redacted, large payloads folded."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..events import redact_secrets
from ..models import RunEvent
from .display import FIELD_FOLD_CHARS, pretty_json, run_link, summary, value_url, when
from .values import ValueViewMixin
from .visibility import VisibleRunsMixin


class RunEventAdmin(VisibleRunsMixin, ValueViewMixin, admin.ModelAdmin):
    values = {"payload": lambda event: redact_secrets(event.payload)}
    list_display = ("seq", "run_link", "type", "time_display", "payload_summary")
    list_display_links = ("seq",)
    list_filter = ("type",)
    search_fields = ("run__id",)
    list_select_related = ("run",)
    fields = ("run_link", "seq", "type", "time_display", "payload_display")
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

    @admin.display(description=_("time"), ordering="created_at")
    def time_display(self, obj: RunEvent) -> str:
        return when(obj.created_at)

    # Staff may read whole payloads (the run page shows the config too), but approval
    # tokens are decisions' credentials: only the decision forms carry them.
    @admin.display(description=_("payload"))
    def payload_summary(self, obj: RunEvent) -> str:
        return summary(redact_secrets(obj.payload), limit=120)

    @admin.display(description=_("payload"))
    def payload_display(self, obj: RunEvent) -> SafeString:
        return pretty_json(redact_secrets(obj.payload), FIELD_FOLD_CHARS, value_url(obj, "payload"))
