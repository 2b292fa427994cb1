"""A new user's first hour, from the tutorial (docs/tutorial/first-agent.md) and two how-tos.

In a temporary directory: `django-admin startproject mysite`, `manage.py startapp myapp`,
then the tutorial's marked snippets (`<!-- file: PATH -->` writes a file, `<!-- append: PATH -->`
appends to one), the telemetry how-to's console recipe and the webhooks how-to's local
receiver (their `<!-- append: ... -->` snippets), and only these test-specific settings on
top: the database (a Postgres
database of its own, dropped afterwards), Redis db 11, a queue of the test's own and a
one-second reaper period. Then `migrate`, `check`, the stand-in from its command line
with the tutorial's script, a worker and beat from the tutorial's commands, and one run
started and approved through the API, its webhooks received by a local receiver that
verifies their signatures, its spans in the worker's log, and the admin's pages. Also:
`check` names each
tutorial step that is missing, and the tutorial's offline test passes in the project.

The project's processes run on AGENTRUN_TEST_PROJECT_PYTHON when it is set: a virtualenv
with the built wheel or sdist installed (tools/release_check.py, `make test-release`), so
what is tested is what a user installs. Unset, they run on the test session's Python.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import tomllib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from django_agentrun.testing import processes
from tests.processes import REDIS_URL, wait_for
from tests.webhook_receiver import SECRET, Receiver, receiver

ROOT = Path(__file__).resolve().parents[2]
# The page whose marked snippets build the project (the README's quick start has its own test),
# then the how-tos' that a newcomer adds: console telemetry, a local webhook receiver.
TUTORIAL = ROOT / "docs" / "tutorial" / "first-agent.md"
HOWTOS = [ROOT / "docs" / "how-to" / "telemetry.md", ROOT / "docs" / "how-to" / "webhooks.md"]
# Where the webhooks how-to's local receiver listens (the test's receiver takes any port).
RECEIVER = "http://127.0.0.1:8001/hooks/agentrun"
# Not resolved: a virtualenv's python is a symlink, and its bin/ holds `celery`, `django-admin`.
PYTHON = os.environ.get("AGENTRUN_TEST_PROJECT_PYTHON") or sys.executable
BIN = Path(PYTHON).parent
INSTALLED = "AGENTRUN_TEST_PROJECT_PYTHON" in os.environ
pytestmark = [pytest.mark.integration, pytest.mark.timeout(120), pytest.mark.one_driver]

# Settings of the test session that must not reach the new project's processes.
SCRUBBED = ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "PYTHONPATH", "ANTHROPIC_API_KEY")
SCRUBBED_PREFIXES = ("AGENTRUN_", "CELERY_", "ANTHROPIC_")
SNIPPET = re.compile(
    r"^(?P<indent>[ \t]*)<!-- (?P<kind>file|append|shell): (?P<target>\S+) -->\n"
    r"(?P=indent)```\w*\n(?P<body>.*?)\n(?P=indent)```",
    re.DOTALL | re.MULTILINE,
)


@dataclass(frozen=True)
class Snippet:
    kind: str  # file, append or shell
    target: str
    text: str


def readme_snippets() -> list[Snippet]:
    found = []
    for page in (TUTORIAL, *HOWTOS):
        for m in SNIPPET.finditer(page.read_text()):
            found.append(Snippet(m["kind"], m["target"], textwrap.dedent(m["body"]) + "\n"))
    return found


def snippet(kind: str, target: str) -> Snippet:
    return next(s for s in readme_snippets() if (s.kind, s.target) == (kind, target))


def drop_statement(source: str, name: str) -> str:
    """`source` without its top-level assignment to `name` (a README line left out)."""
    lines = source.split("\n")
    for node in ast.parse(source).body:
        targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
        if any(getattr(t, "id", None) == name for t in targets):
            del lines[node.lineno - 1 : node.end_lineno]
            return "\n".join(lines)
    raise AssertionError(f"the README's snippet has no {name}")


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in SCRUBBED and not k.startswith(SCRUBBED_PREFIXES)
    }
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # `celery`, `django-admin`
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run(argv: list[str], cwd: Path, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, cwd=cwd, env=clean_env(**env), capture_output=True, text=True, timeout=timeout
    )


def manage(project: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return run([PYTHON, "manage.py", *args], project, timeout=timeout)


def test_fresh_project__the_readme_marks_every_snippet():
    assert {(s.kind, s.target) for s in readme_snippets()} == {
        ("file", "mysite/celery.py"),
        ("append", "mysite/__init__.py"),
        ("append", "mysite/settings.py"),
        ("append", "mysite/urls.py"),
        ("file", "myapp/agents.py"),
        ("shell", "processes"),
        ("file", "pytest.ini"),
        ("file", "myapp/tests.py"),
        ("file", "script.json"),
        ("shell", "offline"),
    }
    appended = [s for s in readme_snippets() if s.kind == "append"][-2:]
    assert "ConsoleSpanExporter" in appended[0].text and RECEIVER in appended[1].text


# -- the project ------------------------------------------------------------------------------


def test_fresh_project__runs_the_package_under_test(pristine):
    """The project imports the app from where it was installed (with the release check: the
    virtualenv's site-packages, not this checkout), at pyproject's version."""
    done = run(
        [PYTHON, "-c", "import django_agentrun as a; print(a.__file__); print(a.__version__)"],
        pristine,
    )
    assert done.returncode == 0, done.stderr
    location, version = done.stdout.split()
    expected = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert version == expected
    assert Path(location).resolve().is_relative_to(ROOT) is not INSTALLED, location


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """`django-admin startproject mysite` and `manage.py startapp myapp`, nothing else."""
    path = tmp_path_factory.mktemp("pristine")
    done = run([str(BIN / "django-admin"), "startproject", "mysite", str(path)], path)
    assert done.returncode == 0, done.stderr
    done = manage(path, "startapp", "myapp")
    assert done.returncode == 0, done.stderr
    return path


def build(
    pristine: Path,
    dest: Path,
    *,
    skip: tuple[str, str] | None = None,
    change: Callable[[Snippet], str] | None = None,
    overrides: str = "",
) -> Path:
    """A copy of the pristine project with the README's snippets applied (but `skip`),
    each passed through `change`, and `overrides` appended to the settings."""
    shutil.copytree(pristine, dest)
    for s in readme_snippets():
        if s.kind == "shell" or (s.kind, s.target) == skip:
            continue
        text = change(s) if change else s.text
        path = dest / s.target
        if s.kind == "append":
            with path.open("a") as fh:
                fh.write("\n" + text)
        else:
            path.write_text(text)
    with (dest / "mysite" / "settings.py").open("a") as fh:
        fh.write("\n# -- the test's own settings --\n" + overrides)
    return dest


def postgres_settings(name: str) -> str:
    db = settings.DATABASES["default"]
    fields = {k: db[k] for k in ("HOST", "PORT", "USER", "PASSWORD") if db.get(k)}
    return f'DATABASES["default"].update(NAME={name!r}, **{fields!r})\n'


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    """A Postgres database of the fresh project's own, dropped afterwards."""
    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        pytest.skip("needs Postgres (set DATABASE_URL)")
    db = settings.DATABASES["default"]
    base = (db.get("NAME") or "agentrun").removeprefix("test_")
    name = f"{base}_fresh_{uuid.uuid4().hex[:8]}"
    params = {k.lower(): db[k] for k in ("HOST", "PORT", "USER", "PASSWORD") if db.get(k)}

    def maintenance(*statements: str) -> None:
        # The driver Django uses (psycopg or psycopg2), on the maintenance database.
        conn = connection.Database.connect(dbname="postgres", **params)
        try:
            conn.autocommit = True
            cursor = conn.cursor()
            for statement in statements:
                cursor.execute(statement)
        finally:
            conn.close()

    maintenance(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        maintenance(
            f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)',
            f'DROP DATABASE IF EXISTS "test_{name}" WITH (FORCE)',
        )


def _redis_answers() -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(f"{REDIS_URL}/11", socket_timeout=1).ping())
    except redis.RedisError:
        return False


