"""The admin's list filters: states as the API spells them, the calls that wait for a
decision (the default of the queue), and the runs that look stuck, each with its count."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.db.models import Count, Q, QuerySet
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..states import RunPhase, ToolCallState


class StateFilter(admin.ChoicesFieldListFilter):
    """A choices field's values (states, side effects), spelled as the API spells them
    (`awaiting_approval`, `non_idempotent`), not their labels."""

    def choices(self, changelist):
        facets = self.get_facet_queryset(changelist) if changelist.add_facets else None
        yield {
            "selected": self.lookup_val is None,
            "query_string": changelist.get_query_string(remove=[self.lookup_kwarg]),
            "display": _("All"),
        }
        for i, (value, _label) in enumerate(self.field.flatchoices):
            yield {
                "selected": self.lookup_val is not None and str(value) in self.lookup_val,
                "query_string": changelist.get_query_string({self.lookup_kwarg: value}),
                "display": f"{value} ({facets[f'{i}__c']})" if facets else value,
            }


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


# Runs that wait for a person, or for a worker (queued, or released between steps); by
# Run.phase, as the reaper's partial indexes select them.
WAITING = Q(phase__in=(RunPhase.QUEUED, RunPhase.PARKED)) | Q(phase=RunPhase.LEASED, lease_owner="")


def stuck_conditions(now: Any) -> dict[str, tuple[str, Q]]:
    """Each way a run can look stuck: its label and the condition (times by the app's clock)."""
    return {
        "lease_expired": (
            _("Lease expired (its worker died?)"),
            Q(phase=RunPhase.LEASED, lease_expires_at__lt=now) & ~Q(lease_owner=""),
        ),
        "recovered": (_("Recovered more than once"), Q(recovery_attempts__gt=1)),
        "waiting_1h": (
            _("Waiting over 1 hour"),
            WAITING & Q(updated_at__lt=now - timedelta(hours=1)),
        ),
        "waiting_1d": (
            _("Waiting over 1 day"),
            WAITING & Q(updated_at__lt=now - timedelta(days=1)),
        ),
    }


class StuckFilter(admin.SimpleListFilter):
    """Runs a person should look at: a dead worker's lease, repeated crash recoveries, a
    long wait for a worker (queued) or a person (awaiting_approval); with counts."""

    title = _("stuck runs")
    parameter_name = "stuck"

    def lookups(self, request, model_admin):
        conditions = stuck_conditions(timezone.now())
        visible = model_admin.get_queryset(request)
        counts = visible.aggregate(
            **{key: _count(condition) for key, (_label, condition) in conditions.items()}
        )
        return [(key, f"{label} ({counts[key]})") for key, (label, _c) in conditions.items()]

    def queryset(self, request, queryset: QuerySet[Any]):
        condition = stuck_conditions(timezone.now()).get(self.value() or "")
        return queryset.filter(condition[1]) if condition else queryset


def _count(condition: Q) -> Any:
    return Count("pk", filter=condition)
