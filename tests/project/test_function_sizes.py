"""No function of the training package runs over 80 lines, read from the source with ast (issue 36,
item 2).

worker/training/loop.py reads top to bottom in accelerate's nlp_example order because each part of a
run (the set-up, one epoch, an evaluation, the outputs) is a function with its name; `_train` grew
back to 126 lines once already, one `if` at a time. A function that passes the limit is a part that
wants a name of its own (and a value object, rather than more arguments, for what its parts share).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.kit import REPO

LIMIT = 80
TRAINING = REPO / "worker" / "training"


def long_functions(root: Path, limit: int = LIMIT) -> list[str]:
    """`path:line name (N lines)` for each function (nested ones too) over `limit` lines, counted from
    its `def` to its last line, docstring and comments included."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path
                    found.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_of_the_training_package_is_over_80_lines() -> None:
    assert long_functions(TRAINING) == [], (
        f"split these along the run's parts (set-up, one epoch, evaluation, outputs), at most {LIMIT} lines"
    )


def test_the_count_finds_a_long_function_and_a_long_nested_one(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(LIMIT - 1))
    (tmp_path / "fits.py").write_text(f"def fits():\n{body}")  # exactly LIMIT lines
    (tmp_path / "long.py").write_text(f"async def too_long():\n{body}    return 0\n")
    inner = "".join(f"        y{i} = {i}\n" for i in range(LIMIT))
    (tmp_path / "nested.py").write_text(f"def outer():\n    def inner():\n{inner}    return inner\n")
    assert long_functions(tmp_path) == [
        f"{tmp_path}/long.py:1 too_long ({LIMIT + 1} lines)",
        f"{tmp_path}/nested.py:1 outer ({LIMIT + 3} lines)",
        f"{tmp_path}/nested.py:2 inner ({LIMIT + 1} lines)",
    ]
