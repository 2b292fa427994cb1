"""Schemathesis, driven by the API's own OpenAPI document, against the whole Django
stack (WSGI, every middleware, basic auth): no 5xx, and every response documented
and matching its schema, for valid and invalid requests alike.

Bounded and derandomized (same examples every run, no shrinking against a changing
database): about half a minute. `AGENTRUN_FUZZ_EXAMPLES=N` (per operation and mode)
and `AGENTRUN_FUZZ_SEED=random` explore further by hand.
"""

from __future__ import annotations

import base64
import os

import pytest
import schemathesis
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from django_agentrun import services, start_run
from django_agentrun.testing import ScriptedClient, reply, text
from tests import factories
from tests.conftest import drive
from tests.factories import parked

# The surface (views, serializers, admin) runs the same on either Postgres driver.
pytestmark = [pytest.mark.django_db, pytest.mark.one_driver]

EXAMPLES = int(os.environ.get("AGENTRUN_FUZZ_EXAMPLES", "20"))
DERANDOMIZE = os.environ.get("AGENTRUN_FUZZ_SEED") != "random"
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


@pytest.fixture
def world(db, monkeypatch):
    """The fuzzer (who may decide) with runs in several states, and someone else's."""
    fuzzer = factories.user("fuzzer", "approve_toolcall")
    other = factories.user("other")
    to_approve, to_reject = parked(fuzzer)[1], parked(fuzzer)[1]
    unknown = factories.unknown(monkeypatch, fuzzer)[1]
    done = start_run("test-agent", "hi", owner=fuzzer, metadata={"k": [1, "x"]})
    drive(done, ScriptedClient([reply(text("Hello."))]))
    theirs = parked(other)[1]
    mine = services.start_conversation("chat", owner=fuzzer)
    services.send_message(mine, "hello")
    theirs_too = services.start_conversation("chat", owner=other)
    return {
        "runs": [str(c.run_id) for c in (to_approve, unknown, theirs)] + [str(done.pk)],
        "calls": [c.pk for c in (to_approve, to_reject, unknown, theirs)],
        "conversations": [str(mine.pk), str(theirs_too.pk)],
        # One valid decision (and fork) each, so their 2xx responses are checked too.
        "decisions": {
            "fork": (str(done.pk), {"turn": 0}),
            "messages": (str(mine.pk), {"input": "fuzz", "context": "Monday", "policy": "enqueue"}),
            "approve": (to_approve.pk, {"token": services.approval_token(to_approve)}),
            "reject": (
                to_reject.pk,
                {"token": services.approval_token(to_reject), "reason": "fuzz"},
            ),
            "resolve": (
                unknown.pk,
                {"token": services.approval_token(unknown), "action": "done", "result": [1]},
            ),
        },
    }


def _strategies(operation, mode: GenerationMode, world: dict) -> list:
    strategies = [operation.as_strategy(generation_mode=mode)]
    if "{id}" not in operation.path:
        return strategies
    kind = operation.path.split("/")[3]  # /api/agentrun/<kind>/{id}/...
    ids = {"runs": world["runs"], "tool-calls": world["calls"]}.get(kind, world["conversations"])
    strategies += [
        operation.as_strategy(generation_mode=mode, path_parameters={"id": pk}) for pk in ids
    ]
    decision = operation.path.rstrip("/").rsplit("/", 1)[-1]
    if mode == GenerationMode.POSITIVE and decision in world["decisions"]:
        pk, body = world["decisions"][decision]
        strategies.append(
            operation.as_strategy(generation_mode=mode, path_parameters={"id": pk}, body=body)
        )
    return strategies


@pytest.fixture
def app():
    """Django's WSGI handler. As in Django's test client, requests leave the connection
    open: closing it at request end would end the test's transaction on Postgres."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield WSGIHandler()
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


def _startable(body, agent: str = "test-agent") -> None:
    """Make a generated run (or conversation) body one that starts a run, the fuzzed
    metadata, correlation id and idempotency key aside: random ones nearly never do."""
    if isinstance(body, dict):
        body["agent"] = agent
        body.pop("deadline", None)  # a generated one is mostly in the past
        if not (isinstance(body.get("input"), str) and body["input"].strip()):
            body["input"] = "hi"


def test_fuzz__no_server_error_and_every_response_as_documented(world, app):
    auth = {"Authorization": "Basic " + base64.b64encode(b"fuzzer:pw").decode()}
    schema = schemathesis.openapi.from_wsgi("/api/agentrun/schema/", app, headers=auth)
    # The live stream is an SSE view served under ASGI, tested by tests/db/test_streams.py.
    operations = [
        op
        for op in (result.ok() for result in schema.get_all_operations())
        if not op.path.endswith("/stream/")
    ]
    assert len(operations) == 16
    # Decisions before cancel and resume, which would close the calls they decide on.
    operations.sort(key=lambda op: "/tool-calls/" not in op.path)

    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(
                max_examples=EXAMPLES,
                derandomize=DERANDOMIZE,
                database=None,
                deadline=None,
                # A failure is reported as found: shrinking replays against a changed db.
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=st.one_of(_strategies(operation, mode, world)), known=st.booleans())
            def check(case, known: bool) -> None:
                if known and case.operation.label == "POST /api/agentrun/runs/":
                    _startable(case.body)
                if known and case.operation.label == "POST /api/agentrun/conversations/":
                    _startable(case.body, "chat")
                response = case.call(headers=auth)
                case.validate_response(response, checks=CHECKS, headers=auth)

            check()
