"""MkDocs hooks of the docs site (mkdocs.yml `hooks:`): the README's quick start as a page,
and the REST API's OpenAPI document.

At each build, `manage.py spectacular` on the example project writes the API's schema (with
the settings of the API's own schema view, tools/openapi_settings.py, so it is the document
`GET <mount>/schema/` serves). It joins the built site as reference/openapi.json and
reference/openapi.yaml, and reference/openapi.md renders its operations (generated, never
in git). `--validate --fail-on-warn`: a schema drf-spectacular cannot resolve fails the build.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("get", "post", "put", "patch", "delete")


def openapi_schema() -> dict[str, Any]:
    """The API's OpenAPI document, as `manage.py spectacular` writes it."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(DJANGO_SETTINGS_MODULE="example_project.settings", DJANGO_SECRET_KEY="docs-only")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "openapi.json"
        done = subprocess.run(
            [
                sys.executable,
                "manage.py",
                "spectacular",
                "--format",
                "openapi-json",
                "--custom-settings",
                "tools.openapi_settings.SETTINGS",
                "--validate",
                "--fail-on-warn",
                "--file",
                str(out),
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            raise RuntimeError(f"manage.py spectacular failed:\n{done.stdout}{done.stderr}")
        return json.loads(out.read_text())


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def operations_page(schema: dict[str, Any]) -> str:
    """A Markdown page listing each operation: method, path, summary, parameters, statuses."""
    lines = [
        "# OpenAPI operations",
        "",
        "Generated at build time from the API's OpenAPI document (`manage.py spectacular` on "
        "the example project, mounted at `/api/agentrun/`), which is also served here as "
        "[openapi.yaml](openapi.yaml) and [openapi.json](openapi.json), and by a running "
        "project at `<mount>/schema/`. Conventions, errors and permissions: "
        "[the REST API](api.md).",
        "",
        f"Title: {schema['info']['title']}, version {schema['info']['version']}.",
        "",
    ]
    for path, item in schema["paths"].items():
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            lines += [f"## `{method.upper()} {path}`", ""]
            if op.get("summary"):
                lines += [_cell(op["summary"]) + ".", ""]
            if op.get("description"):
                lines += [op["description"].strip(), ""]
            params = [*item.get("parameters", []), *op.get("parameters", [])]
            if params:
                lines += ["| parameter | in | description |", "| --- | --- | --- |"]
                for p in params:
                    lines.append(
                        f"| `{p['name']}` | {p['in']} | {_cell(p.get('description', ''))} |"
                    )
                lines.append("")
            statuses = ", ".join(f"`{code}`" for code in op.get("responses", {}))
            lines += [f"Responses: {statuses}. Operation id: `{op['operationId']}`.", ""]
    return "\n".join(lines)


def quickstart_page() -> str:
    """The README's quick start, one source for both (its links made relative to docs/)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    section = re.sub(r"\]\(docs/", "](", section)
    return "# Quick start\n" + section


def on_files(files: Files, config: Any) -> Files:
    schema = openapi_schema()
    generated = {
        "quickstart.md": quickstart_page(),
        "reference/openapi.json": json.dumps(schema, indent=2),
        "reference/openapi.yaml": yaml.safe_dump(schema, sort_keys=False, allow_unicode=True),
        "reference/openapi.md": operations_page(schema),
    }
    for uri, content in generated.items():
        # docs/ keeps a stub of each Markdown page for readers of the repository on a forge
        # (where links to it must not break); the site has the page itself.
        stub = files.get_file_from_path(uri)
        if stub is not None:
            files.remove(stub)
        files.append(File.generated(config, uri, content=content))
    return files
