"""The README's commands from a checkout, in the README's order, on a fresh clone (issue 37:
its staff-user line failed there, before `make chat` had made the tables or the virtualenv).

The `<!-- readme: checkout -->` block's lines run one after the other in a `git clone` of
this commit: `make chat` for real (with the README's `PORT` and `REDIS_URL`, a Redis db of
the test's own), and, while it serves, `make admin` (with `ADMIN_ARGS=--noinput` and the
user in the environment: createsuperuser asks nothing), then the admin is signed into with
that user. Of `make demo`, `make test` and `make docs` the test checks that the clone's
Makefile has them: the demo runs in tests/workers/test_demo.py, and the other two are what
runs this test. The clone uses
this test session's virtualenv (`.venv` and `.venv-demo` link to it), so nothing is
installed.
"""

from __future__ import annotations

import http.cookiejar
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.processes import REDIS_URL, free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"<!-- readme: checkout -->\n```bash\n(?P<body>.*?)\n```", re.S)
LEAKS = ("DATABASE_URL", "DJANGO_SETTINGS_MODULE", "PYTHONPATH", "ANTHROPIC_API_KEY")
# Which of the block's lines this test runs for real (the others: targets of the Makefile).
RUN = {"chat", "admin"}

pytestmark = [pytest.mark.one_driver, pytest.mark.timeout(180)]


def readme_lines() -> list[list[str]]:
    body = BLOCK.search((ROOT / "README.md").read_text())["body"]
    return [line.split("#")[0].split() for line in body.splitlines() if line.strip()]


def test_readme__the_block_is_the_make_targets_in_order():
    assert [words[1] for words in readme_lines()] == ["demo", "chat", "admin", "test", "docs"]


@pytest.fixture
def clone(tmp_path) -> Path:
    dest = tmp_path / "checkout"
    done = subprocess.run(
        ["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(dest)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        pytest.skip(f"no git clone of this checkout: {done.stderr}")
    venv = Path(sys.prefix)
    for name in (".venv", ".venv-demo"):
        (dest / name).symlink_to(venv)
    # The virtualenv is newer than the clone's pyproject.toml: make installs nothing.
    os.utime(dest / "pyproject.toml", (0, 0))
    if not (venv / ".installed").exists():
        (venv / ".installed").touch()
    return dest


def opener() -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )


def sign_in(base: str, username: str, password: str) -> str:
    """Sign into the admin as a browser does; the admin's index page after it."""
    browser = opener()
    page = browser.open(f"{base}/admin/login/").read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    form = urllib.parse.urlencode(
        {
            "csrfmiddlewaretoken": token,
            "username": username,
            "password": password,
            "next": "/admin/",
        }
    ).encode()
    request = urllib.request.Request(
        f"{base}/admin/login/", form, {"Referer": f"{base}/admin/login/"}
    )
    return browser.open(request).read().decode()


def test_readme__its_commands_in_its_order_on_a_fresh_clone(clone):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in LEAKS and not k.startswith("AGENTRUN_")}
    env.update(
        DJANGO_SUPERUSER_USERNAME="ops",
        DJANGO_SUPERUSER_PASSWORD="a long password for ops",
        DJANGO_SUPERUSER_EMAIL="ops@example.com",
    )
    variables = [f"PORT={port}", f"REDIS_URL={REDIS_URL}/12", "ADMIN_ARGS=--noinput"]
    makefile = (clone / "Makefile").read_text()
    chat, log = None, (clone / "chat.log").open("w")
    try:
        for words in readme_lines():
            target = words[1]
            if target not in RUN:
                assert re.search(rf"^{target}:", makefile, re.M), target
            elif target == "chat":
                chat = subprocess.Popen(
                    [*words, *variables], cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )  # fmt: skip
                wait_for(
                    lambda: _answers(f"http://127.0.0.1:{port}/accounts/login/"),
                    timeout=90,
                    message=f"make chat on port {port}: {(clone / 'chat.log').read_text()[-2000:]}",
                )
            else:
                done = subprocess.run(
                    [*words, *variables], cwd=clone, env=env, capture_output=True, text=True,
                    timeout=120,
                )  # fmt: skip
                assert done.returncode == 0, done.stdout + done.stderr
        assert chat is not None and chat.poll() is None, (clone / "chat.log").read_text()
        index = sign_in(f"http://127.0.0.1:{port}", "ops", "a long password for ops")
        assert "Agent runs" in index and "Log out" in index, index[:2000]
    finally:
        log.close()
        if chat is not None:
            os.killpg(chat.pid, 15)
            try:
                chat.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(chat.pid, 9)
                chat.wait()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        time.sleep(0.2)
        return False
