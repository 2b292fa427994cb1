"""`manage.py agentrun_demo`: a worker dies after a message was delivered; nothing is sent twice.

The seed's scenario with real processes. A Celery worker armed with the failpoint
`tool.after_handler=crash` runs the support agent; the provider accepts the
customer message, then the worker dies before the result is checkpointed (os._exit,
like a power cut). A fresh worker and the reaper take over: the tool's reconcile
check finds the message by its idempotency key, records its id as the result
(source `reconciled`), and the run finishes only the unfinished work.

It needs no server: SQLite and kombu's filesystem transport under the state
directory (`--broker redis` uses Redis). The command re-runs itself with
environment-driven settings, so it and its workers share the same database and
broker, exactly as separate deployed processes would.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from django_agentrun.testing.processes import Process, Processes

INNER_ENV = "AGENTRUN_DEMO_INNER"
DEFAULT_QUEUE = "agentrun-demo"
FAILPOINT = "tool.after_handler=crash"
LEASE_SECONDS = 3
REAPER_EVERY = 1.0
SCRIPTED_CLIENT = "example_project.demo.scripted.DemoScriptedClient"
ANTHROPIC_CLIENT = "django_agentrun.clients.anthropic.AnthropicModelClient"
RESTING = {"completed", "failed", "cancelled", "timed_out", "awaiting_approval"}
# What a previous run may leave in the state directory; only these are removed.
STATE_ENTRIES = (
    "demo.sqlite3",
    "demo.sqlite3-wal",
    "demo.sqlite3-shm",
    "broker",
    "provider",
    "logs",
)
# Settings of the caller's environment that would point the demo elsewhere.
SCRUBBED_ENV = (
    "DATABASE_URL",
    "AGENTRUN_TEST_DB_NAME",
    "AGENTRUN_FAILPOINTS",
    "AGENTRUN_QUEUE",
    "CELERY_BROKER_TRANSPORT_OPTIONS",
)


class Command(BaseCommand):
    # Checks run once, in the outer process (see handle): the inner one has the same code.
    requires_system_checks: list[str] = []
    help = (
        "Run the crash-recovery demo: a worker is killed after the provider accepted a "
        "customer message; a new worker and the reaper finish the run without sending it twice."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--state-dir",
            default=os.environ.get("AGENTRUN_DEMO_DIR") or str(Path(settings.BASE_DIR) / ".demo"),
            help="Where the demo keeps its database, broker folders and provider records "
            "(wiped at start). Default: .demo in the project.",
        )
        parser.add_argument(
            "--broker",
            choices=["filesystem", "redis", "auto"],
            default=os.environ.get("AGENTRUN_DEMO_BROKER", "filesystem"),
            help="filesystem (default, no server), redis, or auto (redis when it answers).",
        )
        parser.add_argument(
            "--redis-url",
            default=os.environ.get("AGENTRUN_DEMO_REDIS_URL", "redis://127.0.0.1:6379/0"),
        )
        parser.add_argument(
            "--model",
            choices=["auto", "scripted", "anthropic"],
            default=os.environ.get("AGENTRUN_DEMO_MODEL", "auto"),
            help="scripted (offline), anthropic (claude-sonnet-5-5, needs ANTHROPIC_API_KEY), "
            "or auto (anthropic when ANTHROPIC_API_KEY is set).",
        )
        parser.add_argument(
            "--queue",
            default=DEFAULT_QUEUE,
            help="Celery queue of the demo's workers (letters, digits, - and _ only).",
        )
        parser.add_argument(
            "--timeout", type=float, default=60.0, help="Give up after this many seconds."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if os.environ.get(INNER_ENV) == "1":
            code = Demo(self, options).run()
        else:
            self.check()
            code = self._relaunch(options)
        if code:
            raise SystemExit(code)

    # ------------------------------------------------------------ the outer process

    def _relaunch(self, options: dict[str, Any]) -> int:
        """Prepare a fresh state directory and run the demo in a process configured for it."""
        state = Path(options["state_dir"]).resolve()
        broker = _choose_broker(options["broker"], options["redis_url"])
        model = _choose_model(options["model"])
        if not re.fullmatch(r"[A-Za-z0-9_-]+", options["queue"]):
            # kombu's filesystem transport finds a message's queue after the first dot of its name
            raise CommandError("--queue: use letters, digits, '-' and '_' only.")
        _fresh_state(state)
        env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
        env.update(
            DJANGO_SETTINGS_MODULE="example_project.settings",
            SQLITE_PATH=str(state / "demo.sqlite3"),
            SQLITE_TRANSACTION_MODE="IMMEDIATE",
            CELERY_BROKER_URL=options["redis_url"] if broker == "redis" else "filesystem://",
            AGENTRUN_QUEUE=options["queue"],
            AGENTRUN_MODEL_CLIENT=SCRIPTED_CLIENT if model == "scripted" else ANTHROPIC_CLIENT,
            AGENTRUN_LEASE_SECONDS=str(LEASE_SECONDS),
            AGENTRUN_REAPER_INTERVAL_SECONDS=str(REAPER_EVERY),
            AGENTRUN_QUEUED_STALE_SECONDS="10",
            AGENTRUN_LOG_LEVEL="WARNING",
            AGENTRUN_DEMO_DIR=str(state),
            PYTHONUNBUFFERED="1",
            **{INNER_ENV: "1"},
        )
        if broker == "filesystem":
            queue_dir = state / "broker" / "queue"
            env["CELERY_BROKER_TRANSPORT_OPTIONS"] = json.dumps(
                {
                    "data_folder_in": str(queue_dir),
                    "data_folder_out": str(queue_dir),
                    "control_folder": str(state / "broker" / "control"),
                    "store_processed": True,  # consumed messages stay inspectable
                    "processed_folder": str(state / "broker" / "processed"),
                    "polling_interval": 0.1,
                }
            )
        argv = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "agentrun_demo"]
        argv += ["--state-dir", str(state), "--broker", broker, "--model", model]
        argv += ["--redis-url", options["redis_url"], "--queue", options["queue"]]
        argv += ["--timeout", str(options["timeout"])]
        if options.get("no_color"):
            argv.append("--no-color")
        if options.get("force_color"):
            argv.append("--force-color")
        self.stdout.flush()
        child = subprocess.Popen(argv, env=env, cwd=settings.BASE_DIR)
        previous = signal.signal(signal.SIGTERM, lambda *_: child.terminate())
        try:
            while True:
                try:
                    return child.wait()
                except KeyboardInterrupt:
                    continue  # the child got the SIGINT too: it stops its workers, then exits
        finally:
            signal.signal(signal.SIGTERM, previous)


def _choose_broker(choice: str, redis_url: str) -> str:
    if choice == "filesystem":
        return choice
    if _redis_answers(redis_url):
        return "redis"
    if choice == "redis":
        raise CommandError(f"Redis does not answer at {redis_url}; use --broker filesystem.")
    return "filesystem"


def _redis_answers(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or 6379), 0.5
        ) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith((b"+PONG", b"-NOAUTH"))  # up, needs a password
    except OSError:
        return False


def _choose_model(choice: str) -> str:
    has_key = bool(os.environ.get("ANTHROPIC_API_KEY"))
    if choice == "anthropic" and not has_key:
        raise CommandError("--model anthropic needs ANTHROPIC_API_KEY.")
    if choice == "auto":
        return "anthropic" if has_key else "scripted"
    return choice


def _fresh_state(state: Path) -> None:
    """Remove what an earlier demo left (only the demo's own entries) and create the folders."""
    state.mkdir(parents=True, exist_ok=True)
    for name in STATE_ENTRIES:
        path = state / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    for sub in ("broker/queue", "broker/control", "broker/processed", "provider", "logs"):
        (state / sub).mkdir(parents=True)


# ---------------------------------------------------------------- the demo itself


@dataclass
class Worker:
    name: str
    proc: Process  # in a session of its own: a signal reaches its whole group
    failpoints: str
    reported: bool = False

    @property
    def log(self) -> Path:
        return self.proc.log_path

    def log_text(self) -> str:
        return self.proc.log_text()


@dataclass
class Demo:
    """Starts the workers, the run and the reaper; prints the timeline; checks the outcome."""

    command: BaseCommand
    options: dict[str, Any]
    workers: list[Worker] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)  # tool_call_id -> tool name
    last_seq: int = 0
    crashed: Worker | None = None
    problem: str = ""
    run_id: Any = None

    def __post_init__(self) -> None:
        self.state = Path(self.options["state_dir"])
        # Each worker gets SIGKILL if the demo process dies, so none is left.
        self.procs = Processes(
            self.state / "logs",
            cwd=settings.BASE_DIR,
            drop_env=(INNER_ENV, "AGENTRUN_FAILPOINTS"),
            env={"AGENTRUN_LOG_LEVEL": "INFO"},  # the worker's own log file can be chatty
            die_with_parent=True,
        )
        self.t0 = time.time()
        self.style = self.command.style

    # ------------------------------------------------------------ output

    def say(self, who: str, message: str, *, at: float | None = None, style: Any = None) -> None:
        stamp = f"{(at if at is not None else time.time()) - self.t0:6.2f}s"
        line = f"{stamp}  {who:<10} {message}"
        self.command.stdout.write(style(line) if style else line)

    def note(self, message: str) -> None:
        self.command.stdout.write(f"{'':19}{message}")

    def rel(self, path: Path) -> str:
        try:
            return str(path.relative_to(Path.cwd()))
        except ValueError:
            return str(path)

    # ------------------------------------------------------------ the run

    def run(self) -> int:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            return self._run()
        except KeyboardInterrupt:
            self.command.stderr.write("Interrupted.")
            return 130
        finally:
            self.stop_workers()

    def _run(self) -> int:
        from django.db import connection

        from django_agentrun import start_run
        from django_agentrun.models import Run

        from ...agents import AGENT_NAME, TICKET, TICKET_ID
        from ...provider import Helpdesk, MessagingProvider

        self._header()
        call_command("migrate", verbosity=0, interactive=False)
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA journal_mode=WAL")  # readers never block the workers' writes
        MessagingProvider().reset()
        Helpdesk().reset()
        self._purge_queue()

        self.start_worker(FAILPOINT)
        run = start_run(
            AGENT_NAME, TICKET, correlation_id=TICKET_ID, metadata={"ticket": TICKET_ID}
        )
        self.run_id = run.pk
        self.say(
            "demo",
            f"start_run({AGENT_NAME!r}, ticket {TICKET_ID}) -> run {run.pk}",
            at=run.created_at.timestamp(),
        )

        deadline = time.monotonic() + float(self.options["timeout"])
        next_reap = time.monotonic()
        while True:
            self.print_events(run)
            if not self.watch_workers():
                break
            if time.monotonic() >= next_reap:
                self.reap()
                next_reap = time.monotonic() + REAPER_EVERY
            state = Run.objects.filter(pk=run.pk).values_list("state", flat=True).first()
            if state in RESTING:
                break
            if time.monotonic() > deadline:
                self.problem = f"the run did not finish within {self.options['timeout']:g} s"
                break
            time.sleep(0.1)
        self.print_events(run)
        run.refresh_from_db()
        return self.verdict(run)

    def _header(self) -> None:
        broker = settings.CELERY_BROKER_URL
        broker_note = (
            "kombu filesystem transport, no server" if broker.startswith("filesystem") else "Redis"
        )
        model = (
            "scripted (offline: example_project/demo/scripted.py)"
            if settings.AGENTRUN_MODEL_CLIENT == SCRIPTED_CLIENT
            else "claude-sonnet-5-5 through the Anthropic API"
        )
        self.command.stdout.write(
            self.style.MIGRATE_HEADING(
                "django-agentrun demo: a worker dies after the customer's message was delivered"
            )
        )
        db = self.rel(Path(settings.DATABASES["default"]["NAME"]))
        self.note(f"database  SQLite {db}")
        self.note(f"broker    {broker} ({broker_note}), queue {settings.AGENTRUN_QUEUE}")
        self.note(f"model     {model}")
        store = self.rel(self.state / "provider" / "messages.jsonl")
        self.note(f"provider  {store} (simulated, not the app's tables)")
        logs = self.rel(self.state / "logs")
        self.note(
            f"lease {LEASE_SECONDS} s, reaper every {REAPER_EVERY:g} s; worker logs in {logs}"
        )
        self.command.stdout.write("")

    def _purge_queue(self) -> None:
        """Drop messages an earlier demo left on a shared broker (Redis)."""
        if not settings.CELERY_BROKER_URL.startswith("redis"):
            return
        from example_project.celery import app

        with app.connection_for_write() as conn:
            conn.default_channel.queue_purge(settings.AGENTRUN_QUEUE)

    def start_worker(self, failpoints: str = "") -> Worker:
        name = f"worker-{len(self.workers) + 1}"
        env = self.procs.env(**({"AGENTRUN_FAILPOINTS": failpoints} if failpoints else {}))
        proc = self.procs.worker(
            "example_project", settings.AGENTRUN_QUEUE, name=name, loglevel="warning", env=env
        )
        worker = Worker(name, proc, failpoints)
        self.workers.append(worker)
        armed = f"armed with AGENTRUN_FAILPOINTS={failpoints}" if failpoints else "no failpoints"
        self.say(f"[{name}]", f"started (celery worker, solo pool, pid {proc.pid}), {armed}")
        return worker

    def stop_workers(self, grace: float = 10.0) -> None:
        """Warm shutdown of the workers still running (all at once), SIGKILL after `grace`."""
        alive = [w for w in self.workers if w.proc.alive()]
        if not alive:
            return
        self.say("demo", f"stopping {', '.join(w.name for w in alive)} (warm shutdown)")
        self.procs.stop_all(grace=grace)

    def who(self, owner: str) -> str:
        """A lease owner (host:pid:random) as a process name of this demo."""
        reaper = owner.startswith("reaper:")
        pid = owner.removeprefix("reaper:").split(":")[1] if owner.count(":") >= 2 else ""
        for worker in self.workers:
            if pid == str(worker.proc.pid):
                return worker.name
        if reaper or pid == str(os.getpid()):
            return "the reaper"
        return owner

    # ------------------------------------------------------------ watching

    def watch_workers(self) -> bool:
        """Report a worker that exited; after the armed one dies, start a fresh one."""
        for worker in self.workers:
            code = worker.proc.poll()
            if code is None or worker.reported:
                continue
            worker.reported = True
            # failpoints.py writes this line to stderr just before os._exit.
            found = re.search(r"agentrun failpoint (\S+): crash", worker.log_text())
            fired = found.group(1) if found else None
            if worker.failpoints and fired and self.crashed is None:
                self.crashed = worker
                self.say(
                    "!!",
                    f"{worker.name} killed at failpoint {fired} (exit {code})",
                    style=self.style.ERROR,
                )
                self.describe_ambiguity()
                self.start_worker()
                continue
            self.problem = f"{worker.name} exited unexpectedly (exit {code})"
            self.say("!!", self.problem, style=self.style.ERROR)
            self.command.stdout.write(_tail(worker.log_text()))
            return False
        return True

    def describe_ambiguity(self) -> None:
        """What the run knows right after the crash, against what the provider knows."""
        from django_agentrun.models import ToolCall

        from ...provider import MessagingProvider

        for call in ToolCall.objects.filter(run_id=self.run_id, state="in_flight"):
            sent = MessagingProvider().find(call.idempotency_key)
            self.note(
                f"the run: {call.name} is in_flight with no result recorded (outcome unknown)"
            )
            if sent:
                self.note(
                    f"the provider: message {sent['message_id']} delivered to {sent['to']}, "
                    f"client reference {call.idempotency_key[:12]}..."
                )
                self.note("a blind retry would deliver a second message")

    def reap(self) -> None:
        from django_agentrun.recovery import reap

        started = time.time()
        report = reap()
        for finding in report.findings:
            if finding.error:
                text, style = f"{finding.kind}: {finding.error}", self.style.ERROR
            elif finding.kind == "lease_expired":
                holder = self.crashed.name if self.crashed else "a worker"
                text = (
                    f"the lease of {holder} expired: applying the recovery policy to its "
                    "in-flight call (non_idempotent: reconcile), then re-enqueueing"
                )
                style = None
            else:
                text, style = f"{finding.kind}: {finding.detail}", None
            self.say("[reaper]", text, at=started, style=style)

    def print_events(self, run: Any) -> None:
        from django_agentrun.models import RunEvent

        for event in RunEvent.objects.filter(run=run, seq__gt=self.last_seq).order_by("seq"):
            self.last_seq = event.seq
            text, style = self.describe(event.type, event.payload)
            self.say(
                f"#{event.seq}",
                f"{event.type:<20} {text}",
                at=event.created_at.timestamp(),
                style=style,
            )

    def describe(self, kind: str, p: dict[str, Any]) -> tuple[str, Any]:
        """One readable line per RunEvent (and a style for the ones that matter most)."""
        name = self.names.get(p.get("tool_call_id", ""), p.get("name", ""))
        if kind == "run_created":
            return f"state={p['run_state']} agent={p['agent']}", None
        if kind == "run_started":
            return f"state=running, claimed by {self.who(p.get('worker', ''))}", None
        if kind in ("turn_started", "turn_completed", "turn_cancelled", "turn_failed"):
            return f"turn {p['turn_index']}", None
        if kind == "model_response":
            parts = []
            for block in p.get("content", []):
                if block.get("type") == "text":
                    parts.append(_short(repr(block["text"]), 60))
                elif block.get("type") == "tool_use":
                    parts.append(f"-> {block['name']}")
            return f"turn {p['turn_index']} stop={p['stop_reason']}: {' '.join(parts)}", None
        if kind == "tool_call_requested":
            self.names[p["tool_call_id"]] = p["name"]
            return (
                f"{p['name']} ({p['side_effect']}) key={p['idempotency_key'][:12]}... "
                "(write-ahead intent)"
            ), None
        if kind == "tool_call_started":
            return f"{name} attempt {p['attempt']} (in_flight)", None
        if kind == "tool_call_finished":
            result = _result_text(p.get("result"))
            line = f"{name} source={p['source']} {result}".rstrip()
            if p.get("is_error"):
                return f"{line} (error)", self.style.WARNING
            return line, self.style.SUCCESS if p["source"] == "reconciled" else None
        if kind == "tool_call_recovered":
            return f"{name} policy={p['policy']} (will run again)", self.style.WARNING
        if kind == "tool_call_unknown":
            return f"{name}: {p['reason']}", self.style.WARNING
        if kind == "recovery":
            return (
                f"taken over after a crash (recovery {p['attempts']}, lease epoch {p['epoch']})",
                self.style.WARNING,
            )
        if kind == "run_continued":
            return f"state={p['run_state']}", None
        if kind == "run_completed":
            usage = p.get("usage", {})
            tokens = (
                f"{usage.get('input_tokens', 0)} in / {usage.get('output_tokens', 0)} out tokens"
            )
            return f"state=completed stop_reason={p['stop_reason']} ({tokens})", self.style.SUCCESS
        if kind == "run_failed":
            return f"{p['error_code']}: {p['error_message']}", self.style.ERROR
        if kind == "run_parked":
            return "state=awaiting_approval (a person must decide)", self.style.WARNING
        return _short(json.dumps(p, default=str), 100), None

    # ------------------------------------------------------------ the outcome

    def verdict(self, run: Any) -> int:
        from django_agentrun.models import ToolCall

        from ...provider import Helpdesk, MessagingProvider

        out = self.command.stdout
        messages = MessagingProvider().messages()
        sends = list(ToolCall.objects.filter(run=run, name="send_customer_message"))
        out.write("")
        out.write(self.style.MIGRATE_HEADING("Outcome"))
        self.note(f"provider store: {len(messages)} message(s) delivered")
        for message in messages:
            reference = message["client_reference"][:12]
            self.note(
                f"  {message['message_id']} to {message['to']}, client reference {reference}..."
            )
        problems = [self.problem] if self.problem else []
        for call in sends:
            recorded = _result_dict(call.result).get("message_id", "")
            match = next(
                (m for m in messages if m["client_reference"] == call.idempotency_key), None
            )
            agrees = (
                "= the provider's"
                if match and match["message_id"] == recorded
                else "!= the provider's"
            )
            self.note(
                f"send_customer_message: {call.state}, attempt {call.attempt}, "
                f"source={call.result_source}, message_id {recorded or '-'} {agrees}"
            )
            if not match or match["message_id"] != recorded:
                problems.append("the recorded message id does not match the provider's record")
            if self.crashed is not None and call.result_source != "reconciled":
                problems.append(
                    f"the message's result source is {call.result_source!r}, not 'reconciled'"
                )
        for note in Helpdesk().notes():
            self.note(
                f"ticket {note['ticket_id']} note {note['note_id']}: {_short(note['text'], 70)}"
            )
        self.note(
            f"run {run.pk}: {run.state} (stop_reason {run.stop_reason or '-'}), "
            f"{run.turn_count} model turns, {run.last_seq} events"
        )
        if run.output:
            self.note(f"output: {_short(repr(run.output.get('text', '')), 100)}")
        if self.crashed is None:
            problems.append("no worker was killed at the failpoint")
        if not sends:
            problems.append("the agent never called send_customer_message")
        if run.state != "completed":
            problems.append(f"the run is {run.state}, not completed")
        if len(messages) != 1:
            problems.append(f"{len(messages)} messages were delivered, not exactly one")
        out.write("")
        out.write(
            f"Delivered messages: {len(messages)}"
            + (" (exactly once)" if len(messages) == 1 else "")
        )
        elapsed = time.time() - self.t0
        if problems:
            out.write(
                self.style.ERROR(
                    f"FAILED after {elapsed:.1f} s: " + "; ".join(dict.fromkeys(problems))
                )
            )
            for worker in self.workers:
                out.write(f"--- {self.rel(worker.log)} (tail) ---\n{_tail(worker.log_text())}")
            return 1
        out.write(
            self.style.SUCCESS(
                f"OK in {elapsed:.1f} s: the worker died after the provider accepted the message; "
                "the reconcile check recorded its id, the run completed, and exactly one message "
                "was delivered."
            )
        )
        return 0


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(143)  # unwinds through `finally`, which stops the workers


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _result_dict(result: Any) -> dict[str, Any]:
    if isinstance(result, dict):
        return result
    try:
        value = json.loads(result) if isinstance(result, str) else None
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _result_text(result: Any) -> str:
    found = _result_dict(result)
    if found:
        return " ".join(f"{k}={v}" for k, v in found.items())
    return _short(repr(result), 80) if result else ""


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.splitlines()[-lines:])
