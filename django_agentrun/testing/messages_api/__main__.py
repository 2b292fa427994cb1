"""Run the Messages API stand-in from the command line, for real workers to talk to.

    python -m django_agentrun.testing.messages_api --port 8765 --script script.json

Prints the base URL, then one line per request (step, status, the refusal if any),
and serves until SIGINT or SIGTERM. Point the workers at it with
ANTHROPIC_BASE_URL=<that URL> and any ANTHROPIC_API_KEY.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from .script import load_script
from .server import MessagesAPIServer


def _port(value: str) -> int:
    port = int(value)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port (0-65535)")
    return port


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m django_agentrun.testing.messages_api",
        description="A local stand-in for the Anthropic Messages API that answers from a "
        "script and refuses what the real API refuses.",
    )
    parser.add_argument(
        "--script",
        required=True,
        help="A JSON file with one item per step (a string, a list of content blocks, or a "
        'reply object such as {"content": [...], "stop_reason": "end_turn"}), or '
        "module:attribute naming a list of steps or a callable taking the request body.",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="Interface to listen on (default: %(default)s)."
    )
    parser.add_argument(
        "--port", type=_port, default=8765, help="0 picks a free port (default: %(default)s)."
    )
    parser.add_argument(
        "--api-key", default=None, help="Accept only this key (default: any key is accepted)."
    )
    parser.add_argument("--quiet", action="store_true", help="Do not print a line per request.")
    return parser.parse_args(argv)


def _log_line(record: dict[str, Any]) -> str:
    kind = "stream" if record["stream"] else "json"
    line = f"{record['method']} {record['path']} step={record['step']} {kind} -> {record['status']}"
    if record.get("error"):
        line += f" {record['error']}"
    return line


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        script = load_script(args.script)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    counts = {"accepted": 0, "refused": 0}
    lock = threading.Lock()

    def on_request(record: dict[str, Any]) -> None:
        with lock:
            counts["accepted" if record["status"] == 200 else "refused"] += 1
            if not args.quiet:
                print(_log_line(record), flush=True)

    server = MessagesAPIServer(
        script, api_key=args.api_key, host=args.host, port=args.port, on_request=on_request
    )
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        server.start()
    except OSError as exc:
        print(
            f"error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 1
    print(f"Messages API stand-in listening on {server.base_url}", flush=True)
    print(f"  ANTHROPIC_BASE_URL={server.base_url} ANTHROPIC_API_KEY=any-key", flush=True)
    try:
        while not stop.wait(0.5):  # a timed wait: signal handlers run between the waits
            pass
    finally:
        server.stop()
    with lock:
        print(f"Stopped: {counts['accepted']} accepted, {counts['refused']} refused.", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
