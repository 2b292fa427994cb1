"""Approval tokens: signed, bound to a tool call and the hash of its arguments (and, for an
unknown outcome, to the attempt that left it unknown), so a decision made on what a person
saw cannot apply to a call that changed since. They expire (AGENTRUN_APPROVAL_TOKEN_MAX_AGE).

A token is minted when a decision is shown (`approval_token`), never stored: a reader of
events or of a call's approval payload cannot take one."""

from __future__ import annotations

from typing import Any

from django.core import signing

from .conf import agentrun_settings
from .exceptions import InvalidToken
from .states import ToolCallState

TOKEN_SALT = "django_agentrun.approval"


def approval_token(call: Any) -> str:
    """A signed token for a decision on this call as it is now."""
    data: dict[str, Any] = {"tc": call.pk, "h": call.arguments_hash}
    if call.state == ToolCallState.UNKNOWN:
        # A call retried and found unknown again is another question: its own token.
        data["u"] = call.attempt
    return signing.dumps(data, salt=TOKEN_SALT)


def check_approval_token(call: Any, token: str) -> None:
    """InvalidToken unless `token` was made for this call as it is now, and is not too old."""
    max_age = agentrun_settings.APPROVAL_TOKEN_MAX_AGE
    try:
        data = signing.loads(token, salt=TOKEN_SALT, max_age=max_age)
    except signing.SignatureExpired as exc:
        raise InvalidToken(
            f"The approval token expired (older than {max_age:g} s): reload the call for a "
            "fresh one."
        ) from exc
    except signing.BadSignature as exc:
        raise InvalidToken("The approval token is invalid or expired.") from exc
    if (
        not isinstance(data, dict)
        or data.get("tc") != call.pk
        or data.get("h") != call.arguments_hash
    ):
        raise InvalidToken("The approval token does not match this tool call and its arguments.")
    if call.state == ToolCallState.UNKNOWN and data.get("u") != call.attempt:
        raise InvalidToken(
            "The approval token was made before this call's outcome became unknown: reload "
            "the call for a fresh one."
        )
