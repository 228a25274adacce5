"""What the job spec's server-side checks read of the settings, as protocols.

shared/core/config.py's `Settings` satisfies each; the spec's modules name these rather than `Settings`
so that the client's copy of them (gluejobs/_shared, hatch_build.py's closure) carries none of the
server's settings (tests/project/test_client_closure.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol


class DataFolderSetting(Protocol):
    @property
    def data_dir(self) -> Path:
        """GLUEJOBS_DATA_DIR: where a job's data files resolve."""
        ...


class ModelsFolderSetting(Protocol):
    @property
    def models_dir(self) -> Path:
        """GLUEJOBS_MODELS_DIR: the local model folders."""
        ...


class TrackersSetting(Protocol):
    @property
    def trackers(self) -> Sequence[str]:
        """GLUEJOBS_TRACKERS: the experiment trackers the workers serve."""
        ...
