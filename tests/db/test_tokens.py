"""Approval tokens: checked before a decision short-circuits, bound to the call as it is
(an unknown outcome's attempt too), expiring by default; and the rejection the model reads."""

from __future__ import annotations

import pytest
from django.core import signing

from django_agentrun import approve_tool_call, reject_tool_call, resolve_tool_call, services
from django_agentrun.conf import DEFAULTS, agentrun_settings
from django_agentrun.exceptions import ApprovalError, InvalidToken
from django_agentrun.models import RunEvent
from django_agentrun.services.decisions import declined_text
from django_agentrun.states import ToolCallState
from django_agentrun.tokens import TOKEN_SALT
from tests import factories
from tests.conftest import drive

pytestmark = pytest.mark.django_db


def forged(call) -> str:
    token = services.approval_token(call)
    return token[:-2] + ("AA" if not token.endswith("AA") else "BB")


def test_tokens__expire_by_default(settings, parked_call):
    assert DEFAULTS["APPROVAL_TOKEN_MAX_AGE"] == 3600
    token = signing.dumps({"tc": parked_call.pk, "h": parked_call.arguments_hash}, salt=TOKEN_SALT)
    services.check_approval_token(parked_call, token)
    settings.AGENTRUN_APPROVAL_TOKEN_MAX_AGE = -1  # read live: every token is now too old
    assert agentrun_settings.APPROVAL_TOKEN_MAX_AGE == -1
    with pytest.raises(InvalidToken, match="expired"):
        services.check_approval_token(parked_call, token)
    settings.AGENTRUN_APPROVAL_TOKEN_MAX_AGE = None
    services.check_approval_token(parked_call, token)


@pytest.fixture
def parked_call():
    return factories.parked()[1]


def test_tokens__a_forged_token_on_an_approved_call_is_refused(parked_call):
    call = parked_call
    token = services.approval_token(call)
    approve_tool_call(call, by=None, token=token)
    approve_tool_call(call, by=None, token=token)  # twice, with its token: a no-op
    events = RunEvent.objects.count()
    with pytest.raises(InvalidToken):
        approve_tool_call(call, by=None, token=forged(call))
    assert RunEvent.objects.count() == events


def test_tokens__a_forged_token_on_a_rejected_call_is_refused(parked_call):
    call = parked_call
    token = services.approval_token(call)
    reject_tool_call(call, by=None, reason="no", token=token)
    reject_tool_call(call, by=None, reason="no", token=token)  # twice: a no-op
    with pytest.raises(InvalidToken):
        reject_tool_call(call, by=None, reason="no", token=forged(call))


def test_tokens__resolve_takes_a_token_bound_to_the_unknown_attempt(monkeypatch):
    run, call, model = factories.unknown(monkeypatch)
    approval_time = signing.dumps({"tc": call.pk, "h": call.arguments_hash}, salt=TOKEN_SALT)
    with pytest.raises(InvalidToken, match="before this call's outcome became unknown"):
        resolve_tool_call(call, by=None, action="fail", token=approval_time)
    with pytest.raises(InvalidToken):
        resolve_tool_call(call, by=None, action="fail", token=forged(call))
    stale = services.approval_token(call)
    resolve_tool_call(call, by=None, action="retry", token=stale)
    call.refresh_from_db()
    assert call.state == ToolCallState.REQUESTED
    # Found unknown again after the retry: the first page's token no longer applies.
    factories.crashed_at(monkeypatch, "tool.before_handler", model, run=run)
    drive(run, model)
    call.refresh_from_db()
    assert (call.state, call.attempt) == (ToolCallState.UNKNOWN, 2)
    with pytest.raises(InvalidToken):
        resolve_tool_call(call, by=None, action="fail", token=stale)
    resolve_tool_call(call, by=None, action="fail", token=services.approval_token(call))
    call.refresh_from_db()
    assert call.state == ToolCallState.ERRORED
    with pytest.raises(ApprovalError, match="not unknown"):
        resolve_tool_call(call, by=None, action="fail", token=services.approval_token(call))


@pytest.mark.parametrize(
    ("reason", "said"),
    [
        ("", "A person declined this tool call."),
        ("  ", "A person declined this tool call."),
        ("too risky", "A person declined this tool call: too risky."),
        ("Too risky!", "A person declined this tool call: Too risky!"),
        ("not\nto  this\tcustomer.", "A person declined this tool call: not to this customer."),
    ],
)
def test_reject__the_model_reads_one_clean_sentence(reason, said):
    assert declined_text(reason) == said


def test_reject__the_result_is_that_sentence(parked_call):
    call = reject_tool_call(parked_call, by=None, reason="")
    call.refresh_from_db()
    assert (call.result, call.is_error) == ("A person declined this tool call.", True)
