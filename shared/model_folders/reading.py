"""A local model folder read without torch: its config, tokenizer.json, weight files and their shapes.

The API uses it for the dry-run plan (tokenised lengths, a memory estimate); the worker's
reproducibility record uses `weight_files` to know what to hash. A registered model is read from
this machine's copy of its config and tokenizer files (shared/model_folders/cache.py): the API never
fetches its weights.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

from shared.core.config import Settings
from shared.core.errors import InvalidSpec
from shared.core.storage import open_store
from shared.jobspec.registered_models import is_registered
from shared.jobspec.spec import JobSpec, resolve_under
from shared.model_folders import model_size
from shared.model_folders.cache import cached_model

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".gguf")
SAFETENSORS_INDEX = "model.safetensors.index.json"
# A safetensors header is a JSON object after an 8-byte little-endian length; refuse absurd ones.
MAX_SAFETENSORS_HEADER_BYTES = 100 * 1024 * 1024


def api_model_folder(spec: JobSpec, settings: Settings) -> Path | None:
    """Where the API reads the spec's model from: its registered model's config and tokenizer
    (fetched into the cache), its folder under GLUEJOBS_MODELS_DIR, or None for a Hub id. For a LoRA
    job's adapter, its base's: the job's model is the adapter merged into it
    (worker/training/lora_sources.py),
    of the base's shape, with the base's tokenizer (the LoRA job saved that one beside the adapter)."""
    record, name = spec.registered_model, spec.model_name_or_path
    while record is not None and record.base_model_name_or_path is not None:
        name = record.base_model_name_or_path
        record = record.base_model
    if record is not None:
        return cached_model(open_store(settings), settings.cache_dir, record.sha256, tokenizer_only=True)
    return local_model_folder(name, settings)


def local_model_folder(name_or_path: str, settings: Settings) -> Path | None:
    """The model's folder under GLUEJOBS_MODELS_DIR, or None for a Hub id (worker.training.modeling's rule)
    and for a registered model."""
    if is_registered(name_or_path):
        return None
    try:
        folder = resolve_under(settings.models_dir, name_or_path, field="model_name_or_path")
    except InvalidSpec:
        return None
    return folder if folder.is_dir() else None


def read_config(folder: Path) -> dict[str, Any] | None:
    """The folder's config.json, read no further than its cap (shared/model_folders/model_size.py)."""
    return model_size.read_config(folder / "config.json")


def weight_files(folder: Path) -> list[Path]:
    """The files that hold weights (and the index of sharded ones), sorted."""
    return sorted(
        p
        for p in folder.iterdir()
        if p.is_file() and (p.name.endswith(WEIGHT_SUFFIXES) or p.name.endswith(".index.json"))
    )


def safetensors_shapes(folder: Path) -> dict[str, list[int]] | None:
    """Every tensor's shape, read from the safetensors headers alone (no weights are loaded); None
    when the weights are not (all) in safetensors files."""
    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        files = [folder / name for name in names]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    shapes: dict[str, list[int]] = {}
    for path in files:
        header = _safetensors_header(path)
        if header is None:
            return None
        for name, entry in header.items():
            if name != "__metadata__" and isinstance(entry, dict) and isinstance(entry.get("shape"), list):
                shapes[name] = [int(d) for d in entry["shape"]]
    return shapes


def _safetensors_header(path: Path) -> dict[str, Any] | None:
    # The format's documented layout (huggingface/safetensors README): u64 header size, JSON header.
    try:
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > MAX_SAFETENSORS_HEADER_BYTES:
                return None
            header = json.loads(f.read(size))
    except (OSError, ValueError, struct.error):
        return None
    return header if isinstance(header, dict) else None


def count(shapes: dict[str, list[int]]) -> int:
    return sum(math.prod(shape) for shape in shapes.values())