@pytest.fixture(scope="module")
def hooks() -> Iterator[Receiver]:
    """The webhooks how-to's local receiver: records each delivery (verified by the test)."""
    with receiver() as rec:
        yield rec


@pytest.fixture(scope="module")
def project(pristine, database, hooks, tmp_path_factory) -> Iterator[Path]:
    if not _redis_answers():
        pytest.skip(f"Redis is not running at {REDIS_URL}")
    queue = f"agentrun-fresh-{uuid.uuid4().hex[:8]}"
    overrides = (
        postgres_settings(database)
        + f'CELERY_BROKER_URL = "{REDIS_URL}/11"\n'
        # Every task of this project (advance_run, reap) on a queue of this test's own.
        + f'CELERY_TASK_DEFAULT_QUEUE = "{queue}"\n'
        + 'CELERY_BEAT_SCHEDULE["agentrun-reap"]["schedule"] = 1.0\n'
    )
    path = build(
        pristine,
        tmp_path_factory.mktemp("fresh") / "site",
        change=lambda s: s.text.replace(RECEIVER, hooks.url),
        overrides=overrides,
    )
    done = manage(path, "migrate", "--no-input")
    assert done.returncode == 0, done.stdout + done.stderr
    yield path
    import redis

    broker = redis.Redis.from_url(f"{REDIS_URL}/11")
    broker.delete(queue, *broker.scan_iter(f"_kombu.*{queue}*"))  # kombu's bindings


