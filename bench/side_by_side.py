"""Side by side: the same agent workload on django-agentrun, DBOS and LangGraph.

    python bench/side_by_side.py [--quick] [--rounds N] [--json PATH] [--telemetry]

The workload (bench/peers/workload.py): a zero-latency scripted model; each turn is one
model step and k no-op tool steps, every step durable. django-agentrun runs in this
process (the in-process engine of bench/engine.py, the wake-up publish stubbed out);
DBOS and LangGraph each run as a long-lived process in bench/.venv-peers (`make
bench-peers`) that takes commands on stdin. Each system has a database of its own on the
same Postgres. Rounds are interleaved, one system at a time in a rotating order, and
the figures are medians over rounds and paired ratios (system A's round-r figure over
system B's, median over rounds). A MISS is a figure: the exit status is 0 unless a run
breaks. bench/README.md, section "Side by side", says how each figure is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402
from bench.peers import workload  # noqa: E402

# LangGraph runs twice: in its default durability mode ("async": the checkpoints are
# saved in the background while the next step runs) and in "sync" (each step's
# checkpoint saved before the next starts, as the other two do), in one process.
SYSTEMS = ("agentrun", "dbos", "langgraph", "langgraph_sync")
PEERS = ("dbos", "langgraph")
LABELS = {
    "agentrun": "django-agentrun",
    "dbos": "DBOS",
    "langgraph": "LangGraph",
    "langgraph_sync": "LangGraph sync",
}
KS = (0, 1, 4)
TURNS = 10  # turns of a run (plus the final answer: TURNS + 1 model calls)
LONG_TURNS = 100
PEERS_PYTHON = ROOT / "bench" / ".venv-peers" / "bin" / "python"
PEER_SCRIPT = ROOT / "bench" / "peers" / "peer.py"
PEER_URLS = {
    "dbos": os.environ.get(
        "BENCH_DBOS_URL", "postgresql://postgres@127.0.0.1:5432/agentrun_peer_dbos"
    ),
    "langgraph": os.environ.get(
        "BENCH_LANGGRAPH_URL", "postgresql://postgres@127.0.0.1:5432/agentrun_peer_langgraph"
    ),
}
# The tables each system keeps its runs in (all of them, in its own database).
TABLES_SQL = {
    "agentrun": "n.nspname = 'public' AND c.relname LIKE 'agentrun\\_%%'",
    "dbos": "n.nspname = 'dbos'",
    "langgraph": "n.nspname = 'public' AND c.relname LIKE 'checkpoint%%'",
}
RESET_SQL = {
    "dbos": "TRUNCATE dbos.workflow_status CASCADE",
    "langgraph": "TRUNCATE checkpoints, checkpoint_blobs, checkpoint_writes",
}
AGENTS = {"small": "bench-engine", "realistic": "bench-storage"}  # their tools: lookup, fetch_page
REST = ("completed", "failed", "awaiting_approval")
TARGET_SPEED = 0.9
TARGET_PEERS = ("dbos", "langgraph_sync")  # the speed target's peers (and the /faster column)
TARGET_GROWTH = 1.1
TARGET_DISK_TRANSCRIPT = 2.0
TARGET_WAL = 2.0


# --------------------------------------------------------------------------- databases


def lsn_int(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) + int(low, 16)


def lsn_text(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


class Database:
    """An autocommit connection of the bench's own to one system's database."""

    def __init__(self, system: str, url: str) -> None:
        import psycopg

        self.system = system
        self.name = common.ensure_database(url)
        self.conn = psycopg.connect(_libpq_url(url), autocommit=True)
        self.oid = self.value("SELECT oid FROM pg_database WHERE datname = current_database()")
        self._relnames: dict[int, str] = {}

    def value(self, sql: str, params: Any = None) -> Any:
        return self.conn.execute(sql, params).fetchone()[0]

    def lsn(self) -> int:
        return lsn_int(self.value("SELECT pg_current_wal_insert_lsn()::text"))

    def relname(self, relfilenode: int) -> str:
        """The relation of a relfilenode (a TOAST table or index by its table's name)."""
        if relfilenode not in self._relnames:
            rows = self.conn.execute(
                "SELECT c.relfilenode, coalesce(t.relname || ' (TOAST)', "
                "ti.relname || ' (TOAST index)', c.relname) FROM pg_class c "
                "LEFT JOIN pg_class t ON t.reltoastrelid = c.oid "
                "LEFT JOIN pg_index i ON i.indexrelid = c.oid "
                "LEFT JOIN pg_class ti ON ti.reltoastrelid = i.indrelid "
                "WHERE c.relfilenode <> 0"
            ).fetchall()
            self._relnames.update({int(node): name for node, name in rows})
        return self._relnames.get(relfilenode, f"relfilenode {relfilenode}")

    def sizes(self) -> dict[str, int]:
        """pg_total_relation_size (heap, TOAST, indexes, all forks) of each of its tables."""
        rows = self.conn.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            f"WHERE c.relkind IN ('r', 'p') AND {TABLES_SQL[self.system]}"
        ).fetchall()
        return {name: int(size) for name, size in rows}


