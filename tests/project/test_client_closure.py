"""The client wheel carries no server settings: the shared/ modules it copies (hatch_build.py's
closure of what gluejobs/ imports at module level) leave out shared.core.config, whose Settings read
the API's keys, the database URL and the rest of the server's environment."""

from __future__ import annotations

import importlib.util
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
