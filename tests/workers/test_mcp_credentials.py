"""A fork acts with the credentials of whoever forked it (issue 37: an operator's fork of
another user's run called the MCP server with the original owner's token): a real worker,
the test MCP server over streamable HTTP, each owner's headers from `headers=`."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from django_agentrun import fork_run, start_run
from django_agentrun.testing.messages_api import Reply, by_step, text, tool_use
from tests.processes import wait_resting
from tests.testapp.mcp_server import calls
from tests.workers.test_mcp import http_server, mcp_log  # noqa: F401 - fixtures

pytest.importorskip("mcp")


def test_fork__by_an_operator_calls_the_server_with_the_operators_token(
    workers,
    messages_api,
    http_server,  # noqa: F811
):
    messages_api.script = by_step(
        [
            Reply([tool_use("set_flag", {"order": "o1", "flag": "gift"}, id="toolu_flag")]),
            Reply([text("Flagged.")]),
        ]
    )
    workers.start()
    users = get_user_model().objects
    ann, oscar = users.create_user("ann", password="x"), users.create_user("oscar", password="x")
    original = start_run("mcp-http", "Flag o1", owner=ann)
    wait_resting(original)
    assert original.state == "completed", workers.logs()
    fork = fork_run(original, at_turn=0, by=oscar)
    wait_resting(fork)
    assert fork.state == "completed", workers.logs()
    assert [r["auth"] for r in calls("set_flag")] == [
        "Bearer token-of-ann",
        "Bearer token-of-oscar",
    ]