def _libpq_url(url: str) -> str:
    return re.sub(r"^postgres(ql)?(\+\w+)?://", "postgresql://", url)


@dataclass
class Wal:
    """What one system wrote to the WAL in a window: COMMIT records (write transactions:
    a read-only transaction writes none), bytes of its records, of which full-page images,
    and the bytes by relation (a record's first block; "(commit)", "(no block)")."""

    commits: int = 0
    bytes: int = 0
    fpi: int = 0
    by_rel: dict[str, int] = field(default_factory=dict)

    def __sub__(self, other: Wal) -> Wal:
        rels = {r: self.by_rel.get(r, 0) - other.by_rel.get(r, 0) for r in self.by_rel}
        return Wal(
            self.commits - other.commits, self.bytes - other.bytes, self.fpi - other.fpi, rels
        )


class Record(NamedTuple):
    lsn: int
    commit: bool
    length: int  # record_length: header, data and full-page images
    fpi: int
    rel: str


class WalReader:
    """Reads WAL records back through pg_walinspect and keeps one database's: the records
    that touch one of its relations, the records of transactions that did (their COMMITs
    included). Other databases' traffic on the same server (another session's tests) is
    left out."""

    REL = re.compile(r"rel \d+/(\d+)/(\d+)")
    SUBXACTS = re.compile(r"subxacts:((?: \d+)+)")

    def __init__(self, db: Database) -> None:
        self.db = db
        db.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")

    def records(self, start: int, db: Database) -> list[Record]:
        """`db`'s records from `start` to what is flushed now."""
        end = lsn_int(self.db.value("SELECT pg_current_wal_flush_lsn()::text"))
        rows = self.db.conn.execute(
            "SELECT start_lsn::text, xid::text::bigint, resource_manager, record_type, "
            "record_length, fpi_length, description, coalesce(block_ref, '') "
            "FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn)",
            [lsn_text(start), lsn_text(end)],
        ).fetchall()
        mine_xids: set[int] = set()
        rels: list[int | None] = []
        for _lsn, xid, _rm, _type, _len, _fpi, _desc, refs in rows:
            found = [int(node) for d, node in self.REL.findall(refs) if int(d) == db.oid]
            rels.append(found[0] if found else None)
            if found and xid:
                mine_xids.add(xid)
        out = []
        for (lsn, xid, rm, rtype, length, fpi, desc, _refs), rel in zip(rows, rels, strict=True):
            commit = rm == "Transaction" and rtype.startswith("COMMIT")
            mine = rel is not None or (xid != 0 and xid in mine_xids)
            if not mine and commit and (subs := self.SUBXACTS.search(desc or "")):
                mine = any(int(x) in mine_xids for x in subs.group(1).split())
            if mine:
                name = (
                    db.relname(rel) if rel is not None else "(commit)" if commit else "(no block)"
                )
                out.append(Record(lsn_int(lsn), commit, int(length), int(fpi), name))
        return out

    @staticmethod
    def window(records: list[Record], lo: int, hi: int) -> Wal:
        wal = Wal()
        for r in records:
            if lo <= r.lsn < hi:
                wal.commits += r.commit
                wal.bytes += r.length
                wal.fpi += r.fpi
                wal.by_rel[r.rel] = wal.by_rel.get(r.rel, 0) + r.length
        return wal


# --------------------------------------------------------------------------- the systems


class Agentrun:
    """django-agentrun in this process: start_run, then advance until the run rests."""

    name = "agentrun"

    def __init__(self, db: Database) -> None:
        import psycopg

        from bench.clients import USAGE, ModelResponse, StreamAborted

        self.db = db
        self.recorder = workload.Recorder()
        probe_conn = psycopg.connect(db.conn.info.dsn, autocommit=True)
        self.read_lsn = lambda: probe_conn.execute(
            "SELECT pg_current_wal_insert_lsn()::text"
        ).fetchone()[0]
        recorder = self.recorder
        count = iter(range(1, 1 << 62))

        class RecordingClient:
            """A ModelClient answering from the workload's model at once."""

            def create(self, request: Any, *, abort: Any) -> Any:
                if abort.aborted:
                    raise StreamAborted(abort.reason)
                content, stop = recorder.model(request.messages)
                n = next(count)
                return ModelResponse(
                    message_id=f"msg_side_{n:08d}",
                    request_id=f"req_side_{n:08d}",
                    content=content,
                    stop_reason=stop,
                    usage=USAGE,
                    model=request.model,
                )

        self.client = RecordingClient()

    def version(self) -> dict[str, str]:
        return {"django-agentrun": version("django-agentrun")}

    def run(
        self,
        k: int,
        turns: int,
        payload: str,
        run_id: str,
        counted: bool = False,
        probe: Callable[[], Any] | None = None,
    ) -> dict[str, Any]:
        from django_agentrun import start_run

        if counted and probe is None:
            probe = self.read_lsn
        self.recorder.reset(probe=probe, check=counted)
        start = time.perf_counter()
        run = start_run(AGENTS[payload], workload.input_text(k, turns, payload, run_id))
        state = drive_until_rest(run.pk, self.client)
        wall = time.perf_counter() - start
        if state != "completed":
            raise RuntimeError(f"django-agentrun run {run_id} ended {state!r}")
        if len(self.recorder.times) != turns + 1:
            raise RuntimeError(
                f"django-agentrun run {run_id}: {len(self.recorder.times)} model calls, "
                f"expected {turns + 1}"
            )
        return {**self.recorder.figures(), "wall": wall}

    def close(self) -> None:
        pass


