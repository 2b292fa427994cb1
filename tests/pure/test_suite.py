"""The test suite's own rules: every test can fail, and the shared builders are not copied
back into test modules."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
FACTORIES = (
    "failed_run",
    "completed_run",
    "parked",
    "unknown",
    "expire",
    "crashed_at",
    "by_message",
)
FIXTURES = ("no_broker", "postgres", "test_log", "messages_api", "queue", "own_redis")
HELPERS = ("drive", "drive_last", "assert_api_error", "assert_projection_matches", "wait_for")
# Helpers whose name means "this checks": a test that calls one asserts through it.
CHECKING = ("assert", "check", "expect", "wait_for", "race", "finish", "wait_done")


def _test_modules() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


@functools.cache
def _tree(path: Path) -> ast.Module:
    """A module parsed once for all the checks of this file (each parametrized case used to
    parse the whole suite again: about 80 s of CPU in a run)."""
    return ast.parse(path.read_text())


def _can_fail(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Assert | ast.Raise):
            return True
        if isinstance(sub, ast.With | ast.AsyncWith):
            for item in sub.items:
                call = item.context_expr
                if isinstance(call, ast.Call) and _name(call.func) in ("raises", "warns"):
                    return True
        if isinstance(sub, ast.Call):
            name = _name(sub.func)
            if name in ("fail", "raises") or name.startswith(CHECKING):
                return True
    return False


def _name(func: ast.AST) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def _helpers(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def test_every_test_can_fail():
    """A test passes by asserting something (itself or through a helper of its module that
    asserts), by expecting an exception, or by a check that raises; never by running."""
    silent = []
    for path in _test_modules():
        tree = _tree(path)
        helpers = _helpers(tree)
        checking = {name for name, node in helpers.items() if _can_fail(node)}
        for node in [
            *tree.body,
            *(m for c in tree.body if isinstance(c, ast.ClassDef) for m in c.body),
        ]:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
                continue
            calls = {_name(c.func) for c in ast.walk(node) if isinstance(c, ast.Call)}
            fixtures = {a.arg for a in node.args.args}
            if _can_fail(node) or calls & checking or fixtures & checking:
                continue
            silent.append(f"{path.relative_to(TESTS)}::{node.name}")
    assert silent == [], f"tests that cannot fail: {silent}"


@pytest.mark.parametrize("name", FACTORIES + FIXTURES + HELPERS)
def test_shared_builders_are_defined_once(name):
    """`tests/factories.py` and `tests/conftest.py` hold them; a module that needs another
    flavour names it differently."""
    where = [
        str(path.relative_to(TESTS))
        for path in sorted(TESTS.rglob("*.py"))
        if name in (helpers := _helpers(_tree(path))) and not _delegates(helpers[name])
    ]
    assert len(where) == 1, f"{name} defined in {where}"


def _delegates(node: ast.FunctionDef) -> bool:
    """A fixture of the same name that hands out the shared builder is not a copy."""
    return any(
        isinstance(sub, ast.Attribute)
        and isinstance(sub.value, ast.Name)
        and sub.value.id == "factories"
        for sub in ast.walk(node)
    )


def test_every_test_module_is_in_a_tier():
    from tests.conftest import TIERS

    strays = [str(p.relative_to(TESTS)) for p in _test_modules() if p.parent.name not in TIERS]
    assert strays == []
