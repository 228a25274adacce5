"""What the observe tests share: a settings fixture with real GLUE rows, tiny specs, an SSE reader."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from shared.core.config import Settings

TINY_SPEC: dict[str, Any] = {
    "model_name_or_path": "tiny-bert",
    "task_name": "sst2",
    "max_train_samples": 64,
    "max_eval_samples": 32,
    "per_device_train_batch_size": 16,
    "per_device_eval_batch_size": 32,
    "learning_rate": 1e-3,
    "logging_steps": 1,
    "num_train_epochs": 2,
    "seed": 7,
}


def observe_settings(
    settings_factory: Any, tmp_path: Path, glue_data: Path, db_url: str, **extra: Any
) -> Settings:
    glue = tmp_path / "glue"
    glue.mkdir(exist_ok=True)
    if not (glue / "SST-2").exists():
        os.symlink(glue_data / "SST-2", glue / "SST-2")
    settings: Settings = settings_factory(db_url, glue_dir=glue, **extra)
    return settings


def broken_model(settings: Settings) -> str:
    """A model folder whose config cannot load: the job fails inside the training process."""
    folder = settings.models_dir / "broken-model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text('{"model_type": "bert", "hidden_size": "not a number"')
    return "broken-model"


@dataclass
class Sse:
    event: str
    data: Any
    id: str | None


def read_sse(response: httpx.Response, comments: list[str] | None = None) -> Iterator[Sse]:
    """Server-Sent Events off a streaming response, by the standard's field rules (test side)."""
    event, data, last_id = "message", [], None
    for line in response.iter_lines():
        if line.startswith(":"):
            if comments is not None:
                comments.append(line[1:].strip())
            continue
        if not line:
            if data:
                yield Sse(event, json.loads("\n".join(data)), last_id)
            event, data = "message", []
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id":
            last_id = value