def drive_until_rest(run_id: Any, client: Any, limit: int = 100_000) -> str:
    """Advance the run until it is completed, failed or awaiting approval (however many
    turns one advance does); return that state."""
    from django_agentrun.engine import Outcome, advance
    from django_agentrun.models import Run

    idle = 0
    for _ in range(limit):
        if advance(run_id, client=client, heartbeat=False) == Outcome.CONTINUED:
            continue  # more to do: not resting
        state = Run.objects.filter(pk=run_id).values_list("state", flat=True).get()
        if state in REST:
            return state
        idle += 1
        if idle > 3:  # nothing holds the lease in-process: the engine is stuck
            raise RuntimeError(f"run {run_id} neither advances nor rests (state {state!r})")
    raise RuntimeError(f"run {run_id} did not rest after {limit} advances")


class Peer:
    """DBOS or LangGraph in its own process (bench/peers/peer.py in bench/.venv-peers)."""

    def __init__(self, name: str, db: Database, log_dir: Path) -> None:
        self.name = name
        self.db = db
        self.log = log_dir / f"peer-{name}.log"
        self.proc = subprocess.Popen(
            [str(PEERS_PYTHON), str(PEER_SCRIPT), name, _libpq_url(PEER_URLS[name])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log.open("w"),
            text=True,
            cwd=str(ROOT),
        )
        self._read(timeout=120)  # {"ready": name}

    def _read(self, timeout: float) -> dict[str, Any]:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError(
                f"{LABELS[self.name]} peer gave no answer within {timeout:.0f} s "
                f"(exit {self.proc.poll()}); its log: {self.log}\n{_tail(self.log)}"
            )
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"{LABELS[self.name]} peer: {reply['error']}")
        return reply

    def ask(self, command: str, timeout: float = 600) -> dict[str, Any]:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._read(timeout)

    def version(self) -> dict[str, str]:
        return self.ask("info")["versions"]

    def run(
        self, k: int, turns: int, payload: str, run_id: str, counted: bool = False, **options: str
    ) -> dict[str, Any]:
        extra = "".join(f" {key}={value}" for key, value in options.items())
        figures = self.ask(
            f"run k={k} turns={turns} payload={payload} id={run_id} counted={int(counted)}{extra}"
        )
        if len(figures["times"]) != turns + 1:
            raise RuntimeError(
                f"{LABELS[self.name]} run {run_id}: {len(figures['times'])} model calls, "
                f"expected {turns + 1}"
            )
        return figures

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


class PeerMode:
    """A peer run with options of its own (LangGraph with durability="sync")."""

    def __init__(self, name: str, peer: Peer, **options: str) -> None:
        self.name, self.peer, self.db, self.options = name, peer, peer.db, options

    def version(self) -> dict[str, str]:
        return {}

    def run(
        self, k: int, turns: int, payload: str, run_id: str, counted: bool = False
    ) -> dict[str, Any]:
        return self.peer.run(k, turns, payload, run_id, counted, **self.options)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# --------------------------------------------------------------------------- one round


@dataclass
class Plan:
    rounds: int
    reps: int  # timed runs per k per round
    stored: int  # runs per storage batch per round


@dataclass
class RoundFigures:
    ms: dict[int, float] = field(default_factory=dict)  # median ms per turn, by k
    cpu: dict[int, float] = field(default_factory=dict)  # client CPU ms per turn, by k
    run_ms: dict[int, float] = field(default_factory=dict)  # ms per run, end to end
    # Per turn, by k: (a 2T-turn run's figure - a T-turn run's) / T.
    commits: dict[int, float] = field(default_factory=dict)
    wal: dict[int, float] = field(default_factory=dict)  # WAL bytes
    fpi: dict[int, float] = field(default_factory=dict)  # of which full-page images
    wal_by_rel: dict[str, float] = field(default_factory=dict)  # per turn, k = 1
    window_commits: dict[int, float] = field(default_factory=dict)  # first to last model call
    run_commits: dict[int, int] = field(default_factory=dict)  # a T-turn run, start to end
    run_wal: dict[int, int] = field(default_factory=dict)
    disk: dict[str, int] = field(default_factory=dict)  # bytes added by the batch, by payload
    disk_tables: dict[str, dict[str, int]] = field(default_factory=dict)
    first: float = 0.0  # ms per turn, turns 1-10 of the long run
    last: float = 0.0  # turns 91-100

    @property
    def marginal(self) -> float:
        return (self.ms[4] - self.ms[0]) / 4

    @property
    def growth(self) -> float:
        return self.last / self.first


