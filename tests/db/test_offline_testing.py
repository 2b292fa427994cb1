"""What users test their agents with: script files, the stand-in's command line, the
pytest fixture and `drive`, all through the real `anthropic` SDK."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import entry_points

import anthropic
import pytest

from django_agentrun import approve_tool_call, start_run
from django_agentrun.clients import get_model_client
from django_agentrun.testing import drive
from django_agentrun.testing.messages_api import Reply, by_step, load_script, text, tool_use

# Module-level steps for the `module:attribute` form of load_script.
STEPS = ["From a module."]

# What the run asks the model (the request's rules), not how its rows are stored: the same on
# any Postgres driver and binding (the store's statements run in the other modules).
pytestmark = [pytest.mark.timeout(30), pytest.mark.one_driver]


def ask(base_url: str, messages: list[dict]) -> anthropic.types.Message:
    with anthropic.Anthropic(base_url=base_url, api_key="any", max_retries=0, timeout=5) as client:
        return client.messages.create(model="claude-sonnet-4-6", max_tokens=64, messages=messages)


def body(assistant_turns: int = 0) -> dict:
    messages: list[dict] = [{"role": "user", "content": "Hi"}]
    for _ in range(assistant_turns):
        messages += [
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "go on"},
        ]
    return {"model": "m", "max_tokens": 5, "messages": messages}


# -- script files -------------------------------------------------------------------------


def test_load_script__json_steps(tmp_path):
    path = tmp_path / "script.json"
    path.write_text(
        json.dumps(
            [
                [{"type": "text", "text": "Let me look."}, {"type": "tool_use", "name": "f"}],
                {"type": "text", "text": "One block."},
                {
                    "content": "A reply object.",
                    "stop_reason": "max_tokens",
                    "usage": {"output_tokens": 7},
                },
                "Plain text.",
            ]
        )
    )
    script = load_script(str(path))
    first = script(body(0))
    assert first.stop_reason == "tool_use"
    # The same step asked again (a retry) gets the same tool_use id.
    assert script(body(0)).content[1]["id"] == first.content[1]["id"]
    assert script(body(1)).content == [text("One block.")]
    third = script(body(2))
    assert (third.stop_reason, third.usage) == ("max_tokens", {"output_tokens": 7})
    assert script(body(3)).content == [text("Plain text.")]


@pytest.mark.parametrize(
    "content, message",
    [
        ("[", "not valid JSON"),
        ("{}", "a non-empty JSON list of steps"),
        ('["ok", {"contnet": "typo"}]', "step 1: unknown reply field(s) contnet"),
        ('[["not a block"]]', "step 0: content must be a string or a list of blocks"),
        ('[{"content": "x", "status": "bad"}]', "step 0:"),
    ],
)
def test_load_script__bad_files_name_the_problem(tmp_path, content, message):
    path = tmp_path / "script.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=re.escape(message)):
        load_script(str(path))


def test_load_script__module_attribute():
    assert load_script(f"{__name__}:STEPS")(body(0)).content == [text("From a module.")]
    script = load_script("django_agentrun.testing.messages_api:text")  # any callable
    assert script is text
    with pytest.raises(ValueError, match="cannot import"):
        load_script("no_such_module_here:STEPS")
    with pytest.raises(ValueError, match="give a JSON file or module:attribute"):
        load_script("missing-file.txt")


# -- the command line ---------------------------------------------------------------------


@pytest.fixture
def cli(tmp_path) -> Iterator:
    procs: list[subprocess.Popen] = []

    def start(*args: str) -> tuple[subprocess.Popen, str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "django_agentrun.testing.messages_api", *args],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        first = proc.stdout.readline()  # blocks until it listens (or exits)
        found = re.search(r"listening on (http://\S+)", first)
        assert found, first + proc.stderr.read()
        return proc, found.group(1)

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
        proc.stdout.close()
        proc.stderr.close()


def test_cli__serves_a_script_file_until_sigterm(tmp_path, cli):
    (tmp_path / "script.json").write_text(json.dumps(["Hello from the script.", "Second."]))
    proc, base_url = cli("--port", "0", "--script", "script.json")
    assert ask(base_url, [{"role": "user", "content": "Hi"}]).content[0].text == (
        "Hello from the script."
    )
    with pytest.raises(anthropic.BadRequestError):  # the stand-in refuses what the API refuses
        ask(base_url, [{"role": "assistant", "content": "I speak first"}])
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    lines = proc.stdout.read().splitlines()  # after the "listening on" line read by `cli`
    assert lines[0].startswith(f"  ANTHROPIC_BASE_URL={base_url} ")
    assert lines[1] == "POST /v1/messages step=0 json -> 200"
    assert lines[2].startswith("POST /v1/messages step=1 json -> 400 invalid_request_error: ")
    assert lines[-1] == "Stopped: 1 accepted, 1 refused."


def test_cli__module_script_and_sigint(tmp_path, cli):
    (tmp_path / "my_steps.py").write_text('STEPS = ["From a module."]\n')
    proc, base_url = cli("--port", "0", "--script", "my_steps:STEPS")
    assert ask(base_url, [{"role": "user", "content": "Hi"}]).content[0].text == "From a module."
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=10) == 0
    assert proc.stdout.read().endswith("Stopped: 1 accepted, 0 refused.\n")


def test_cli__a_bad_script_is_refused_before_listening(tmp_path):
    (tmp_path / "script.json").write_text('[{"contnet": "typo"}]')
    done = subprocess.run(
        [sys.executable, "-m", "django_agentrun.testing.messages_api", "--script", "script.json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert done.returncode == 2
    assert "script.json: step 0: unknown reply field(s) contnet" in done.stderr
    assert done.stdout == ""


# -- the pytest fixture and drive -----------------------------------------------------------


def test_fixture__points_the_model_client_at_the_stand_in(agentrun_messages_api):
    assert os.environ["ANTHROPIC_BASE_URL"] == agentrun_messages_api.base_url
    assert repr(get_model_client()).startswith("<AnthropicModelClient")


@pytest.mark.django_db
def test_fixture__drives_a_run_with_an_approval(agentrun_messages_api, admin_user):
    agentrun_messages_api.script = by_step(
        [
            Reply([text("Checking."), tool_use("lookup", {"query": "otters"})]),
            Reply([tool_use("delete_account", {"user": "ann"})]),
            "Done: ann's account is deleted.",
        ]
    )
    run = drive(start_run("test-agent", "Delete ann's account."))
    assert run.state == "awaiting_approval"
    approve_tool_call(run.tool_calls.get(name="delete_account"), by=admin_user)
    run = drive(run)
    assert run.state == "completed"
    assert run.output["text"] == "Done: ann's account is deleted."
    assert agentrun_messages_api.steps() == {0: 1, 1: 1, 2: 1}
    assert all(r["status"] == 200 for r in agentrun_messages_api.requests)


def test_plugin__registered_with_pytest_and_light_to_import():
    (entry,) = [e for e in entry_points(group="pytest11") if e.name == "django_agentrun"]
    assert entry.value == "django_agentrun.testing.pytest_plugin"
    # Loaded in every pytest session of an environment with the package: it must not need
    # Django settings or import models before a fixture runs.
    code = (
        "import sys, django_agentrun.testing.pytest_plugin\n"
        "print(sorted(m for m in sys.modules if m.startswith(('django.db', 'django.conf', "
        "'django_agentrun.models'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=20,
        env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
    )
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr
