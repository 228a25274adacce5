"""Models for a job: where they come from, LoRA through PEFT, and the optimizer's parameter groups."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from shared.config import Settings
from shared.errors import InvalidSpec, JobFailed, quote
from shared.spec import JobSpec, locate_model

logger = logging.getLogger(__name__)


class ModelError(JobFailed):
    """The model could not be loaded."""


def resolve_model(name_or_path: str, settings: Settings) -> str:
    """The absolute path of the model's folder: under GLUEJOBS_MODELS_DIR, or in the Hub's cache.

    The name goes through the API's own rule again (shared.spec.locate_model), since a worker must
    not trust a stored spec. transformers is only ever given an absolute path: handed a Hub id, it
    would first try a folder of that name relative to the worker's working directory.
    """
    try:
        source = locate_model(name_or_path, settings.models_dir)
    except InvalidSpec as exc:
        raise ModelError(exc.message) from exc
    if isinstance(source, Path):
        if not source.is_dir():
            raise ModelError(
                f"model folder {quote(name_or_path)} not found under GLUEJOBS_MODELS_DIR "
                f"({settings.models_dir})"
            )
        return str(source)
    return _hub_snapshot(source)


# What transformers reads from a model repository: configuration, tokenizer, weights. Hub repositories
# often hold the same weights in several formats (TensorFlow, Flax, ONNX …); only these are fetched.
_CONFIG_AND_TOKENIZER = ["*.json", "*.txt", "*.model", "*.tiktoken"]
_SAFETENSORS = ["model.safetensors", "model-*-of-*.safetensors"]
_PYTORCH_BIN = ["pytorch_model.bin", "pytorch_model-*-of-*.bin"]


def _hub_snapshot(repo_id: str) -> str:
    """The folder of a Hub model in the local Hub cache, downloaded into it when the Hub is reachable.

    huggingface_hub honours HF_HUB_OFFLINE (and HF_HOME / HF_HUB_CACHE): offline, a model that is
    not in the cache fails here instead of being looked for anywhere else.
    """
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=_CONFIG_AND_TOKENIZER + _SAFETENSORS))
        if not any(folder.glob("*.safetensors")):  # older repositories have PyTorch pickles only
            folder = Path(snapshot_download(repo_id, allow_patterns=_CONFIG_AND_TOKENIZER + _PYTORCH_BIN))
    except Exception as exc:  # huggingface_hub raises many types: offline, not found, gated, network …
        raise ModelError(
            f"model {quote(repo_id)} is neither a folder under GLUEJOBS_MODELS_DIR nor available from the "
            f"Hugging Face Hub or its local cache: {exc}"
        ) from exc
    return str(folder.resolve())


def load_tokenizer(model: str, spec: JobSpec) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(
            model, use_fast=not spec.use_slow_tokenizer, trust_remote_code=False
        )
    except Exception as exc:  # transformers raises many types here: OSError, ValueError, …
        raise ModelError(f"could not load the tokenizer of {model!r}: {exc}") from exc


def load_model(
    model: str,
    spec: JobSpec,
    *,
    num_labels: int,
    label_names: list[str] | None,
) -> PreTrainedModel:
    try:
        config = AutoConfig.from_pretrained(
            model, num_labels=num_labels, finetuning_task=spec.task_name, trust_remote_code=False
        )
    except Exception as exc:
        raise ModelError(f"could not load the configuration of {model!r}: {exc}") from exc
    if label_names is not None:
        config.label2id = {name: i for i, name in enumerate(label_names)}
        config.id2label = dict(enumerate(label_names))
    if spec.cls_dropout is not None:
        _set_classifier_dropout(config, spec.cls_dropout)
    try:
        loaded: PreTrainedModel = AutoModelForSequenceClassification.from_pretrained(
            model,
            config=config,
            ignore_mismatched_sizes=spec.ignore_mismatched_sizes,
            trust_remote_code=False,
            # Master weights in float32 whatever the checkpoint's dtype: mixed precision is Accelerate's job.
            dtype=torch.float32,
        )
    except Exception as exc:
        hint = ""
        if "ignore_mismatched_sizes" in str(exc):
            hint = (
                f" (its classification head does not have {num_labels} output(s); set ignore_mismatched_sizes"
                " to replace the head with a new one)"
            )
        raise ModelError(f"could not load model {model!r}: {exc}{hint}") from exc
    return loaded


def _set_classifier_dropout(config: PretrainedConfig, value: float) -> None:
    # Architectures name the classifier's dropout differently (BERT/RoBERTa, DeBERTa, DistilBERT).
    config.classifier_dropout = value
    for name in ("cls_dropout", "seq_classif_dropout"):
        if hasattr(config, name):
            setattr(config, name, value)


def apply_lora(model: PreTrainedModel, spec: JobSpec) -> nn.Module:
    """Wrap the model in LoRA adapters: the backbone is frozen, the adapters and classifier train."""
    from peft import LoraConfig, TaskType, get_peft_model

    # TaskType.SEQ_CLS makes PEFT keep the classification head trainable (modules_to_save).
    lora_config = LoraConfig(
        task_type=TaskType.SEQ_CLS,
        r=spec.lora_r,
        lora_alpha=spec.lora_alpha,  # type: ignore[arg-type]  # PEFT annotates int, scales by any number
        lora_dropout=spec.lora_dropout,
        target_modules=spec.lora_target_modules,
    )
    try:
        return get_peft_model(model, lora_config)
    except ValueError as exc:  # e.g. target modules that the model does not have
        raise ModelError(f"LoRA could not be applied: {exc}") from exc


def parameter_counts(model: nn.Module) -> dict[str, Any]:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return {
        "trainable_params": trainable,
        "total_params": total,
        "trainable_percent": round(100.0 * trainable / total, 4) if total else 0.0,
    }


def optimizer_parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two groups, as in the scripts: no weight decay on biases and normalisation weights.

    The scripts match names ("LayerNorm.weight"), which misses models that spell it otherwise;
    matching the modules' types, as transformers.Trainer does, catches them all.
    """
    no_decay = _no_decay_parameter_names(model)
    decay_params: list[nn.Parameter] = []
    no_decay_params: list[nn.Parameter] = []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (no_decay_params if name in no_decay else decay_params).append(param)
    return [
        {"params": decay_params, "weight_decay": weight_decay},
        {"params": no_decay_params, "weight_decay": 0.0},
    ]


def _no_decay_parameter_names(model: nn.Module) -> set[str]:
    names = set()
    for module_name, module in model.named_modules():
        is_norm = isinstance(module, nn.LayerNorm) or "norm" in type(module).__name__.lower()
        for param_name, _ in module.named_parameters(recurse=False):
            full = f"{module_name}.{param_name}" if module_name else param_name
            if is_norm or param_name == "bias":
                names.add(full)
    return names


def make_optimizer(model: nn.Module, spec: JobSpec) -> torch.optim.Optimizer:
    groups = optimizer_parameter_groups(model, spec.weight_decay)
    # The fused AdamW kernel does the same update in one pass over the parameters (faster on CPU and GPU).
    return torch.optim.AdamW(groups, lr=spec.learning_rate, fused=True)
