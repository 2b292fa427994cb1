"""Benchmarks of django-agentrun: `python bench/run.py [--quick] [--only NAME ...]`.

Needs Postgres (DATABASE_URL, default postgres://postgres@127.0.0.1:5432/agentrun_bench,
created if missing) and, for the worker sections, Redis (BENCH_BROKER_URL, default
redis://127.0.0.1:6379/12). Prints figures and PASS/MISS per target; a miss is a
figure, not an error (exit status 0). A section that breaks exits 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402

SECTIONS = ["engine", "throughput", "recovery", "failpoints", "cancel", "storage", "parallel"]
# Run only when named (--only load; make bench-load): 1,000 runs take minutes.
ON_REQUEST = ["load"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples (< ~60 s, a CI smoke)")
    parser.add_argument(
        "--only",
        action="append",
        choices=SECTIONS + ON_REQUEST,
        help="run only this section (repeatable)",
    )
    parser.add_argument(
        "--keep-data", action="store_true", help="do not empty the agentrun tables first"
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    db_name = common.setup_django()
    reset = False if args.keep_data else common.reset_tables(db_name)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        version = cursor.fetchone()[0]
        cursor.execute("SHOW synchronous_commit")
        sync = cursor.fetchone()[0]
    print(
        f"django-agentrun bench ({'quick' if args.quick else 'full'}) on Postgres {version} "
        f"db={db_name} synchronous_commit={sync}"
        f"{' (tables emptied)' if reset else ''}; python {sys.version.split()[0]}; "
        f"{os.cpu_count()} CPUs, {_load()}"
    )
    from bench import (
        cancel,
        engine,
        failpoints,
        load,
        parallel,
        recovery,
        storage,
        throughput,
        workers,
    )

    modules = {
        "engine": engine,
        "throughput": throughput,
        "recovery": recovery,
        "failpoints": failpoints,
        "cancel": cancel,
        "storage": storage,
        "load": load,
        "parallel": parallel,
    }
    failed: list[str] = []
    try:
        for name in args.only or SECTIONS:
            try:
                print(f"\n[{_load()}]", end="")
                modules[name].run(args.quick)
            except Exception:  # noqa: BLE001 - report, go on with the next section
                traceback.print_exc(file=sys.stdout)
                print(f"  section {name} FAILED (see the traceback above)")
                failed.append(name)
                common.check(name, "section ran", None, "failed")
    finally:
        workers.cleanup()
    _summary(time.monotonic() - started, failed)
    return 1 if failed else 0


def _summary(elapsed: float, failed: list[str]) -> None:
    common.section("Summary")
    if common.FIGURES:
        print(common.table(["section", "figure", "value"], [list(f) for f in common.FIGURES]))
    print()
    rows = [[c.section, c.name, c.figure, c.verdict] for c in common.CHECKS]
    print(common.table(["section", "target", "measured", "verdict"], rows))
    passed = sum(1 for c in common.CHECKS if c.passed)
    missed = sum(1 for c in common.CHECKS if c.passed is False)
    print(
        f"\n  {passed} PASS, {missed} MISS"
        f"{', sections failed: ' + ', '.join(failed) if failed else ''}; {elapsed:.1f} s; {_load()}"
    )


def _load() -> str:
    """The machine's load: figures measured on a busy machine are slower (ratios less so)."""
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min)"


if __name__ == "__main__":
    sys.exit(main())
