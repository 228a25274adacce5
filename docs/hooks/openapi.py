"""MkDocs hook: the API reference page, written at build time from the app's own OpenAPI schema.

`service.main.create_app` builds the app against a throwaway SQLite database (the schema needs no
rows and no migration), and its `app.openapi()` — the schema `/openapi.json` serves, error responses
included — becomes `reference/api.md` (every operation, its parameters, body and answers; every
schema's fields) and `reference/openapi.json`. Nothing is fetched: no CDN, no network.
"""

from __future__ import annotations

import html
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

PAGE = "reference/api.md"
SCHEMA_FILE = "reference/openapi.json"
METHODS = ("get", "post", "put", "patch", "delete")
CODE_SPAN = re.compile(r"(`[^`]*`)")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    schema = openapi_schema(Path(config.config_file_path).parent)
    files.append(File.generated(config, PAGE, content=api_page(schema)))
    files.append(File.generated(config, SCHEMA_FILE, content=json.dumps(schema, indent=2)))
    return files


def openapi_schema(repo: Path) -> dict[str, Any]:
    """The schema of the app as `gluejobs serve` builds it, with defaults that touch only a temp dir."""
    if str(repo) not in sys.path:  # mkdocs runs from anywhere; the app's packages are the repository's
        sys.path.insert(0, str(repo))
    from service.main import create_app
    from shared.core.config import Settings

    with tempfile.TemporaryDirectory(prefix="gluejobs-docs-") as tmp:
        root = Path(tmp)
        settings = Settings(
            database_url=f"sqlite:///{root / 'docs.db'}",
            artifacts_dir=root / "artifacts",
            data_dir=root / "data",
            models_dir=root / "models",
            cache_dir=root / "cache",
            storage_url=None,
            search_driver=False,
            webhook_dispatch=False,
        )
        app = create_app(settings)
        try:
            return app.openapi()
        finally:
            app.state.db.engine.dispose()


def api_page(schema: dict[str, Any]) -> str:
    info = schema["info"]
    out = [
        "# API reference",
        "",
        f"{info.get('summary') or info['title']} — release {info['version']}. Generated from the app's",
        "OpenAPI schema when the site is built; the running API serves the same schema at",
        "`/openapi.json` and Swagger UI at `/docs`. The schema as a file: [openapi.json](openapi.json).",
        "How to use the endpoints, with examples: [Jobs over HTTP](../users/http-api.md).",
        "",
    ]
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, item in schema["paths"].items():
        for method in METHODS:
            if method in item:
                operation = item[method]
                tag = (operation.get("tags") or [_section(path)])[0]
                by_tag.setdefault(tag, []).append((method, path, operation))
    for tag, operations in by_tag.items():
        out += [f"## {tag}", ""]
        for method, path, operation in operations:
            out += _operation(method, path, operation)
    out += ["## Schemas", ""]
    for name, component in schema.get("components", {}).get("schemas", {}).items():
        out += _component(name, component)
    return "\n".join(out) + "\n"


def _section(path: str) -> str:
    """An untagged path's section: its first segment after /v1 (`/v1/jobs/{id}` → jobs)."""
    parts = [p for p in path.split("/") if p and p != "v1"]
    return parts[0] if parts else "root"


def _operation(method: str, path: str, operation: dict[str, Any]) -> list[str]:
    out = [f"### `{method.upper()} {path}`", ""]
    if operation.get("summary"):
        out += [f"**{_cell(operation['summary'])}**", ""]
    if operation.get("description"):
        out += [_text(operation["description"]), ""]
    parameters = operation.get("parameters", [])
    if parameters:
        out += ["| parameter | in | type | required | description |", "|---|---|---|---|---|"]
        for p in parameters:
            schema = p.get("schema", {})
            description = p.get("description") or schema.get("description", "")
            out.append(
                f"| `{p['name']}` | {p['in']} | {_type(schema)} | {'yes' if p.get('required') else 'no'} "
                f"| {_cell(description)} |"
            )
        out.append("")
    body = operation.get("requestBody")
    if body:
        kinds = ", ".join(
            f"`{kind}` {_type(c.get('schema', {}))}" for kind, c in body.get("content", {}).items()
        )
        out += [f"Body{' (required)' if body.get('required') else ''}: {kinds}", ""]
    responses = operation.get("responses", {})
    if responses:
        out += ["| status | answer |", "|---|---|"]
        for status, answer in responses.items():
            content = answer.get("content", {})
            shapes = ", ".join(_type(c.get("schema", {})) for c in content.values() if c.get("schema"))
            text = _cell(answer.get("description", ""))
            out.append(f"| {status} | {text}{' — ' + shapes if shapes else ''} |")
        out.append("")
    return out


def _component(name: str, component: dict[str, Any]) -> list[str]:
    out = [f"### {name}", ""]
    if component.get("description"):
        out += [_text(component["description"]), ""]
    properties = component.get("properties", {})
    if properties:
        required = set(component.get("required", []))
        out += ["| field | type | required | description |", "|---|---|---|---|"]
        for field, schema in properties.items():
            out.append(
                f"| `{field}` | {_type(schema)} | {'yes' if field in required else 'no'} "
                f"| {_cell(schema.get('description', ''))} |"
            )
        out.append("")
    elif "enum" in component:
        out += ["One of: " + ", ".join(f"`{v}`" for v in component["enum"]), ""]
    return out


def _type(schema: dict[str, Any]) -> str:
    """A schema in a few words: a link for a reference, the alternatives of anyOf/oneOf, arrays' items."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return f"[{name}](#{name.lower()})"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(_type(s) for s in schema[key])
    kind = schema.get("type")
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    return str(kind) if kind else "any"


def _cell(text: str) -> str:
    """Text in a table cell: one line, pipes escaped."""
    return _text(" ".join(str(text).split())).replace("|", "\\|")


def _text(text: str) -> str:
    """The schema's prose as Markdown shows it: `<owner>` outside code spans is text, not an HTML tag."""
    parts = CODE_SPAN.split(str(text).strip())
    return "".join(part if part.startswith("`") else html.escape(part, quote=False) for part in parts)