class Processes:
    """Long-running processes of the test (the shipped process manager), each with a log
    file in the project; stopped at the end."""

    def __init__(self, cwd: Path):
        self.group = processes.Processes(cwd, cwd=cwd)

    def start(self, name: str, argv: list[str], **env: str) -> processes.Process:
        return self.group.start(argv, name=name, env=clean_env(**env))

    def log(self, name: str) -> str:
        return (self.group.cwd / f"{name}.log").read_text(errors="replace")

    def logs(self) -> str:
        return self.group.logs(chars=3000)

    def stop(self) -> None:
        self.group.stop_all(grace=10)
        self.group.close()


def readme_command(line: str, **replace_env: str) -> tuple[list[str], dict[str, str]]:
    """argv and environment of one README command line (`A=b cmd args`)."""
    words = shlex.split(line, comments=True)
    env = {}
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = replace_env.get(key, value)
    return words, env


DRIVER = """
import json, os, sys, time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
django.setup()

from django.contrib.auth import get_user_model
from django.test import Client

API = "/api/agentrun"


def wait_for(what, predicate, timeout=40):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {what}")
        time.sleep(0.1)


user = get_user_model().objects.create_superuser("ann", "ann@example.com", "pw")
client = Client(HTTP_HOST="localhost")
client.force_login(user)

started = client.post(
    f"{API}/runs/", {"agent": "support", "input": "Order 42 arrived broken."},
    content_type="application/json",
)
assert started.status_code == 201, started.content
run_id = started.json()["id"]


def state():
    return client.get(f"{API}/runs/{run_id}/").json()["state"]


wait_for("awaiting_approval", lambda: state() == "awaiting_approval")
pending = client.get(f"{API}/tool-calls/pending/").json()["results"]
assert [p["name"] for p in pending] == ["refund"], pending
approved = client.post(
    f"{API}/tool-calls/{pending[0]['id']}/approve/", {"token": pending[0]["token"]},
    content_type="application/json",
)
assert approved.status_code == 200, approved.content
wait_for("completed", lambda: state() in ("completed", "failed", "cancelled", "timed_out"))

# The OpenAPI document the README promises at <mount>/schema/ (once the API serves one).
from django.urls import NoReverseMatch, reverse

try:
    schema_url = reverse("agentrun:schema")
except NoReverseMatch:
    schema_url = None
if schema_url is not None:
    assert schema_url == f"{API}/schema/", schema_url
    schema = client.get(schema_url)
    assert schema.status_code == 200, schema.content[:500]

# A wake-up that never reaches a worker (published where nobody listens, as if the
# broker lost it): beat's reaper finds the run unclaimed while the queue is empty and
# wakes it again; a worker then takes it to the approval.
from django.test import override_settings

from django_agentrun import start_run
from django_agentrun.models import RunEvent

with override_settings(AGENTRUN_QUEUE="agentrun-nobody-listens"):
    lost = start_run("support", "Order 42 arrived broken.")
wait_for(
    "the reaper to wake the lost run",
    lambda: RunEvent.objects.filter(run=lost, type="reaper_requeued").exists(),
)
wait_for("the lost run to reach its approval", lambda: lost.__class__.objects.get(
    pk=lost.pk).state == "awaiting_approval")

# The admin's pages, rendered from the installed templates.
from django_agentrun.models import ToolCall

call = ToolCall.objects.get(run_id=run_id, name="refund")
for url in (
    "/admin/",
    "/admin/agentrun/run/",
    f"/admin/agentrun/run/{run_id}/change/",
    "/admin/agentrun/toolcall/",
    f"/admin/agentrun/toolcall/{call.pk}/change/",
    "/admin/agentrun/runevent/",
):
    page = client.get(url)
    assert page.status_code == 200, (url, page.status_code, page.content[:500])
lost_call = wait_for("the lost run's waiting call", lambda: ToolCall.objects.filter(
    run=lost, state="awaiting_approval").first())
page = client.get(f"/admin/agentrun/toolcall/{lost_call.pk}/change/")
assert page.status_code == 200 and b'id="agentrun-approve-form"' in page.content, page.status_code

# One line the test reads (the console telemetry prints its metrics at exit, after it).
print("DETAIL", json.dumps(client.get(f"{API}/runs/{run_id}/").json()), flush=True)
"""


