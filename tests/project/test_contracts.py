"""Every word that crosses a process boundary is written once: the job statuses, the webhook event
types and the column-mapping fields in shared/wire/vocabulary.py, the job folder's names in
shared/wire/job_folder.py, the row-id columns in shared/jobspec/column_mapping.py. A copy written out
elsewhere drifts the day one side changes, so these tests read the sources (Python with ast, the
dashboard's scripts as text) and fail on one, naming the file and line and the constant to import.

What counts as a copy: a literal tuple, list or set holding a whole set of these words (all three
finished statuses, all three mapping fields, `idx` with `id`), or one of the single words that only
mean the contract (an event type, `gluejobs_state.json`, the `.partial` suffix, the `checkpoint-`
prefix, an f-string that builds `checkpoint-<step>`). A word in prose (a docstring, a help text, a
comparison `status == "succeeded"`) is not a copy. The tests and the docs are left out: they spell
the words out on purpose, to hold the code to them.
"""

from __future__ import annotations

import ast
import re
import typing
from collections.abc import Iterator
from pathlib import Path

from shared.wire import job_folder, vocabulary
from tests.support.kit import REPO

PACKAGES = ("gluejobs", "gluejobs_server", "service", "worker", "shared")
WIRE = REPO / "shared" / "wire"
COLUMN_MAPPING = REPO / "shared" / "jobspec" / "column_mapping.py"
SCRIPTS = sorted((REPO / "service" / "static").glob("*.js"))  # the dashboard's own, not vendor/

TERMINAL = frozenset(status.value for status in vocabulary.TERMINAL_STATUSES)
EVENTS = frozenset({*vocabulary.EVENT_TYPES, vocabulary.TEST_EVENT})
FOLDER_WORDS = frozenset({job_folder.STATE_FILE, job_folder.CHECKPOINT_PREFIX})
# `.partial` is also every writer's own staging suffix (an upload, a cached model, the demo's folder):
# what must agree is how a checkpoint being written is recognised, so a test for it is the copy.
TESTS_OF_A_SUFFIX = frozenset({"endswith", "removesuffix"})
ROW_ID_PAIR = frozenset({"idx", "id"})
# A type checker reads a Literal's values only as written, so the API's schema spells the event types
# out once; the test below holds it equal to the vocabulary instead.
EVENT_TYPE_LITERAL = REPO / "service" / "schemas" / "webhooks.py"


def python_sources() -> Iterator[tuple[Path, ast.Module]]:
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if WIRE not in path.parents and "__pycache__" not in path.parts:
                yield path, ast.parse(path.read_text(), str(path))


def word_sets(tree: ast.Module) -> Iterator[tuple[int, frozenset[str]]]:
    """Each literal tuple, list or set of strings (a Literal[...]'s values are a tuple too)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            words = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if words:
                yield node.lineno, frozenset(words)


def words(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Each string constant, and each f-string's leading text (f"checkpoint-{step}" → checkpoint-);
    an f-string's other text is not a word of its own (f"{name}.{token}.partial" names a temporary
    file of its writer's, not a checkpoint being written)."""
    pieces = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in pieces:
            yield node.lineno, node.value
        elif isinstance(node, ast.JoinedStr) and len(node.values) > 1:
            first, then = node.values[0], node.values[1]
            if isinstance(first, ast.Constant) and isinstance(then, ast.FormattedValue):
                yield node.lineno, str(first.value)


def suffix_tests(tree: ast.Module, suffix: str) -> Iterator[int]:
    """Where `suffix` is tested for: `name.endswith(".partial")`, `.removesuffix(…)`, `== ".partial"`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            tested = node.args if node.func.attr in TESTS_OF_A_SUFFIX else []
        elif isinstance(node, ast.Compare):
            tested = [node.left, *node.comparators]
        else:
            continue
        if any(isinstance(arg, ast.Constant) and arg.value == suffix for arg in tested):
            yield node.lineno


def where(path: Path, line: int) -> str:
    return f"{path.relative_to(REPO)}:{line}"


def copies_of_word_sets(wanted: frozenset[str], *, home: Path | None = None) -> list[str]:
    return [
        where(path, line)
        for path, tree in python_sources()
        if path != home
        for line, found in word_sets(tree)
        if wanted <= found
    ]


def script_lists() -> Iterator[tuple[Path, int, frozenset[str]]]:
    """The dashboard scripts' array literals of strings (["succeeded", "failed", …])."""
    for path in SCRIPTS:
        text = path.read_text()
        for match in re.finditer(r"\[([^\[\]]*)\]", text):
            found = frozenset(re.findall(r"""["'`]([^"'`]+)["'`]""", match.group(1)))
            if found:
                yield path, text.count("\n", 0, match.start()) + 1, found


