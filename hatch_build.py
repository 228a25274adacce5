"""Builds the client distribution, `gluejobs`: the gluejobs package, and a private copy of the few
modules of shared/ that its command line reads (the job spec, its tasks and names, the error words).

The client must not install a top-level `shared` (a generic name that collides with other projects),
and the repository keeps those modules in shared/, where the API and the workers import them as
`shared.…`. So the wheel carries them as gluejobs/_shared/, with their `shared.` imports, and the
client modules' ones, pointed there. Which modules: every shared module that the client's modules
import, and what those import in turn (the closure, found by reading the imports, those inside
functions too). The client holds nothing of the server: `gluejobs serve`, `worker`, `migrate` and
`demo` are gluejobs-server's (gluejobs_server/), and tests/project/test_imports.py keeps gluejobs/ off
service/ and worker/. In the repository and an editable install nothing is rewritten: `shared` is the
real one.
"""

from __future__ import annotations

import ast
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PRIVATE = "gluejobs._shared"
SKIPPED = {"__pycache__"}
SHARED_IMPORT = re.compile(r"^(\s*)(from|import) shared(\.| import )", re.MULTILINE)


def shared_imports(source: str, *, root: Path) -> set[str]:
    """The shared modules `source` imports ("shared.jobspec.spec"), inside its functions too.
    `from shared.jobspec import suggest` imports the module shared.jobspec.suggest, where one exists."""
    tree = ast.parse(source)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "shared" or node.module.startswith("shared."):
                for alias in node.names:
                    name = f"{node.module}.{alias.name}"
                    found.add(name if module_file(root, name).is_file() else node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("shared.")}
    return {name for name in found if name != "shared"}


def module_file(root: Path, module: str) -> Path:
    """shared.jobspec.spec -> shared/jobspec/spec.py; a package -> its __init__.py."""
    path = root.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def client_closure(root: Path) -> set[str]:
    """The shared modules the client's modules need, directly or through each other, and the
    subpackages (shared.jobspec) they sit in."""
    wanted: set[str] = set()
    for path in (root / "gluejobs").rglob("*.py"):  # its subpackages (gluejobs/cli/) too
        if "__pycache__" not in path.parts:
            wanted |= shared_imports(path.read_text(), root=root)
    closure: set[str] = set()
    while wanted:
        module = wanted.pop()
        if module not in closure:
            closure.add(module)
            parts = module.split(".")
            wanted |= {".".join(parts[:depth]) for depth in range(2, len(parts))}
            wanted |= shared_imports(module_file(root, module).read_text(), root=root)
    return closure


def point_at_private_copy(source: str) -> str:
    """`source` with its imports of shared/ (inside functions too) pointed at gluejobs._shared."""
    return SHARED_IMPORT.sub(rf"\1\2 {PRIVATE}\3", source)


class ClientWithPrivateSpec(BuildHookInterface):  # type: ignore[type-arg]
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if version == "editable" or self.target_name != "wheel":
            return  # an editable install imports the repository's shared/ itself
        root = Path(self.root)
        self._scratch = Path(tempfile.mkdtemp(prefix="gluejobs-build-"))
        include = build_data["force_include"]
        for path in sorted((root / "gluejobs").rglob("*")):
            relative = path.relative_to(root)
            if not path.is_file() or SKIPPED & set(relative.parts) or path.suffix == ".pyc":
                continue
            if path.suffix == ".py":
                text = point_at_private_copy(path.read_text())
                include[str(self._write(relative, text))] = relative.as_posix()
            else:
                include[str(path)] = relative.as_posix()
        private = Path(*PRIVATE.split("."))
        include[str(self._write(private / "__init__.py", '"""shared/ modules the client reads."""\n'))] = (
            f"{private.as_posix()}/__init__.py"
        )
        for module in sorted(client_closure(root)):
            source = module_file(root, module)
            target = private / source.relative_to(root / "shared")
            text = point_at_private_copy(source.read_text())
            include[str(self._write(target, text))] = target.as_posix()

    def _write(self, relative: Path, text: str) -> Path:
        path = self._scratch / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        scratch = getattr(self, "_scratch", None)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
