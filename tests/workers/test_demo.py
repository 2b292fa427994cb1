"""The README's first command, `manage.py agentrun_demo`, end to end with real processes.

It runs as a subprocess on a fresh state directory (SQLite, and kombu's filesystem
transport or Redis): a worker is killed after the provider accepted the message,
and the run must complete with exactly one message delivered.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("AGENTRUN_TEST_REDIS", "redis://127.0.0.1:6379").rstrip("/")
# Settings of the test session that must not leak into the demo's processes.
LEAKS = ("DATABASE_URL", "AGENTRUN_TEST_DB_NAME", "AGENTRUN_FAILPOINTS", "ANTHROPIC_API_KEY")


# SQLite and the demo's own settings: the Postgres driver plays no part.
pytestmark = pytest.mark.one_driver


def _redis_answers() -> bool:
    parts = urlsplit(REDIS_URL)
    try:
        with socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or 6379), 0.5
        ) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.mark.integration
@pytest.mark.timeout(120)
@pytest.mark.parametrize("broker", ["filesystem", "redis"])
def test_demo_delivers_exactly_one_message(broker, tmp_path):
    if broker == "redis" and not _redis_answers():
        pytest.skip(f"Redis is not running at {REDIS_URL}")
    env = {k: v for k, v in os.environ.items() if k not in LEAKS}
    env["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
    state = tmp_path / "demo"
    argv = [sys.executable, "manage.py", "agentrun_demo", "--state-dir", str(state)]
    # The scripted model (no API key), and a queue of this test's own on a shared Redis.
    argv += ["--model", "scripted", "--broker", broker, "--no-color"]
    argv += ["--redis-url", f"{REDIS_URL}/9", "--queue", f"agentrun-demo-{uuid.uuid4().hex[:8]}"]
    argv += ["--timeout", "50"]

    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=100)
    output = done.stdout + done.stderr

    assert done.returncode == 0, output
    assert "killed at failpoint tool.after_handler (exit 137)" in output, output
    assert "send_customer_message source=reconciled message_id=msg-" in output, output
    assert "Delivered messages: 1 (exactly once)" in output, output
    assert "exactly one message" in output, output
    # The provider's own store agrees: one message, sent with the call's idempotency key.
    lines = (state / "provider" / "messages.jsonl").read_text().splitlines()
    assert len(lines) == 1, lines
    assert len(json.loads(lines[0])["client_reference"]) == 64  # sha256 hex
