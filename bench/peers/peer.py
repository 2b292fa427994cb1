"""A peer of the side-by-side benchmark, as a long-lived process in bench/.venv-peers.

    bench/.venv-peers/bin/python bench/peers/peer.py dbos|langgraph DATABASE_URL

It sets its system up on DATABASE_URL (a database of its own), then answers commands
on stdin, one a line, each with one JSON line on stdout:

    run k=1 turns=10 payload=small id=ID [counted=1] [durability=sync]
        runs one agent run of the workload (bench/peers/workload.py) to its end
        (durability: LangGraph's mode, its default when not given);
        -> {"times": [...], "cpu": [...], "probes": [...], "mismatches": [...], "wall": s}
           times: time.perf_counter() at each model call; cpu: time.process_time();
           probes (counted runs only): pg_current_wal_insert_lsn() at each model call;
           mismatches (counted runs only): where the messages the model was handed
           differ from the workload's transcript
    info  -> {"versions": {...}}
    quit

Anything the peer or its libraries print goes to stderr: stdout is the protocol's.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from importlib.metadata import version
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from bench.peers import workload  # noqa: E402

RECORDER = workload.Recorder()


def _lsn_reader(url: str):
    """A connection of its own (autocommit) that reads the WAL insert position."""
    import psycopg

    conn = psycopg.connect(url, autocommit=True)

    def read() -> str:
        return conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]

    return read


def main() -> int:
    system, url = sys.argv[1], sys.argv[2]
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # prints and logs of the libraries go to stderr
    sys.stdout = sys.stderr
    if system == "dbos":
        from bench.peers import dbos_agent as agent
    elif system == "langgraph":
        from bench.peers import langgraph_agent as agent
    else:
        raise SystemExit(f"unknown peer {system!r}")
    agent.setup(url, RECORDER)
    lsn = _lsn_reader(url)
    out.write(json.dumps({"ready": system}) + "\n")
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        try:
            if words[0] == "quit":
                break
            if words[0] == "info":
                reply: dict[str, Any] = {"versions": {p: version(p) for p in agent.PACKAGES}}
            elif words[0] == "run":
                args = dict(w.split("=", 1) for w in words[1:])
                counted = args.pop("counted", "0") == "1"
                RECORDER.reset(probe=lsn if counted else None, check=counted)
                k, turns, payload = int(args.pop("k")), int(args.pop("turns")), args.pop("payload")
                run_id = args.pop("id")
                text = workload.input_text(k, turns, payload, run_id)
                start = time.perf_counter()
                agent.run(text, run_id, **args)  # the rest: the system's options
                reply = {**RECORDER.figures(), "wall": time.perf_counter() - start}
            else:
                reply = {"error": f"unknown command {words[0]!r}"}
        except Exception:  # noqa: BLE001 - the harness reports it
            reply = {"error": traceback.format_exc()}
        out.write(json.dumps(reply) + "\n")
    agent.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