def _intervals_ms(times: list[float]) -> list[float]:
    return [(b - a) * 1000 for a, b in zip(times, times[1:], strict=False)]


class Bench:
    def __init__(self, plan: Plan, systems: dict[str, Any], wal: WalReader) -> None:
        self.plan = plan
        self.systems = systems
        self.wal = wal
        self.serial = 0
        self.rounds: dict[str, list[RoundFigures]] = {s: [] for s in SYSTEMS}
        self.mismatches: list[str] = []

    def run_id(self, system: str) -> str:
        self.serial += 1
        return f"{common.RUN_ID}{system[0]}{self.serial:06d}"

    def counted_run(self, system: str, k: int, turns: int = TURNS) -> tuple[Wal, Wal, dict]:
        """One run with the WAL position read at each model call: (per-turn window, whole
        run, figures). The turn window runs from the first model call to the last."""
        sysobj = self.systems[system]
        db = sysobj.db
        start = db.lsn()
        figures = sysobj.run(k, turns, "small", self.run_id(system), counted=True)
        end = db.lsn()
        if len(figures["probes"]) != turns + 1:
            raise RuntimeError(f"{LABELS[system]}: {len(figures['probes'])} model calls")
        self.mismatches += [f"{LABELS[system]} k={k}: {m}" for m in figures["mismatches"]]
        records = self.wal.records(start, db)
        probes = [lsn_int(p) for p in figures["probes"]]
        return (
            WalReader.window(records, probes[0], probes[-1]),
            WalReader.window(records, start, end),
            figures,
        )

    def warm_up(self, system: str) -> None:
        sysobj = self.systems[system]
        for k in KS:
            sysobj.run(k, TURNS, "small", self.run_id(system))
        sysobj.run(1, TURNS, "realistic", self.run_id(system))
        sysobj.run(1, 20, "small", self.run_id(system))
        self.counted_run(system, 1)

    def one_round(self, system: str) -> RoundFigures:
        sysobj = self.systems[system]
        out = RoundFigures()
        for k in KS:
            turns: list[float] = []
            cpu: list[float] = []
            walls: list[float] = []
            for _ in range(self.plan.reps):
                figures = sysobj.run(k, TURNS, "small", self.run_id(system))
                if len(figures["times"]) != TURNS + 1:
                    raise RuntimeError(f"{LABELS[system]}: {len(figures['times'])} model calls")
                turns += _intervals_ms(figures["times"])
                cpu += _intervals_ms(figures["cpu"])
                walls.append(figures["wall"] * 1000)
            out.ms[k] = statistics.median(turns)
            out.cpu[k] = statistics.median(cpu)
            out.run_ms[k] = statistics.median(walls)
        for k in KS:
            window, short, _ = self.counted_run(system, k, TURNS)
            _, long, _ = self.counted_run(system, k, 2 * TURNS)
            turn = long - short
            out.commits[k] = turn.commits / TURNS
            out.wal[k] = turn.bytes / TURNS
            out.fpi[k] = turn.fpi / TURNS
            if k == 1:
                out.wal_by_rel = {rel: b / TURNS for rel, b in turn.by_rel.items()}
            out.window_commits[k] = window.commits / TURNS
            out.run_commits[k] = short.commits
            out.run_wal[k] = short.bytes
        for payload in workload.PAYLOADS:
            before = sysobj.db.sizes()
            for _ in range(self.plan.stored):
                sysobj.run(1, TURNS, payload, self.run_id(system))
            after = sysobj.db.sizes()
            out.disk_tables[payload] = {t: after[t] - before.get(t, 0) for t in after}
            out.disk[payload] = sum(out.disk_tables[payload].values())
        figures = sysobj.run(1, LONG_TURNS, "small", self.run_id(system))
        long_turns = _intervals_ms(figures["times"])
        out.first = statistics.median(long_turns[:10])
        out.last = statistics.median(long_turns[90:100])
        return out

    def run(self) -> None:
        for r in range(self.plan.rounds):
            shift = r % len(SYSTEMS)
            order = SYSTEMS[shift:] + SYSTEMS[:shift]
            started = time.monotonic()
            for system in order:
                self.rounds[system].append(self.one_round(system))
            a = self.rounds["agentrun"][-1]
            print(
                f"  round {r + 1:2d}/{self.plan.rounds} ({', '.join(LABELS[s] for s in order)}): "
                f"{time.monotonic() - started:.1f} s; ms per turn at k=1: "
                + ", ".join(f"{LABELS[s]} {self.rounds[s][-1].ms[1]:.2f}" for s in SYSTEMS)
                + f"; agentrun growth {a.growth:.2f}",
                flush=True,
            )


# --------------------------------------------------------------------------- the cross-check


_COMMENT = re.compile(r"--[^\n]*")
_PREPARE = re.compile(r"\s*PREPARE\s+(\w+)\s+AS\s+(.*)", re.I | re.S)
_EXECUTE = re.compile(r"\s*EXECUTE\s+(\w+)", re.I)
_WRITE = re.compile(
    r"(^|\()\s*(INSERT|UPDATE|DELETE|MERGE)\b|\bFOR\s+(NO\s+KEY\s+)?UPDATE\b"
    r"|^SELECT \* FROM agentrun_write\(",  # the engine's write: a function (queries.sql)
    re.I,
)


