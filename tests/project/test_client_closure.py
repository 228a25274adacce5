"""The client wheel carries no server settings: the shared/ modules it copies (hatch_build.py's
closure of what gluejobs/ imports) leave out shared.core.config, whose Settings read the API's keys,
the database URL and the rest of the server's environment; and the client imports nothing, anywhere,
that its wheel and its dependencies do not bring."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
import tomllib
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def _hatch_build() -> ModuleType:
    # hatch_build.py sits at the repository's root, outside every package: load it by its path.
    spec = importlib.util.spec_from_file_location("hatch_build", REPO / "hatch_build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_client_closure_leaves_out_the_server_settings() -> None:
    hatch_build = _hatch_build()
    closure = hatch_build.client_closure(REPO)
    assert "shared.jobspec.spec" in closure  # the closure that is read, not an empty one
    assert "shared.core.config" not in closure, (
        "a module the client wheel copies imports shared.core.config; have it take what it reads of the "
        "settings through shared/jobspec/settings_view.py's protocols"
    )
    sources = {name: hatch_build.module_file(REPO, name).read_text() for name in closure}
    reading_the_environment = [name for name, text in sources.items() if "pydantic_settings" in text]
    assert not reading_the_environment, (
        f"client modules that read the server's environment: {reading_the_environment}"
    )


def imported_roots(source: str) -> set[str]:
    """The top-level names `source`'s absolute imports reach ("service" of `from service.x import y`),
    those inside its functions too: a lazy import fails on a machine without the package all the same."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def client_requirements() -> set[str]:
    """What the client's own dependencies (pyproject.toml) are imported as."""
    named = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=\[ ;]", requirement)[0].lower().replace("-", "_") for requirement in named}
    return {"yaml" if name == "pyyaml" else name for name in names}


def test_the_client_imports_nothing_its_wheel_does_not_carry() -> None:
    """Everything gluejobs/ imports, inside functions too: the standard library, the client's
    dependencies, the client itself and the shared/ modules its wheel copies. Nothing of service/,
    worker/ or gluejobs_server/ (the server's commands are gluejobs-server's, found through its entry
    points), and no shared/ module of the database or the server's settings, even through those copies."""
    hatch_build = _hatch_build()
    closure = hatch_build.client_closure(REPO)
    allowed = set(sys.stdlib_module_names) | client_requirements() | {"gluejobs", "shared"}
    reached = {
        f"{path.relative_to(REPO)}: {root}"
        for path in (REPO / "gluejobs").rglob("*.py")
        for root in imported_roots(path.read_text())
        if root not in allowed
    }
    assert reached == set()
    server = {"service", "worker", "gluejobs_server"}
    copies_reach = {
        f"{name}: {root}"
        for name in closure
        for root in imported_roots(hatch_build.module_file(REPO, name).read_text()) & server
    }
    assert copies_reach == set()
    server_side = {"shared.core.config", "shared.core.db", "shared.core.tables", "shared.core.migrate"}
    assert closure.isdisjoint(server_side)
    assert client_requirements() >= {"httpx", "click", "yaml"}  # the list read, not an empty one


def test_the_import_check_sees_an_import_inside_a_function() -> None:
    source = "import os\n\ndef serve():\n    from service.server import main\n    import worker.fleet\n"
    assert imported_roots(source) == {"os", "service", "worker"}
