from __future__ import annotations

import pytest

from django_agentrun import start_run
from django_agentrun.testing import ScriptedClient, reply, text, tool_use
from tests.conftest import assert_projection_matches, drive

pytestmark = pytest.mark.django_db(transaction=False)


def test_two_turns(django_capture_on_commit_callbacks):
    client = ScriptedClient(
        [
            reply(text("Let me look."), tool_use("lookup", {"query": "x"})),
            reply(text("The answer.")),
        ]
    )
    run = start_run("test-agent", "hello")
    out = drive(run, client)
    run.refresh_from_db()
    assert run.state == "completed", (out, run.error_code, run.error_message)
    assert run.output["text"] == "The answer."
    assert_projection_matches(run)