def _writes(sql: str) -> bool:
    """Whether a statement writes (or locks rows), comments and line breaks allowed."""
    return bool(_WRITE.search(_COMMENT.sub(" ", sql).strip()))


def sqlcounter_check(agentrun: Agentrun, wal: WalReader, run_id: str) -> dict[str, Any]:
    """One k = 1 run of django-agentrun with bench.common.SQLCounter installed and the WAL
    position and the counters read at each model call: the server-side COMMIT count and
    the client-side durable commits, per turn, over the same window."""
    from django.db import connection

    counter = common.SQLCounter()
    unseen: dict[str, int] = {}  # autocommit writes SQLCounter's write test misses

    prepared: dict[str, bool] = {}  # prepared statement -> whether it writes

    def classify(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        autocommit = not connection.in_atomic_block and connection.get_autocommit()
        name = common._signature(sql)
        if match := _PREPARE.match(sql):
            prepared[match[1]] = _writes(match[2])
            writes = False
        elif match := _EXECUTE.match(sql):
            name, writes = f"EXECUTE {match[1]}", prepared.get(match[1], False)
        else:
            writes = _writes(sql)
        if autocommit and writes and not common._is_write(sql):
            unseen[name] = unseen.get(name, 0) + 1
        return execute(sql, params, many, context)

    def probe() -> dict[str, Any]:
        return {
            "lsn": agentrun.read_lsn(),
            "durable": counter.durable_commits,
            "unseen": sum(unseen.values()),
            "commits": counter.commits,
            "queries": counter.queries,
            "round_trips": counter.round_trips,
            "db": counter.db_seconds,
            "by_signature": {k: (len(v), sum(v)) for k, v in counter.by_signature.items()},
        }

    db = agentrun.db
    connection.close()  # a new connection: what a connection does first is seen here
    start = db.lsn()
    with counter.installed(connection), connection.execute_wrapper(classify):
        figures = agentrun.run(1, TURNS, "small", run_id, counted=True, probe=probe)
    end = db.lsn()
    probes = figures["probes"]
    first, last = probes[0], probes[-1]
    records = wal.records(start, db)
    turn = WalReader.window(records, lsn_int(first["lsn"]), lsn_int(last["lsn"]))
    whole = WalReader.window(records, start, end)
    zero = (0, 0.0)
    signatures = {
        name: (
            (n - first["by_signature"].get(name, zero)[0]) / TURNS,
            (t - first["by_signature"].get(name, zero)[1]) * 1000 / TURNS,
        )
        for name, (n, t) in last["by_signature"].items()
    }
    wall = (figures["times"][-1] - figures["times"][0]) * 1000 / TURNS
    return {
        "server_turn": turn.commits / TURNS,
        "client_turn": (last["durable"] - first["durable"]) / TURNS,
        "server_run": whole.commits,
        "client_run": counter.durable_commits,
        "commits_run": counter.commits,
        "unseen": unseen,
        "unseen_turn": (last["unseen"] - first["unseen"]) / TURNS,
        "unseen_run": sum(unseen.values()),
        "commits_turn": (last["commits"] - first["commits"]) / TURNS,
        "queries_turn": (last["queries"] - first["queries"]) / TURNS,
        "round_trips_turn": (last["round_trips"] - first["round_trips"]) / TURNS,
        "db_ms_turn": (last["db"] - first["db"]) * 1000 / TURNS,
        "wall_ms_turn": wall,
        "signatures": {k: v for k, v in signatures.items() if v[0]},
    }


# --------------------------------------------------------------------------- report


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def paired(a: list[RoundFigures], b: list[RoundFigures], get: Callable[[RoundFigures], float]):
    return med([get(x) / get(y) for x, y in zip(a, b, strict=True) if get(y)])


def vs_faster(
    rounds: dict[str, list[RoundFigures]],
    get: Callable[[RoundFigures], float],
    peers: tuple[str, str] = ("dbos", "langgraph"),
) -> float:
    """Median over rounds of agentrun's figure / the faster peer's figure in that round."""
    return med(
        [
            get(a) / min(get(d), get(g))
            for a, d, g in zip(rounds["agentrun"], rounds[peers[0]], rounds[peers[1]], strict=True)
        ]
    )


def fmt(value: Any, digits: int = 2) -> str:
    if isinstance(value, str):
        return value
    if value != value:  # nan
        return "-"
    if isinstance(value, int) or abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def ratio(value: float) -> str:
    return "-" if value != value else f"{value:.2f}x"


def print_table(headers: list[str], rows: list[list[str]], indent: str = "  ") -> None:
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return indent + "  ".join([first, *rest]).rstrip()

    print(line(headers))
    print(line(["-" * w for w in widths]))
    for row in rows:
        print(line(row))


def report(bench: Bench, plan: Plan, check: dict[str, Any]) -> None:
    rounds = bench.rounds
    a, d = rounds["agentrun"], rounds["dbos"]
    peers = SYSTEMS[1:]
    stored = plan.stored * plan.rounds
    small_t = workload.transcript_bytes(1, TURNS, "small", bench.run_id("x"))
    real_t = workload.transcript_bytes(1, TURNS, "realistic", bench.run_id("x"))

    def disk(system: str, payload: str) -> float:
        return sum(r.disk[payload] for r in rounds[system]) / stored

    rows: list[list[str]] = []

    def row(
        label: str, get: Callable[[RoundFigures], float], digits: int = 2, fast=False, ratios=True
    ):
        values = [med([get(r) for r in rounds[s]]) for s in SYSTEMS]
        rows.append(
            [
                label,
                *(fmt(v, digits) for v in values),
                *(ratio(paired(a, rounds[p], get)) if ratios else "" for p in peers),
                ratio(vs_faster(rounds, get, TARGET_PEERS)) if fast else "",
            ]
        )

    for k in KS:
        row(f"ms per turn, k = {k} (T = {TURNS})", lambda r, k=k: r.ms[k], fast=True)
    row("marginal ms per tool call, (k4 - k0) / 4", lambda r: r.marginal, 3, fast=True)
    row("  client CPU ms per turn, k = 1", lambda r: r.cpu[1])
    row(f"  ms per {TURNS}-turn run end to end, k = 1", lambda r: r.run_ms[1], 1, fast=True)
    row("durable commits per turn, k = 1", lambda r: r.commits[1])
    row("WAL bytes per turn, k = 1", lambda r: r.wal[1], 0)
    row("  of which full-page images", lambda r: r.fpi[1], 0, ratios=False)
    for payload, transcript, label in (
        ("small", small_t, f"bytes on disk per {TURNS}-turn run, k = 1"),
        ("realistic", real_t, "same, realistic payload"),
    ):
        values = [disk(s, payload) for s in SYSTEMS]
        rows.append(
            [
                f"{label} (transcript {transcript:,} B)",
                *(fmt(v) for v in values),
                *(ratio(values[0] / v) for v in values[1:]),
                "",
            ]
        )
        rows.append(
            [
                "  as a multiple of the transcript",
                *(f"{v / transcript:.2f}x" for v in values),
                *([""] * len(peers)),
                "",
            ]
        )
    row(f"ms per turn, turns 1-10 of {LONG_TURNS}, k = 1", lambda r: r.first)
    row("ms per turn, turns 91-100", lambda r: r.last)
    row("  turns 91-100 / turns 1-10", lambda r: r.growth)
    common.section("Side by side: medians over rounds; ratios paired by round")
    print_table(
        ["figure", *(LABELS[s] for s in SYSTEMS), *(f"/{LABELS[p]}" for p in peers), "/faster"],
        rows,
    )
    print(
        f"\n  {plan.rounds} rounds; per round and system: {plan.reps} timed run(s) per k, one counted run\n"
        f"  per k, {plan.stored} + {plan.stored} runs per storage batch, one {LONG_TURNS}-turn run. "
        "/X: django-agentrun's round-r\n  figure over X's round-r figure, median over rounds "
        "(storage: totals over all rounds, page-\n  grained); /faster: over the faster of DBOS "
        "and LangGraph sync in that round (the speed target).\n"
        '  LangGraph\'s default durability is "async": its checkpoints are written by a '
        "background thread\n  while the next step runs, so the time between model calls "
        "leaves the writes out (they\n  catch up by the end of the run: see the end-to-end "
        'row). LangGraph sync: durability="sync".'
    )
    _per_k(rounds)
    _storage_tables(rounds, stored)
    _wal_tables(rounds)
    _cross_check(check)
    if bench.mismatches:
        print("\n  the model was handed other messages than the transcript:")
        for m in bench.mismatches[:10]:
            print(f"    {m}")

    common.section("Targets")
    # The peer is LangGraph's Postgres saver in sync durability (each step durable
    # before the next, the guarantee DBOS and django-agentrun give); its default (async)
    # durability writes behind the loop, and is shown as a figure.
    for k in KS:
        value = vs_faster(rounds, lambda r, k=k: r.ms[k], TARGET_PEERS)
        common.check(
            "side-by-side",
            f"ms per turn, k = {k}: <= {TARGET_SPEED}x the faster of DBOS and LangGraph sync",
            value <= TARGET_SPEED,
            f"{value:.2f}x (paired per round, median)",
        )
    for k in KS:
        value = vs_faster(rounds, lambda r, k=k: r.ms[k])
        print(
            f"  [figure] ms per turn, k = {k}, over the faster of DBOS and LangGraph "
            f"(async, its default): {value:.2f}x"
        )
    growth = med([r.growth for r in a])
    common.check(
        "side-by-side",
        f"turns 91-100 <= {TARGET_GROWTH}x turns 1-10 (django-agentrun)",
        growth <= TARGET_GROWTH,
        f"{growth:.2f}x ({med([r.first for r in a]):.2f} -> {med([r.last for r in a]):.2f} ms)",
    )
    commits = [r.commits[1] for r in a]
    common.check(
        "side-by-side",
        "durable commits per turn <= k + 1 (django-agentrun, k = 1)",
        med(commits) <= 2,
        f"{med(commits):.2f} (rounds: {min(commits):.2f}-{max(commits):.2f}; target 2)",
    )
    mine, theirs = disk("agentrun", "small"), disk("dbos", "small")
    common.check(
        "side-by-side",
        "bytes on disk per run <= DBOS's (k = 1, small payload)",
        mine <= theirs,
        f"{mine:,.0f} B vs {theirs:,.0f} B ({mine / theirs:.2f}x)",
    )
    real = disk("agentrun", "realistic")
    common.check(
        "side-by-side",
        f"bytes on disk per run <= {TARGET_DISK_TRANSCRIPT}x the transcript (realistic payload)",
        real <= TARGET_DISK_TRANSCRIPT * real_t,
        f"{real:,.0f} B = {real / real_t:.2f}x the transcript ({real_t:,} B)",
    )
    wal = paired(a, d, lambda r: r.wal[1])
    common.check(
        "side-by-side",
        f"WAL per turn <= {TARGET_WAL}x DBOS's (k = 1)",
        wal <= TARGET_WAL,
        f"{wal:.2f}x (paired; {med([r.wal[1] for r in a]):,.0f} vs "
        f"{med([r.wal[1] for r in d]):,.0f} B)",
    )


def _per_k(rounds: dict[str, list[RoundFigures]]) -> None:
    print(
        f"\n  per k (counted runs; per turn = (a {2 * TURNS}-turn run - a {TURNS}-turn run) / {TURNS}; "
        "in window = between\n  the first and the last model call of a "
        f"{TURNS}-turn run, / {TURNS}; per run = a {TURNS}-turn run from before its start\n"
        "  to after its end):"
    )
    rows = []
    for s in SYSTEMS:
        for k in KS:
            rs = rounds[s]
            rows.append(
                [
                    f"{LABELS[s]}, k = {k}",
                    fmt(med([r.ms[k] for r in rs])),
                    fmt(med([r.cpu[k] for r in rs])),
                    fmt(med([r.commits[k] for r in rs])),
                    fmt(med([r.window_commits[k] for r in rs])),
                    fmt(med([r.wal[k] for r in rs]), 0),
                    fmt(med([r.fpi[k] for r in rs]), 0),
                    fmt(med([r.run_commits[k] for r in rs]), 0),
                    fmt(med([r.run_wal[k] for r in rs]), 0),
                ]
            )
    print_table(
        [
            "system",
            "ms/turn",
            "CPU ms/turn",
            "commits/turn",
            "in window",
            "WAL B/turn",
            "FPI B/turn",
            "commits/run",
            "WAL B/run",
        ],
        rows,
    )


def _storage_tables(rounds: dict[str, list[RoundFigures]], stored: int) -> None:
    print("\n  bytes on disk per run, by table (pg_total_relation_size growth, k = 1):")
    rows = []
    for s in SYSTEMS:
        names = sorted({t for r in rounds[s] for p in r.disk_tables for t in r.disk_tables[p]})
        for name in names:
            per = [
                sum(r.disk_tables[p].get(name, 0) for r in rounds[s]) / stored
                for p in workload.PAYLOADS
            ]
            if any(per):
                rows.append([f"{LABELS[s]}: {name}", *(fmt(v) for v in per)])
    print_table(["table", "small", "realistic"], rows)


def _wal_tables(rounds: dict[str, list[RoundFigures]], top: int = 8) -> None:
    print(
        f"\n  WAL bytes per turn by relation, k = 1 ((a {2 * TURNS}-turn run - a {TURNS}-turn run) / "
        f"{TURNS}; a record counts\n  for the relation of its first block; median over rounds):"
    )
    rows = []
    for s in SYSTEMS:
        names = {n for r in rounds[s] for n in r.wal_by_rel}
        values = {n: med([r.wal_by_rel.get(n, 0.0) for r in rounds[s]]) for n in names}
        ordered = sorted(((n, v) for n, v in values.items() if v >= 1), key=lambda x: -x[1])
        for name, value in ordered[:top]:
            rows.append([f"{LABELS[s]}: {name}", fmt(value, 0)])
        if rest := [v for _, v in ordered[top:]]:
            rows.append([f"{LABELS[s]}: {len(rest)} more relations", fmt(sum(rest), 0)])
    print_table(["relation", "bytes"], rows)


def _cross_check(check: dict[str, Any]) -> None:
    c = check
    if c["server_turn"] == c["client_turn"] and c["server_run"] == c["client_run"]:
        verdict = "the server's count and SQLCounter's durable commits agree"
    elif (
        c["server_turn"] == c["client_turn"] + c["unseen_turn"]
        and c["server_run"] == c["client_run"] + c["unseen_run"]
    ):
        unseen = ", ".join(f"{n} x {name}" for name, n in c["unseen"].items())
        verdict = (
            "they agree once SQLCounter's misses are counted: its write test (bench/common.py\n"
            "    _is_write) does not see the writes of a prepared statement's EXECUTE, nor of a\n"
            "    statement that starts with a comment or has a line break after '(' "
            f"(per run: {unseen})"
        )
    else:
        verdict = "THEY DIFFER"
    print(
        "\n  commit count cross-check (django-agentrun, one k = 1 run with bench.common.SQLCounter):\n"
        f"    server side (COMMIT records of its database): {c['server_turn']:.2f} per turn, "
        f"{c['server_run']} per run\n"
        f"    SQLCounter: {c['commits_turn']:.2f} commits per turn ({c['client_turn']:.2f} counted "
        f"durable), {c['commits_run']} per run ({c['client_run']} durable)\n"
        f"    -> {verdict}\n"
        f"    per turn: {c['queries_turn']:.1f} statements, {c['round_trips_turn']:.1f} round trips, "
        f"{c['db_ms_turn']:.2f} ms inside execute/commit of {c['wall_ms_turn']:.2f} ms "
        "(counters installed); by statement:"
    )
    for name, (count, ms) in sorted(c["signatures"].items(), key=lambda x: -x[1][1]):
        print(f"      {count:5.2f} x {ms:6.2f} ms  {name}")


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 rounds, fewer runs per round")
    parser.add_argument("--rounds", type=int, help="rounds (default 20; 4 with --quick)")
    parser.add_argument("--json", type=Path, help="write every round's figures to this file")
    parser.add_argument(
        "--telemetry",
        action="store_true",
        help="django-agentrun with an OpenTelemetry SDK installed (spans and metrics to no-op "
        "exporters, as bench/telemetry.py installs it): compare its paired ratios with a run "
        "without",
    )
    args = parser.parse_args(argv)
    if args.telemetry:
        from bench.telemetry import install_sdk

        install_sdk()
    plan = Plan(rounds=args.rounds or (4 if args.quick else 20), reps=1, stored=2)
    if not args.quick:
        plan.reps, plan.stored = 3, 3
    if not PEERS_PYTHON.exists():
        print(f"{PEERS_PYTHON} is missing: run `make bench-peers` first", file=sys.stderr)
        return 2
    started = time.monotonic()
    db_name = common.setup_django()
    common.reset_tables(db_name)
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"agentrun-bench-{common.RUN_ID}"
    log_dir.mkdir(parents=True, exist_ok=True)

    from bench.engine import _stub_dispatch

    agentrun_db = Database("agentrun", common.database_url())
    wal = WalReader(agentrun_db)
    task, _ = _stub_dispatch()
    systems: dict[str, Any] = {"agentrun": Agentrun(agentrun_db)}
    try:
        for name in PEERS:
            db = Database(name, PEER_URLS[name])
            systems[name] = Peer(name, db, log_dir)
            db.conn.execute(RESET_SQL[name])
        systems["langgraph_sync"] = PeerMode(
            "langgraph_sync", systems["langgraph"], durability="sync"
        )
        pg_version = agentrun_db.value("SHOW server_version")
        sync = agentrun_db.value("SHOW synchronous_commit")
        autovacuum = agentrun_db.value("SHOW autovacuum")
        print(
            f"side by side ({'quick' if args.quick else 'full'}): {plan.rounds} rounds on Postgres "
            f"{pg_version} (synchronous_commit={sync}, autovacuum={autovacuum}); databases "
            + ", ".join(f"{LABELS[s]}: {systems[s].db.name}" for s in ("agentrun", *PEERS))
            + f"; {os.cpu_count()} CPUs, {_load()}"
            + ("; telemetry on (SDK, no-op exporters)" if args.telemetry else ""),
            flush=True,
        )
        bench = Bench(plan, systems, wal)
        for system in SYSTEMS:
            bench.warm_up(system)
        check = sqlcounter_check(systems["agentrun"], wal, bench.run_id("agentrun"))
        bench.run()
        versions = {k: v for s in SYSTEMS for k, v in systems[s].version().items()}
    finally:
        del task.apply_async
        for s in PEERS:
            if s in systems:
                systems[s].close()
    report(bench, plan, check)
    if args.json:
        args.json.write_text(
            json.dumps({s: [r.__dict__ for r in rs] for s, rs in bench.rounds.items()}, indent=1)
        )
    print(
        "\n  versions: "
        + ", ".join(f"{k} {v}" for k, v in versions.items())
        + f", PostgreSQL {pg_version}; engine at {_git_head()}"
    )
    passed = sum(1 for c in common.CHECKS if c.passed)
    missed = sum(1 for c in common.CHECKS if c.passed is False)
    print(f"  {passed} PASS, {missed} MISS; {time.monotonic() - started:.0f} s; {_load()}")
    return 0


def _git_head() -> str:
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "log", "-1", "--format=%h"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "django_agentrun"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"commit {head}" + (" + uncommitted changes in django_agentrun/" if dirty else "")


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min)"


if __name__ == "__main__":
    sys.exit(main())
