"""WAL per turn and HOT share, django-agentrun alone (no peers venv needed).

    DATABASE_URL=postgres://…/agentrun_bench python bench/wal_turn.py [--rounds N] [--k K]

The side-by-side benchmark's WAL figure (bench/side_by_side.py: a 2T-turn run's WAL less
a T-turn run's, over T; records read back through pg_walinspect, by relation) for
django-agentrun only, so that a change to its storage can be measured before and after
without DBOS and LangGraph installed; and the share of the run, turn and tool-call rows'
updates that were HOT (pg_stat_user_tables) over the same runs. The median over rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402
from bench.side_by_side import TURNS, Agentrun, Bench, Database, Plan, WalReader  # noqa: E402
from bench.storage import HOT_TABLES, _updates  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--k", type=int, default=1, help="tool calls a turn (default 1)")
    args = parser.parse_args(argv)
    db_name = common.setup_django()
    common.reset_tables(db_name)
    from bench.engine import _stub_dispatch

    db = Database("agentrun", common.database_url())
    wal = WalReader(db)
    task, _ = _stub_dispatch()
    try:
        bench = Bench(Plan(rounds=args.rounds, reps=1, stored=0), {"agentrun": Agentrun(db)}, wal)
        bench.counted_run("agentrun", args.k)  # warm-up
        per_turn: list[float] = []
        fpi: list[float] = []
        by_rel: dict[str, list[float]] = {}
        before = _updates()
        for _ in range(args.rounds):
            _, short, _ = bench.counted_run("agentrun", args.k, TURNS)
            _, long, _ = bench.counted_run("agentrun", args.k, 2 * TURNS)
            turn = long - short
            per_turn.append(turn.bytes / TURNS)
            fpi.append(turn.fpi / TURNS)
            for rel in set(turn.by_rel) | set(by_rel):
                by_rel.setdefault(rel, []).append(turn.by_rel.get(rel, 0) / TURNS)
        after = _updates()
    finally:
        del task.apply_async
    print(
        f"WAL per turn at k={args.k}, median of {args.rounds} rounds: "
        f"{statistics.median(per_turn):,.0f} B (of which full-page images "
        f"{statistics.median(fpi):,.0f} B)"
    )
    for rel, values in sorted(by_rel.items(), key=lambda kv: -statistics.median(kv[1])):
        print(f"  {rel:45s} {statistics.median(values):8,.0f} B")
    for table in HOT_TABLES:
        upd = after[table][0] - before.get(table, (0, 0))[0]
        hot = after[table][1] - before.get(table, (0, 0))[1]
        share = f"{hot / upd:.0%}" if upd else "-"
        print(f"HOT updates of {table}: {hot:,} of {upd:,} ({share})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
