"""Django admin for runs, tool-call decisions and the event log: an operator's console.

Everything about runs here is read-only except through `services`: the run actions call
`cancel_run`/`resume_run`/`fork_run`, the decision actions and forms call
`approve_tool_call`, `reject_tool_call` and `resolve_tool_call`, each with a token minted
as the decision was shown. No admin path saves a run, turn or call, so no state field is
ever written by a form (webhook subscriptions are plain rows, saved by their form). A user sees the runs the API shows them, and their calls and events
(`visibility`); a run's owner may cancel, resume and fork it, as in the API.

Where things are: `display` (badges, printable and folded values, dates), `visibility`,
`filters`, `conversation` (a run as the model's words, calls and decisions), `values`
(the whole of a folded value), `actions` (run list actions and the plumbing they share),
`bulk` (decisions on several calls, through a confirmation page), `forms`, `forks`,
`runs` (RunAdmin), `toolcalls` and `decisions` (ToolCallAdmin and its decision views),
`events` (RunEventAdmin), `conversations` (ConversationAdmin: a conversation's runs in
order), `webhooks` (subscriptions; the outbox's deliveries and their tries, resend). Django's autodiscovery imports this package, which registers them.
"""

from __future__ import annotations

from django.contrib import admin

from ..models import Conversation, Run, RunEvent, ToolCall, WebhookDelivery, WebhookSubscription
from ..permissions import APPROVE_PERMISSION, CANCEL_PERMISSION
from .actions import MAX_LISTED_ERRORS
from .bulk import BULK_MAX_ARGUMENT_CHARS
from .conversations import ConversationAdmin
from .display import (
    RUN_STATE_COLOURS,
    TOOL_CALL_STATE_COLOURS,
    TURN_STATE_COLOURS,
    pretty_json,
    printable,
    state_badge,
)
from .events import RunEventAdmin
from .filters import DecisionFilter, StuckFilter
from .forms import ApproveForm, BulkDoneForm, BulkRejectForm, RejectForm, ResolveForm
from .runs import MAX_TIMELINE_EVENTS, RunAdmin
from .toolcalls import ToolCallAdmin
from .webhooks import DeliveryAdmin, SubscriptionAdmin

admin.site.register(Run, RunAdmin)
admin.site.register(ToolCall, ToolCallAdmin)
admin.site.register(RunEvent, RunEventAdmin)
admin.site.register(Conversation, ConversationAdmin)
admin.site.register(WebhookSubscription, SubscriptionAdmin)
admin.site.register(WebhookDelivery, DeliveryAdmin)

# Everything `django_agentrun.admin` offered when it was one module, and what it adds.
__all__ = [
    "APPROVE_PERMISSION",
    "BULK_MAX_ARGUMENT_CHARS",
    "CANCEL_PERMISSION",
    "MAX_LISTED_ERRORS",
    "MAX_TIMELINE_EVENTS",
    "RUN_STATE_COLOURS",
    "TOOL_CALL_STATE_COLOURS",
    "TURN_STATE_COLOURS",
    "ApproveForm",
    "ConversationAdmin",
    "BulkDoneForm",
    "BulkRejectForm",
    "DecisionFilter",
    "RejectForm",
    "ResolveForm",
    "RunAdmin",
    "RunEventAdmin",
    "StuckFilter",
    "ToolCallAdmin",
    "pretty_json",
    "printable",
    "state_badge",
]
