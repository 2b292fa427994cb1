"""The e-mail of a delivery of kind `email` (AGENTRUN_APPROVAL_EMAILS): to the active users
who may approve and have an address, through Django's mail."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail

from ..models import WebhookDelivery
from ..permissions import APPROVE_PERMISSION

SUBJECTS = {
    "tool_call.awaiting_approval": "{agent}: {tool} waits for approval",
    "tool_call.unknown": "{agent}: the outcome of {tool} is unknown and needs a person",
}


def approvers() -> list[str]:
    """The addresses of the active users who hold the approval permission."""
    users: Any = get_user_model()._default_manager
    try:
        found = users.with_perm(APPROVE_PERMISSION, is_active=True)
    except ValueError:  # several backends: ask the first (Django's ModelBackend, usually)
        backend = settings.AUTHENTICATION_BACKENDS[0]
        found = users.with_perm(APPROVE_PERMISSION, is_active=True, backend=backend)
    return sorted({u.email for u in found if getattr(u, "email", "")})


def send(delivery: WebhookDelivery) -> str:
    """Send the e-mail; what to record of it. ValueError: nobody to send it to."""
    recipients = approvers()
    if not recipients:
        raise ValueError("Nobody who may approve has an e-mail address")
    data = delivery.payload.get("data", {})
    subject = SUBJECTS.get(delivery.event_type, "{agent}: {tool}").format(
        agent=data.get("agent", "?"), tool=data.get("tool_name", "a tool call")
    )
    lines = [
        subject + ".",
        "",
        f"Run: {data.get('run_id')}",
        f"Tool call: {data.get('tool_call_id')} ({data.get('tool_name', '?')})",
    ]
    if data.get("decision_url"):
        lines += ["", f"Decide: {data['decision_url']}"]
    sent = send_mail(f"[agentrun] {subject}", "\n".join(lines), None, recipients)
    return f"sent to {len(recipients)} recipient(s)" if sent else "the mail backend sent nothing"