def test_fresh_project__from_the_readme_to_a_completed_run(project, hooks):
    assert manage(project, "check", "--fail-level", "WARNING").returncode == 0
    (project / "drive.py").write_text(DRIVER)
    processes = Processes(project)
    try:
        # The stand-in from its command line, with the README's script (any free port).
        stand_in_line, offline_worker_line = snippet("shell", "offline").text.strip().split("\n")
        argv, _ = readme_command(stand_in_line)
        assert argv[:3] == ["python", "-m", "django_agentrun.testing.messages_api"]
        argv[0] = PYTHON
        argv[argv.index("--port") + 1] = "0"  # any free port
        api = processes.start("stand-in", argv)
        base_url = wait_for(
            lambda: _listening(processes.log("stand-in")), timeout=15, message="the stand-in"
        )

        worker_line, beat_line = snippet("shell", "processes").text.strip().split("\n")
        argv, env = readme_command(worker_line, ANTHROPIC_API_KEY="offline")
        assert "ANTHROPIC_API_KEY" in env and argv[:3] == ["celery", "-A", "mysite"]
        # The worker of the offline section: the same command, pointed at the stand-in.
        offline_argv, offline_env = readme_command(offline_worker_line, ANTHROPIC_BASE_URL=base_url)
        assert offline_argv == argv and set(offline_env) == {"ANTHROPIC_BASE_URL", *env}
        processes.start("worker", argv, **{**env, **offline_env})
        argv, env = readme_command(beat_line)
        processes.start("beat", argv, **env)

        done = run([PYTHON, "drive.py"], project, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr + processes.logs()
        line = next(x for x in done.stdout.splitlines() if x.startswith("DETAIL "))
        detail = json.loads(line.removeprefix("DETAIL "))
        assert detail["state"] == "completed", processes.logs()
        assert detail["output"]["text"] == "Refunded 42.00 for order 42."
        calls = [c for turn in detail["turns"] for c in turn["tool_calls"]]
        assert [(c["name"], c["state"]) for c in calls] == [
            ("order_status", "succeeded"),
            ("refund", "succeeded"),
        ]

        # Beat reaches the worker: the reaper ran (its period is one second here) and woke
        # the lost run (idle passes leave no lines).
        wait_for(
            lambda: re.search(
                r"Task django_agentrun\.reap\[\S+\] succeeded", processes.log("worker")
            ),
            timeout=15,
            message="a reap from beat",
        )
        # The stand-in accepted every request: three steps, then the lost run's two.
        api.stop(grace=10)
        requests = [line for line in processes.log("stand-in").splitlines() if " -> " in line]
        assert [r.split(" -> ")[1] for r in requests] == ["200"] * 5, requests
        steps = [r.split()[2] for r in requests]
        assert steps == ["step=0", "step=1", "step=2", "step=0", "step=1"], steps
        assert processes.log("stand-in").rstrip().endswith("Stopped: 5 accepted, 0 refused.")

        # The run's webhooks reached the local receiver, signed with the how-to's secret.
        wanted = {"tool_call.awaiting_approval", "run.completed"}
        wait_for(
            lambda: wanted <= {r.verified(SECRET)["type"] for r in hooks.received},
            timeout=20,
            message="the run's webhooks",
        )
        verified = [r.verified(SECRET) for r in hooks.received]
        assert {e["data"]["run_id"] for e in verified} >= {detail["id"]}
        # The console recipe: the worker printed the run's spans as they ended.
        assert '"name": "invoke_agent support"' in processes.log("worker"), processes.logs()
    finally:
        processes.stop()


def test_fresh_project__the_readme_offline_test_passes(project):
    done = run(
        [PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "myapp/tests.py"],
        project,
        timeout=90,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def _listening(log: str) -> str | None:
    found = re.search(r"listening on (http://\S+)", log)
    return found.group(1) if found else None


# -- check names what is missing ----------------------------------------------------------------


def _without(*names: str) -> Callable[[Snippet], str]:
    def change(s: Snippet) -> str:
        if s.target != "mysite/settings.py":
            return s.text
        text = s.text
        for name in names:
            if re.search(rf"^{name}\b", text, re.M):  # the tutorial's settings snippet
                text = drop_statement(text, name)
        return text

    return change


def _replace(target: str, old: str, new: str) -> Callable[[Snippet], str]:
    def change(s: Snippet) -> str:
        if s.target != target or old not in s.text:  # one of the file's snippets has it
            return s.text
        return s.text.replace(old, new)

    return change


# README step -> how to leave it out, what check must say. (Without contenttypes or auth
# Django itself stops at the import of their models, before any check: agentrun.E012 is
# for projects without the admin; tests/pure/test_checks.py covers it.)
MISSING = {
    "celery-import": ({"skip": ("append", "mysite/__init__.py")}, {"agentrun.E010"}),
    "config-from-settings": (
        {
            "change": _replace(
                "mysite/celery.py",
                'app.config_from_object("django.conf:settings", namespace="CELERY")',
                "",
            )
        },
        {"agentrun.E011"},
    ),
    # One `check` for the four settings (each one alone: tests/pure/test_checks.py).
    "celery-settings": (
        {
            "change": _without(
                "CELERY_BROKER_URL",
                "CELERY_WORKER_PREFETCH_MULTIPLIER",
                "CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS",
                "CELERY_BEAT_SCHEDULE",
            )
        },
        {"agentrun.W010", "agentrun.W001", "agentrun.W011", "agentrun.W003"},
    ),
    "api-authentication": (
        {"overrides": 'REST_FRAMEWORK = {"DEFAULT_AUTHENTICATION_CLASSES": []}\n'},
        {"agentrun.E013"},
    ),
    "api-sessions": (
        {
            "overrides": 'MIDDLEWARE.remove("django.contrib.auth.middleware.AuthenticationMiddleware")\n'
        },
        {"agentrun.W012"},
    ),
}


@pytest.mark.parametrize("step", [None, *MISSING])
def test_fresh_project__check_names_the_missing_step(pristine, tmp_path, step):
    how, expected = MISSING[step] if step else ({}, set())
    path = build(pristine, tmp_path / "site", **how)
    done = manage(path, "check", "--fail-level", "WARNING")
    output = done.stdout + done.stderr
    assert set(re.findall(r"agentrun\.[EW]\d+", output)) == expected, output
    assert done.returncode == (1 if expected else 0), output


def test_fresh_project__check_without_the_app_names_installed_apps(pristine, tmp_path):
    path = build(
        pristine,
        tmp_path / "site",
        change=_replace("mysite/settings.py", '"django_agentrun", ', ""),
    )
    done = manage(path, "check")
    assert done.returncode != 0
    assert "isn't in an application in INSTALLED_APPS" in done.stderr
    assert "django_agentrun" in done.stderr
