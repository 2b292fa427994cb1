"""The Markdown files read where the repository is hosted (a forge renders README.md,
CHANGELOG.md and docs/ as they are, without the docs site's generated pages): every
relative link goes to a file the repository has (issue 37: three did not)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "bench" / "README.md",
         *sorted((ROOT / "docs").rglob("*.md"))]  # fmt: skip


def targets(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code is not linked
    return [
        link
        for link in LINK.findall(text)
        if not re.match(r"[a-z][a-z0-9+.-]*:|#", link)  # http:, mailto:, an anchor here
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links__go_to_files_of_the_repository(page):
    missing = [
        link
        for link in targets(page)
        if not (page.parent / link.split("#", 1)[0]).resolve().exists()
    ]
    assert missing == [], missing


USER_PAGES = [
    page
    for page in sorted((ROOT / "docs").rglob("*.md"))
    if page.parent.name in ("how-to", "tutorial", "reference") or page.name == "index.md"
    if page.name != "development.md"
]
PROJECT_OWN = re.compile(r"\b(tests|bench)/|make (test|bench)-")


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_pages__speak_of_the_users_project_not_ours(page):
    """How-tos, the tutorial and the reference speak to a user about their project; the
    project's own tests and benchmarks are in docs/how-to/development.md and bench/README.md."""
    found = [line for line in page.read_text().splitlines() if PROJECT_OWN.search(line)]
    assert found == [], found


def test_readme__lists_every_how_to():
    listed = set(re.findall(r"\]\(docs/how-to/([\w-]+\.md)", (ROOT / "README.md").read_text()))
    assert {p.name for p in (ROOT / "docs" / "how-to").glob("*.md")} - listed == set()
