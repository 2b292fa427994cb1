"""The docs keep up with the code: the README stays short, the reference pages name every
setting, check id and signal, and every Python sample parses (the runnable ones also run:
tests/db/test_docs_samples.py)."""

from __future__ import annotations

import ast
import re

import pytest
from django.dispatch import Signal

from django_agentrun import signals
from django_agentrun.conf import DEFAULTS
from tests.docs_samples import ROOT, pages, python_samples, samples

DOCS = ROOT / "docs"


def test_readme__at_most_250_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_settings_reference__names_every_setting():
    page = (DOCS / "reference" / "settings.md").read_text()
    missing = [name for name in DEFAULTS if f"`AGENTRUN_{name}` (" not in page]
    assert missing == []


def _emitted_check_ids() -> set[str]:
    found = set()
    for module in ("checks.py", "deploy_checks.py", "model_checks.py"):
        found |= set(
            re.findall(r"agentrun\.[EW]\d{3}", (ROOT / "django_agentrun" / module).read_text())
        )
    return found


def test_checks_reference__names_every_check_id():
    page = (DOCS / "reference" / "checks.md").read_text()
    described = set(re.findall(r"^`(agentrun\.[EW]\d{3})`$", page, re.M))
    assert {"agentrun.E010", "agentrun.W005", "agentrun.E021"} <= _emitted_check_ids()
    assert described == _emitted_check_ids()


def test_signals_reference__names_every_signal():
    page = (DOCS / "reference" / "signals.md").read_text()
    names = [n for n, v in vars(signals).items() if isinstance(v, Signal)]
    assert names and [n for n in names if f"| `{n}` |" not in page] == []


@pytest.mark.parametrize("sample", python_samples(), ids=str)
def test_python_samples__parse(sample):
    assert ast.parse(sample.code, filename=str(sample)).body, f"{sample} is empty"


def test_samples__every_marker_is_read():
    """A marker the samples' reader does not know (a typo) would leave a block unmarked."""
    for page in pages():
        text = page.read_text()
        markers = re.findall(r"^[ \t]*<!-- (\w+):", text, re.M)
        known = {
            "norun",
            "file",
            "append",
            "quickstart",
            "shell",
            "readme",  # the README's checkout commands (tests/workers/test_readme.py)
            "rules-table",
            "unsourced-values",
        }
        assert set(markers) <= known, (page, markers)
        marked = [s for s in samples(page) if s.kind]
        fences = re.findall(r"^[ \t]*<!-- (?:norun|file|append|quickstart|shell)\b", text, re.M)
        assert len(marked) == len(fences), page


def test_docs__every_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    listed = set(re.findall(r":\s+(\S+\.md)$", nav, re.M))
    files = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert files - listed == set()
    # Generated at build (tools/docs_hooks.py).
    assert listed - files <= {"reference/openapi.md", "quickstart.md"}


def test_docs__the_readme_links_resolve():
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(((?!https?:|#)[^)#]+)", readme)
    assert targets
    assert [t for t in targets if not (ROOT / t).exists()] == []


def test_docs__the_trace_page_exists():
    # Generated from the trace test (tests/postgres/test_trace.py); a title until then.
    assert (DOCS / "explanation" / "trace.md").read_text().startswith("# ")
