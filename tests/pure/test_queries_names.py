"""store/queries.sql's comments name only what exists: each dotted Python name they
mention (`transitions.x`, `store.leases.y`, `engine.z`) resolves in the package, and
each file they point to (`store/writes.py`, `tests/postgres/test_write.py`) is there."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "django_agentrun"
QUERIES = PACKAGE / "store" / "queries.sql"

# A dotted word (`store.leases.following_runs`) or a path (`store/writes.py`).
_MENTION = re.compile(r"[A-Za-z_][\w/]*(?:\.[A-Za-z_]\w*)+")
_FILE_SUFFIXES = (".py", ".md", ".sql", ".toml", ".json")


def _comments() -> list[tuple[int, str]]:
    """(line number, text) of each comment line: the part after `--`."""
    out = []
    for number, line in enumerate(QUERIES.read_text(encoding="utf-8").splitlines(), 1):
        if "--" in line:
            out.append((number, line.split("--", 1)[1]))
    return out


def _mentions() -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(Python names, file paths) mentioned in the comments, with their line numbers."""
    names, paths = [], []
    for number, text in _comments():
        for found in _MENTION.findall(text):
            is_path = "/" in found or found.endswith(_FILE_SUFFIXES)
            (paths if is_path else names).append((number, found))
    return names, paths


def resolve(dotted: str, package: str = "django_agentrun") -> str | None:
    """None when `dotted` (relative to `package`) names a module or an attribute of one;
    otherwise what is missing, said plainly."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        module_name = ".".join([package, *parts[:split]])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue  # not a module: the rest may be attributes of a shorter prefix
            raise
        for i, attr in enumerate(parts[split:], start=split):
            if not hasattr(obj, attr):
                where = ".".join([package, *parts[:i]])
                return f"{where} has no {attr!r}"
            obj = getattr(obj, attr)
        return None
    return f"{package}.{parts[0]} is no module of the package"


def _exists(path: str) -> bool:
    """A path as the comments give them: from the package (`store/sql.py`) or from the
    checkout's root (`tests/...`, `docs/...`)."""
    return (PACKAGE / path).exists() or (ROOT / path).exists()


def test_queries_sql__mentions_some_names_and_paths():
    """The scan finds what it looks for (a broken pattern would pass every check below)."""
    names, paths = _mentions()
    assert "store.leases.following_runs" in {name for _, name in names}
    assert "store/writes.py" in {path for _, path in paths}


def test_queries_sql__every_python_name_in_its_comments_exists():
    names, _ = _mentions()
    missing = [
        f"queries.sql line {number}: {name}: {problem}"
        for number, name in names
        if (problem := resolve(name)) is not None
    ]
    assert not missing, "\n".join(missing)


def test_queries_sql__every_file_in_its_comments_exists():
    _, paths = _mentions()
    missing = [f"queries.sql line {number}: {path}" for number, path in paths if not _exists(path)]
    assert not missing, "no such file:\n" + "\n".join(missing)


@pytest.mark.parametrize(
    "dotted, problem",
    [
        ("store.leases.following_runs", None),
        ("transitions", None),
        ("transitions.wake_follow_up", "django_agentrun.transitions has no 'wake_follow_up'"),
        ("store.nowhere.thing", "django_agentrun.store has no 'nowhere'"),
        ("nowhere.thing", "django_agentrun.nowhere is no module of the package"),
    ],
)
def test_resolve__says_what_is_missing(dotted, problem):
    assert resolve(dotted) == problem
