"""The import graph, read from the source with ast: no two modules import each other (directly or
round a longer circle), the layers point down only, and no test module imports another.

Every import statement counts, those inside functions too: a lazy import that closes a circle still
makes two modules that cannot be read, or changed, apart. A package's own __init__ is not an edge of
its modules (Python imports it first; that is not a circle of the code's making).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.kit import REPO

PACKAGES = ("gluejobs", "gluejobs_server", "service", "worker", "shared", "bench", "tests")
# Which of the project's layers each may import (README: service/ never imports torch; service/
# and worker/ never import each other; shared/ imports neither; gluejobs/, the client, reads only the
# shared/ modules its wheel carries (test_the_client_imports_only_what_its_wheel_carries); the
# server's commands, gluejobs_server/, sit on top of all, imported by nothing shipped; the tests'
# support serves bench/, never the reverse, and no shipped package imports either).
MAY_IMPORT = {
    "shared": {"shared"},
    "service": {"shared", "service"},
    "worker": {"shared", "worker"},
    "gluejobs": {"gluejobs", "shared"},
    "gluejobs_server": {"gluejobs_server", "gluejobs", "shared", "service", "worker"},
    "tests": {"gluejobs", "gluejobs_server", "shared", "service", "worker", "tests"},
}


# shared/'s subpackages, lowest first: each may import those below it, never one above (the
# exceptions below say why they stand; one added needs its reason here).
SHARED_LAYERS = (
    # what crosses a process boundary: the job folder's layout, statuses, event types (stdlib only;
    # the client wheel carries it, and every layer above reads it)
    "wire",
    "core",  # settings, database, tables, errors, the store, owners, the release
    "jobspec",  # what a job asks for; the client's command line reads it (torch-free, no database)
    "data",  # reading a job's data files
    "model_folders",  # reading, registering and caching model folders
    "admission",  # the checks a job passes before it is stored
    "scheduling",  # fair share, quotas, why a job waits
    "jobs_repo",  # every write of jobs, sweeps, files, models, workers
    "research",  # sweeps and their statistics, GLUE submission files
    "webhooks",  # endpoints, deliveries, the events a change records (a sweep's with its status)
    "searches",  # hyperparameter searches, driven over jobs, sweeps' checks and webhooks
)
UPWARD_ARROWS = {
    # A job's and a sweep's state change records its webhook event in the same transaction
    # (jobs_repo.events and .reports write webhooks.events' rows).
    ("jobs_repo", "webhooks"),
}


def project_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `name` imports (anywhere in its file)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from a import b` imports the module a.b when there is one, else a name of a.
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]  # `import a.b.c` of a package: its deepest module
            if target and target != name and not name.startswith(f"{target}."):
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_round_a_circle() -> None:
    assert circles(import_graph()) == []


def test_the_check_finds_a_circle_and_follows_relative_and_lazy_imports(tmp_path: Path) -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    modules = {"pkg": tmp_path / "pkg" / "__init__.py", "pkg.one": tmp_path / "pkg" / "one.py"}
    modules["pkg.two"] = tmp_path / "pkg" / "two.py"
    modules["pkg.one"].parent.mkdir()
    modules["pkg.one"].write_text("def later():\n    from . import two\n")
    modules["pkg.two"].write_text("from pkg.one import later\nimport pkg\n")
    assert imports_of("pkg.one", modules["pkg.one"], modules) == {"pkg.two"}
    assert imports_of("pkg.two", modules["pkg.two"], modules) == {"pkg.one"}  # not its own package


def test_the_layers_import_only_downwards() -> None:
    wrong = {
        (name, target)
        for name, targets in import_graph().items()
        for target in targets
        if (layer := name.split(".")[0]) in MAY_IMPORT and target.split(".")[0] not in MAY_IMPORT[layer]
    }
    assert wrong == set()


def test_no_test_module_imports_another() -> None:
    """Test modules share fixtures through conftest.py and helpers through helper modules
    (tests/support/: e2e.py, kit.py, runs.py …): a test module imported elsewhere would run its
    tests, and collect its fixtures, twice."""
    graph = import_graph()
    test_modules = {
        name for name in graph if name.split(".")[-1].startswith("test_") or name == "tests.conftest"
    }
    assert {(name, target) for name in graph for target in graph[name] if target in test_modules} == set()


def shared_arrows() -> dict[tuple[str, str], set[str]]:
    """(importing subpackage, imported subpackage) -> the module imports that make the arrow."""
    arrows: dict[tuple[str, str], set[str]] = {}
    for name, targets in import_graph().items():
        for target in targets:
            if name.startswith("shared.") and target.startswith("shared."):
                pair = (name.split(".")[1], target.split(".")[1])
                if pair[0] != pair[1]:
                    arrows.setdefault(pair, set()).add(f"{name} -> {target}")
    return arrows


def test_shared_holds_only_its_subpackages_and_they_import_downwards() -> None:
    """shared/ is its subpackages (a module beside them says nothing about what it holds), and
    each imports only those below it in SHARED_LAYERS, but for the UPWARD_ARROWS named there."""
    beside = sorted(path.name for path in (REPO / "shared").glob("*.py") if path.name != "__init__.py")
    assert beside == []
    packages = {path.parent.name for path in (REPO / "shared").glob("*/__init__.py")}
    assert packages == set(SHARED_LAYERS)
    rank = {package: level for level, package in enumerate(SHARED_LAYERS)}
    arrows = shared_arrows()
    upward = {pair: sorted(why) for pair, why in arrows.items() if rank[pair[1]] > rank[pair[0]]}
    assert {pair: why for pair, why in upward.items() if pair not in UPWARD_ARROWS} == {}
    assert upward.keys() >= UPWARD_ARROWS  # an exception no longer needed is struck from the list


# What the training loop may not reach: the fleet (it is launched by it, never the reverse) and the
# database, however imported (the tables' module is SQLAlchemy's; the repository writes rows).
TRAINING_MAY_NOT_IMPORT = ("worker.fleet", "shared.jobs_repo", "shared.core.db", "shared.core.tables")


def test_training_imports_nothing_of_the_fleet_or_the_database() -> None:
    graph = import_graph()
    wrong = {
        (name, target)
        for name, targets in graph.items()
        if name.startswith("worker.training")
        for target in targets
        if target.startswith(TRAINING_MAY_NOT_IMPORT)
    }
    assert wrong == set()
    third_party = {
        f"{path.relative_to(REPO)}: {alias.name}"
        for path in (REPO / "worker" / "training").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
        if alias.name.split(".")[0] in ("sqlalchemy", "psycopg", "alembic")
    }
    assert third_party == set()


def test_worker_is_the_fleet_and_training() -> None:
    beside = sorted(path.name for path in (REPO / "worker").glob("*.py"))
    assert beside == ["__init__.py", "__main__.py"]
    assert {path.parent.name for path in (REPO / "worker").glob("*/__init__.py")} == {"fleet", "training"}


def test_each_subpackage_says_what_it_owns() -> None:
    inits = [*(REPO / "shared").glob("*/__init__.py"), *(REPO / "service").glob("*/__init__.py")]
    for init in [*inits, *(REPO / "worker").glob("*/__init__.py")]:
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.split()) >= 8, f"{init.relative_to(REPO)}: a docstring saying what it owns"


def test_the_tests_are_laid_out_like_the_code() -> None:
    """A test module sits in the folder of the package it tests (client/, service/, worker/, shared/),
    or end_to_end/ when it drives them all, or project/ when it reads the repository as a whole; the
    helpers they share are in support/, and nothing else sits beside conftest.py."""
    tests = REPO / "tests"
    assert sorted(path.name for path in tests.glob("*.py")) == ["__init__.py", "conftest.py"]
    folders = {path.parent.name for path in tests.glob("*/__init__.py")}
    assert folders == {"client", "service", "worker", "shared", "end_to_end", "project", "support"}
    helpers_outside = sorted(
        str(path.relative_to(tests))
        for path in tests.glob("*/*.py")
        if path.parent.name != "support" and path.name != "__init__.py" and not path.name.startswith("test_")
    )
    assert helpers_outside == []
    assert not list((tests / "support").glob("test_*.py"))
