"""The documentation site builds with warnings as errors, and says what the code has (issue 24, item 5).

`mkdocs build --strict` fails on a broken link, an anchor no page has, a page outside the nav, and a
failing hook; CI runs `make test` only, so the suite builds the site (into a temporary folder). The API
reference is generated from the app's OpenAPI schema by docs/hooks/openapi.py: every operation of the
schema must be on the page. The configuration page must name every setting `Settings` reads, and the
job-spec page every field of JobSpec.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from shared.core.config import Settings
from shared.jobspec.spec import JobSpec
from tests.support.kit import REPO

METHODS = ("get", "post", "put", "patch", "delete")


def test_the_site_builds_strict_with_the_api_reference_from_the_schema(tmp_path: Path) -> None:
    site = tmp_path / "site"
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ | {"NO_MKDOCS_2_WARNING": "1"},
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]

    schema = json.loads((site / "reference" / "openapi.json").read_text())
    page = (site / "reference" / "api" / "index.html").read_text()
    operations = [
        f"{method.upper()} {path}"
        for path, item in schema["paths"].items()
        for method in METHODS
        if method in item
    ]
    assert len(operations) > 40, operations  # the app's routes, not an empty schema
    missing = [op for op in operations if op not in page]
    assert not missing, f"operations of the schema missing from the API reference: {missing}"
    for name in schema["components"]["schemas"]:
        assert f'id="{name.lower()}"' in page, f"schema {name} has no section on the API reference"
    # The published site is the pages, not the hook's code.
    assert not (site / "hooks").exists()


def test_the_configuration_page_names_every_setting() -> None:
    page = (REPO / "docs" / "operators" / "configuration.md").read_text()
    missing = [
        f"GLUEJOBS_{name.upper()}"
        for name in Settings.model_fields
        if f"`GLUEJOBS_{name.upper()}`" not in page
    ]
    assert not missing, f"settings docs/operators/configuration.md does not name: {missing}"


def test_the_job_spec_page_names_every_spec_field() -> None:
    """A field added to JobSpec is documented in docs/users/job-spec.md (docs/contributing.md, "Add a
    spec field"): its name, or one of its aliases, in backticks."""
    page = (REPO / "docs" / "users" / "job-spec.md").read_text()
    missing = []
    for name, info in JobSpec.model_fields.items():
        choices = getattr(info.validation_alias, "choices", [])
        names = [name, *(choice for choice in choices if isinstance(choice, str))]
        if not any(f"`{each}`" in page for each in names):
            missing.append(name)
    assert len(JobSpec.model_fields) > 60  # the spec's fields, not an empty model
    assert not missing, f"spec fields docs/users/job-spec.md does not name: {missing}"
