"""Approval tokens: signed, bound to a tool call and the hash of its arguments, so a
decision made on what a person saw cannot apply to arguments edited since."""

from __future__ import annotations

from typing import Any

from django.core import signing

from .conf import agentrun_settings
from .exceptions import InvalidToken

TOKEN_SALT = "django_agentrun.approval"


def approval_token(call: Any) -> str:
    """A signed resume token bound to this call and the hash of its arguments."""
    return signing.dumps({"tc": call.pk, "h": call.arguments_hash}, salt=TOKEN_SALT)


def check_approval_token(call: Any, token: str) -> None:
    """InvalidToken unless `token` was made for this call and its current arguments."""
    try:
        data = signing.loads(
            token, salt=TOKEN_SALT, max_age=agentrun_settings.APPROVAL_TOKEN_MAX_AGE
        )
    except signing.BadSignature as exc:
        raise InvalidToken("The approval token is invalid or expired.") from exc
    if data.get("tc") != call.pk or data.get("h") != call.arguments_hash:
        raise InvalidToken("The approval token does not match this tool call and its arguments.")
