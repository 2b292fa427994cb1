"""The code's boundaries: a module's private names stay in it, no module of the package is
over 600 lines, and the import contracts (pyproject's [tool.importlinter]) hold."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "django_agentrun"
MAX_LINES = 600  # issue #27: modules split where the meaning splits, none over 600


def _modules(top: Path) -> list[Path]:
    return sorted(p for p in top.rglob("*.py") if "migrations" not in p.parts)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(path: Path, module: str | None, level: int) -> str:
    """The absolute name of `from <level dots><module> import ...` in `path`."""
    if not level:
        return module or ""
    base = _module_name(path).split(".")
    if path.name != "__init__.py":
        base.pop()
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


# Django's documented model API, spelled with an underscore.
DJANGO_API = frozenset({"_meta", "_base_manager", "_default_manager"})


def _private(name: str) -> bool:
    return (
        name.startswith("_")
        and not (name.startswith("__") and name.endswith("__"))
        and name not in DJANGO_API
    )


def private_uses(path: Path) -> list[str]:
    """`from <a package module> import _name`, and `<a package module>._name`, in `path`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    own = _module_name(path)
    found, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _resolve(path, node.module, node.level)
            if not source.startswith("django_agentrun") or source == own:
                continue
            for alias in node.names:
                if _private(alias.name):
                    found.append(
                        f"{path.relative_to(ROOT)}:{node.lineno} imports {source}.{alias.name}"
                    )
                else:
                    aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("django_agentrun"):
                    aliases[alias.asname or alias.name.split(".")[0]] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and _private(node.attr)
        ):
            found.append(
                f"{path.relative_to(ROOT)}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}"
            )
    return found


@pytest.mark.parametrize("top", ["django_agentrun", "tests", "bench"])
def test_private_names__stay_in_their_module(top):
    found = [use for path in _modules(ROOT / top) for use in private_uses(path)]
    assert found == []


def test_private_names__the_check_sees_both_forms(tmp_path, monkeypatch):
    sample = PACKAGE / "engine" / "_layout_sample.py"
    sample.write_text(
        "from ..store.unit import _helper\nfrom .. import services\nservices._enqueue(1)\n"
    )
    try:
        found = private_uses(sample)
    finally:
        sample.unlink()
    assert len(found) == 2, found


def test_modules__none_much_over_400_lines():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in _modules(PACKAGE)}
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}


def test_import_contracts__kept():
    """lint-imports: the layers point one way, and no package has an import cycle
    (function-local imports included)."""
    done = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports"))],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:]
