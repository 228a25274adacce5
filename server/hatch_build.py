"""Puts the server's sources into gluejobs-server's wheel and sdist.

They live in the repository's top-level folders, one level above this project: gluejobs_server/ (the
`gluejobs` command's serve, worker, migrate and demo), service/, shared/, worker/, and alembic/ (the
migrations), which is installed as shared/migrations because a top-level `alembic` folder would shadow
the alembic package. Inside an sdist they sit beside this file instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

# folder in the repository → where it goes in the distribution
SOURCES = {
    "gluejobs_server": "gluejobs_server",
    "service": "service",
    "shared": "shared",
    "worker": "worker",
    "alembic": "shared/migrations",
}
SKIPPED = {"__pycache__", ".mypy_cache", ".pytest_cache"}


class ServerSources(BuildHookInterface):  # type: ignore[type-arg]
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if version == "editable":
            return  # the editable wheel puts the repository on sys.path (dev-mode-dirs)
        here = Path(self.root)
        # In the repository each folder is one level up; an unpacked sdist has them beside this
        # file, already at their paths in the wheel.
        in_sdist = (here / "PKG-INFO").is_file()
        for folder, target in SOURCES.items():
            source = here / target if in_sdist else here.parent / folder
            if not source.is_dir():
                raise FileNotFoundError(f"gluejobs-server is built from the gluejobs repository: no {source}")
            for path in sorted(source.rglob("*")):
                relative = path.relative_to(source)
                if path.is_file() and not SKIPPED & set(relative.parts) and path.suffix != ".pyc":
                    build_data["force_include"][str(path)] = f"{target}/{relative.as_posix()}"