def test_the_finished_statuses_are_listed_only_in_the_vocabulary() -> None:
    copies = copies_of_word_sets(TERMINAL)
    copies += [where(path, line) for path, line, found in script_lists() if found >= TERMINAL]
    assert not copies, (
        f"the finished statuses {sorted(TERMINAL)} written out again at {copies}: import "
        "shared.wire.vocabulary's TERMINAL_STATUSES or JobStatus (the dashboard reads them from GET /wire.js)"
    )


def test_the_webhook_event_types_are_spelled_only_in_the_vocabulary() -> None:
    copies = [
        where(path, line)
        for path, tree in python_sources()
        if path != EVENT_TYPE_LITERAL
        for line, word in words(tree)
        if word in EVENTS
    ]
    copies += [
        f"{path.relative_to(REPO)} ({event})"
        for path in SCRIPTS
        for event in sorted(EVENTS)
        if re.search(rf"""["'`]{re.escape(event)}["'`]""", path.read_text())
    ]
    assert not copies, (
        f"webhook event types written out at {copies}: import them from shared.wire.vocabulary "
        "(EVENT_TYPES, JOB_EVENTS, TEST_EVENT and the names of each)"
    )


def test_the_api_schemas_event_type_literal_is_the_vocabularys() -> None:
    from service.schemas import webhooks

    assert EVENT_TYPE_LITERAL.samefile(webhooks.__file__)
    assert typing.get_args(webhooks.EventType) == vocabulary.EVENT_TYPES, (
        "service/schemas/webhooks.py's EventType lists other event types than shared/wire/vocabulary.py's "
        "EVENT_TYPES: make them the same, in the same order"
    )


def test_the_column_mapping_fields_are_listed_only_in_the_vocabulary() -> None:
    wanted = frozenset(vocabulary.COLUMN_FIELDS)
    copies = copies_of_word_sets(wanted)
    assert not copies, (
        f"the column-mapping fields written out again at {copies}: import COLUMN_FIELDS from "
        "shared.wire.vocabulary (or shared.jobspec.column_mapping, which re-exports it)"
    )


def test_the_job_folders_names_are_spelled_only_in_job_folder() -> None:
    copies = [
        f"{where(path, line)} ({word!r})"
        for path, tree in python_sources()
        for line, word in words(tree)
        if word in FOLDER_WORDS
    ]
    copies += [
        f"{where(path, line)} ({job_folder.PARTIAL_SUFFIX!r})"
        for path, tree in python_sources()
        for line in suffix_tests(tree, job_folder.PARTIAL_SUFFIX)
    ]
    copies += [
        f"{path.relative_to(REPO)} ({word!r})"
        for path in SCRIPTS
        for word in sorted(FOLDER_WORDS | {job_folder.PARTIAL_SUFFIX})
        if re.search(rf"""["'`]{re.escape(word)}(["'`]|\$\{{)""", path.read_text())
    ]
    assert not copies, (
        f"a job folder's names written out at {copies}: use shared/wire/job_folder.py "
        "(STATE_FILE, PARTIAL_SUFFIX, checkpoint_name, checkpoint_step, checkpoint_path …)"
    )


def test_the_row_id_columns_are_listed_once() -> None:
    copies = copies_of_word_sets(ROW_ID_PAIR, home=COLUMN_MAPPING)
    assert not copies, (
        f"row-id columns written out again at {copies}: import ROW_ID_COLUMNS from "
        "shared.jobspec.column_mapping, where both the reading rule and the guessed mapping take them"
    )


def test_the_scans_read_the_homes_they_leave_out() -> None:
    """The scans above find what they look for: run on the homes themselves, they find each set."""
    homes = {path: tree for path, tree in python_sources()}
    assert COLUMN_MAPPING in homes and EVENT_TYPE_LITERAL in homes and SCRIPTS
    row_ids = [found for _line, found in word_sets(homes[COLUMN_MAPPING]) if found >= ROW_ID_PAIR]
    assert row_ids, "the row-id set is no longer a literal in column_mapping.py: update this test"
    events = {word for _line, word in words(homes[EVENT_TYPE_LITERAL]) if word in EVENTS}
    assert events == set(vocabulary.EVENT_TYPES)
    folder = ast.parse((WIRE / "job_folder.py").read_text())
    assert {word for _line, word in words(folder)} >= FOLDER_WORDS
    reader = ast.parse('done = not name.endswith(".partial") and name != ".partial"')
    assert len(list(suffix_tests(reader, job_folder.PARTIAL_SUFFIX))) == 2
    wire_words = ast.parse((WIRE / "vocabulary.py").read_text())
    assert any(frozenset(vocabulary.COLUMN_FIELDS) <= found for _line, found in word_sets(wire_words))
