import pytest
from django_agentrun import send_message, start_conversation
from django_agentrun.testing import ScriptedClient, reply, text, tool_use
from tests.conftest import drive

pytestmark = pytest.mark.django_db


def test_smoke():
    conv = start_conversation("test-agent")
    model = ScriptedClient([reply(tool_use("lookup", {"query": "a"})), reply(text("one")), reply(text("two"))])
    r1 = send_message(conv, "first")
    drive(r1, model)
    assert r1.state == "completed"
    r2 = send_message(conv, "second", context="Today is Monday")
    drive(r2, model)
    assert r2.state == "completed", (r2.state, r2.error_message)
    msgs = model.requests[-1].messages
    print(msgs)
    assert msgs[-1]["role"] == "user"
    assert conv.status == "idle"
