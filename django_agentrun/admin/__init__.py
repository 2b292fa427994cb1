"""Django admin for runs, tool-call decisions and the event log.

Everything here is read-only except through `services`: the run actions call
`cancel_run`/`resume_run`, the decision actions and forms call
`approve_tool_call`, `reject_tool_call` and `resolve_tool_call`. No admin path
saves a model, so no state field is ever written by a form.

Where things are: `display` (badges, pretty JSON), `actions` (list actions and the
permission plumbing they share), `forms` (what a person types), `runs` (RunAdmin),
`toolcalls` and `decisions` (ToolCallAdmin, its filter and decision views), `events`
(RunEventAdmin). Django's autodiscovery imports this package, which registers them.
"""

from __future__ import annotations

from django.contrib import admin

from ..models import Run, RunEvent, ToolCall
from ..permissions import APPROVE_PERMISSION, CANCEL_PERMISSION
from .actions import MAX_LISTED_ERRORS
from .decisions import DecisionFilter
from .display import (
    RUN_STATE_COLOURS,
    TOOL_CALL_STATE_COLOURS,
    TURN_STATE_COLOURS,
    pretty_json,
    state_badge,
)
from .events import RunEventAdmin
from .forms import ApproveForm, BulkDoneForm, BulkRejectForm, RejectForm, ResolveForm
from .runs import MAX_TIMELINE_EVENTS, RunAdmin
from .toolcalls import ToolCallAdmin

admin.site.register(Run, RunAdmin)
admin.site.register(ToolCall, ToolCallAdmin)
admin.site.register(RunEvent, RunEventAdmin)

# Everything `django_agentrun.admin` offered when it was one module.
__all__ = [
    "APPROVE_PERMISSION",
    "CANCEL_PERMISSION",
    "MAX_LISTED_ERRORS",
    "MAX_TIMELINE_EVENTS",
    "RUN_STATE_COLOURS",
    "TOOL_CALL_STATE_COLOURS",
    "TURN_STATE_COLOURS",
    "ApproveForm",
    "BulkDoneForm",
    "BulkRejectForm",
    "DecisionFilter",
    "RejectForm",
    "ResolveForm",
    "RunAdmin",
    "RunEventAdmin",
    "ToolCallAdmin",
    "pretty_json",
    "state_badge",
]
