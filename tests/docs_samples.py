"""The code blocks of the docs (README.md and docs/**/*.md), as the docs tests read them.

A ```python block runs in the test suite (tests/db/test_docs_samples.py) unless the line
before it marks it: `<!-- norun: why -->` (a fragment: it needs a project, a broker or names
the page leaves out), `<!-- file: PATH -->` / `<!-- append: PATH -->` (the tutorial's project,
built and run by tests/workers/test_fresh_project.py) or `<!-- quickstart: PATH -->` (the
README's, run by tests/pure/test_quickstart.py). Every block, marked or not, must parse.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(
    r"(?:^[ \t]*<!-- (?P<kind>norun|file|append|quickstart|shell)(?::[ \t]*(?P<note>[^\n]*?))? -->\n)?"
    r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
    re.S | re.M,
)


@dataclass(frozen=True)
class Sample:
    page: str  # relative to the repository
    line: int
    lang: str
    kind: str | None  # the marker before it, if any
    code: str

    @property
    def runs(self) -> bool:
        return self.lang in ("python", "py") and self.kind is None

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def samples(page: Path) -> list[Sample]:
    text = page.read_text()
    found = []
    for m in BLOCK.finditer(text):
        indent = len(m["indent"])
        code = "\n".join(line[indent:] for line in m["body"].split("\n"))
        line = text.count("\n", 0, m.start("indent")) + 1
        name = str(page.relative_to(ROOT))
        found.append(Sample(name, line, m["lang"], m["kind"], code))
    return found


def python_samples() -> list[Sample]:
    return [s for page in pages() for s in samples(page) if s.lang in ("python", "py")]
