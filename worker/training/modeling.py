"""Models for a job: where they come from, the classifier's dropout, LoRA through PEFT, the optimizer."""

from __future__ import annotations

import functools
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

from shared.core.config import Settings
from shared.core.errors import InvalidSpec, JobFailed, quote
from shared.core.storage import open_store
from shared.jobspec.registered_models import RegisteredModel, is_registered
from shared.jobspec.spec import locate_model
from shared.model_folders.cache import cached_model
from worker.training.lora_sources import hub_revision, is_adapter, merged_adapter
from worker.training.model_manifest import write_model_manifest

logger = logging.getLogger(__name__)


class ModelError(JobFailed):
    """The model could not be loaded."""

    failure_code = "model_load_failed"  # the job's error_code (worker/fleet/outcome.py)


def resolve_model(
    name_or_path: str,
    settings: Settings,
    *,
    registered: RegisteredModel | None = None,
    revision: str | None = None,
) -> str:
    """The absolute path of the model's folder: this machine's copy of a registered model (fetched
    from the store by its hash, checked: shared/model_folders/cache.py), a LoRA job's adapter merged
    into its base (worker/training/lora_sources.py), under GLUEJOBS_MODELS_DIR, or in the Hub's cache (at
    `revision`, a commit, when given: a LoRA adapter's base).

    The name goes through the API's own rule again (shared.jobspec.spec.locate_model), since a worker must
    not trust a stored spec. transformers is only ever given an absolute path: handed a Hub id, it
    would first try a folder of that name relative to the worker's working directory.
    """
    if is_registered(name_or_path):
        if registered is None:
            raise ModelError(f"{quote(name_or_path)} names a stored model, but the job records none")
        try:
            folder = cached_model(open_store(settings), settings.cache_dir, registered.sha256)
        except FileNotFoundError as exc:
            what = "the model" if registered.job is not None else "the registered model"
            raise ModelError(
                f"{what} {quote(name_or_path)} ({registered.sha256[:12]}) is not in the store"
            ) from exc
        if is_adapter(registered):  # a LoRA job's adapter: merged into the base it names
            folder = merged_adapter(folder, registered, settings, resolve_model)
        return str(folder.resolve())
    try:
        source = locate_model(name_or_path, settings.models_dir)
    except InvalidSpec as exc:
        raise ModelError(exc.message) from exc
    if isinstance(source, Path):
        if not source.is_dir():
            raise ModelError(
                f"model folder {quote(name_or_path)} not found under GLUEJOBS_MODELS_DIR (on this worker)"
            )
        return str(source)
    return _hub_snapshot(source, revision)


# What transformers reads from a model repository: configuration, tokenizer, weights. Hub repositories
# often hold the same weights in several formats (TensorFlow, Flax, ONNX …); only these are fetched.
_CONFIG_AND_TOKENIZER = ["*.json", "*.txt", "*.model", "*.tiktoken"]
_SAFETENSORS = ["model.safetensors", "model-*-of-*.safetensors"]
_PYTORCH_BIN = ["pytorch_model.bin", "pytorch_model-*-of-*.bin"]


def _hub_snapshot(repo_id: str, revision: str | None = None) -> str:
    """The folder of a Hub model in the local Hub cache, downloaded into it when the Hub is reachable.

    huggingface_hub honours HF_HUB_OFFLINE (and HF_HOME / HF_HUB_CACHE): offline, a model that is
    not in the cache fails here instead of being looked for anywhere else.
    """
    from huggingface_hub import snapshot_download

    try:
        patterns = _CONFIG_AND_TOKENIZER + _SAFETENSORS
        folder = Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns))
        if not any(folder.glob("*.safetensors")):  # older repositories have PyTorch pickles only
            patterns = _CONFIG_AND_TOKENIZER + _PYTORCH_BIN
            folder = Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns))
    except Exception as exc:  # huggingface_hub raises many types: offline, not found, gated, network …
        raise ModelError(
            f"model {quote(repo_id)} is neither a folder under GLUEJOBS_MODELS_DIR nor available from the "
            f"Hugging Face Hub or its local cache: {exc}"
        ) from exc
    return str(folder.resolve())


def load_tokenizer(model: str, *, use_slow_tokenizer: bool = False) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(model, use_fast=not use_slow_tokenizer, trust_remote_code=False)
    except Exception as exc:  # transformers raises many types here: OSError, ValueError, …
        raise ModelError(f"could not load the tokenizer of {model!r}: {exc}") from exc


def load_model(
    model: str,
    *,
    num_labels: int,
    label_names: list[str] | None,
    task_name: str | None = None,
    cls_dropout: float | None = None,
    ignore_mismatched_sizes: bool = False,
) -> PreTrainedModel:
    try:
        config = AutoConfig.from_pretrained(
            model, num_labels=num_labels, finetuning_task=task_name, trust_remote_code=False
        )
    except Exception as exc:
        raise ModelError(f"could not load the configuration of {model!r}: {exc}") from exc
    if label_names is not None:
        config.label2id = {name: i for i, name in enumerate(label_names)}
        config.id2label = dict(enumerate(label_names))
    if cls_dropout is not None:
        _set_classifier_dropout_config(config, cls_dropout)
    try:
        loaded: PreTrainedModel = AutoModelForSequenceClassification.from_pretrained(
            model,
            config=config,
            ignore_mismatched_sizes=ignore_mismatched_sizes,
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
    if cls_dropout is not None:
        _set_classifier_dropout_modules(loaded, cls_dropout)
    # A Hub model's commit (its cache folder's name): what a LoRA adapter on it records (apply_lora).
    loaded.hub_revision = hub_revision(model)  # type: ignore[assignment]  # a plain attribute
    return loaded


def _set_classifier_dropout_config(config: PretrainedConfig, value: float) -> None:
    # Architectures read the classifier's dropout from differently named attributes: BERT and
    # RoBERTa `classifier_dropout`, DeBERTa v1/v2 `cls_dropout` (which their configs do not define,
    # so it must be set, not only updated), DistilBERT `seq_classif_dropout`. Setting all three
    # also records the value in the saved config.json, so a checkpoint reloads with it.
    config.classifier_dropout = value
    config.cls_dropout = value
    config.seq_classif_dropout = value


def _set_classifier_dropout_modules(model: PreTrainedModel, value: float) -> None:
    """Set, and so verify on the built model, the dropout before the classifier.

    The config attributes cover the architectures gluejobs knows; an architecture that reads
    another attribute still gets the value here. A model without any such dropout fails clearly
    rather than ignoring cls_dropout.
    """
    dropouts = classifier_dropouts(model)
    if not dropouts:
        raise ModelError(
            f"cls_dropout: a {type(model).__name__} has no dropout between its backbone and its classifier"
        )
    for dropout in dropouts:
        dropout.p = value


def classifier_dropouts(model: nn.Module) -> list[nn.Dropout]:
    """The Dropout modules of the classification head: outside the backbone, and not the pooler's
    own (DeBERTa's ContextPooler has `pooler_dropout`, which cls_dropout does not mean)."""
    return [
        module
        for name, module in head_modules(model).items()
        if isinstance(module, nn.Dropout) and "pooler" not in name
    ]


def head_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Every module outside the backbone (classifier, DeBERTa's pooler, dropouts), by qualified name."""
    backbone = getattr(model, "base_model_prefix", "")
    return {name: module for name, module in model.named_modules() if name and name.split(".")[0] != backbone}


def trainable_outside_backbone(model: nn.Module) -> list[str]:
    """The top-level modules outside the backbone that have weights: what LoRA leaves trainable."""
    backbone = getattr(model, "base_model_prefix", "")
    return [
        name
        for name, child in model.named_children()
        if name != backbone and any(True for _ in child.parameters())
    ]


def head_in_fp32(model: nn.Module) -> list[str]:
    """Run the classification head (and the backbone's pooler, BERT's) in fp32 under autocast; the
    names of the modules it changed.

    Autocast runs every Linear in bf16/fp16, so the logits would carry three significant digits and
    the pooled features' gradients as few; the head is a sliver of the model's FLOPs, so fp32 there
    costs nothing measurable. The loss (cross-entropy, MSE) is fp32 under autocast already; with
    fp32 logits it is computed from full-precision inputs too. Weights and optimizer state are fp32
    throughout (autocast casts copies)."""
    get_base_model = getattr(model, "get_base_model", None)  # PEFT: the model inside the adapters
    base: nn.Module = get_base_model() if callable(get_base_model) else model
    modules: dict[str, nn.Module] = {name: getattr(base, name) for name in trainable_outside_backbone(base)}
    prefix = getattr(base, "base_model_prefix", "")
    pooler = getattr(getattr(base, prefix, None), "pooler", None)
    if isinstance(pooler, nn.Module):
        modules[f"{prefix}.pooler"] = pooler
    for module in modules.values():
        module.forward = _without_autocast(module.forward)
    return sorted(modules)


def _without_autocast(forward: Any) -> Any:
    @functools.wraps(forward)
    def fp32_forward(*args: Any, **kwargs: Any) -> Any:
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        device_type = tensors[0].device.type if tensors else "cpu"
        with torch.autocast(device_type=device_type, enabled=False):
            return forward(*(_fp32(a) for a in args), **{k: _fp32(v) for k, v in kwargs.items()})

    return fp32_forward


def _fp32(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.float()
    return value


def apply_lora(
    model: PreTrainedModel,
    *,
    r: int,
    alpha: float,
    dropout: float = 0.0,
    target_modules: list[str] | None = None,
) -> nn.Module:
    """Wrap the model in LoRA adapters, as microsoft/LoRA's recipe trains it: the backbone is frozen
    and everything outside it trains, the classifier and (DeBERTa) the pooler; PEFT's SEQ_CLS task
    alone would keep only the classifier trainable. A base from the Hub: its commit (load_model's
    hub_revision) is the adapter's adapter_config.json `revision`, so that the adapter names the exact
    base (PEFT's AutoPeftModel loads that commit, and a job from this adapter too)."""
    from peft import LoraConfig, TaskType, get_peft_model

    lora_config = LoraConfig(
        task_type=TaskType.SEQ_CLS,
        r=r,
        lora_alpha=alpha,  # type: ignore[arg-type]  # PEFT annotates int, scales by any number
        lora_dropout=dropout,
        target_modules=target_modules,
        modules_to_save=trainable_outside_backbone(model),
        revision=getattr(model, "hub_revision", None),
    )
    try:
        return get_peft_model(model, lora_config)
    except ValueError as exc:  # e.g. target modules that the model does not have
        raise ModelError(f"LoRA could not be applied: {exc}") from exc


def parameter_counts(model: nn.Module) -> dict[str, Any]:
    """Trainable and total parameters, and the LoRA matrices' share (the figure the LoRA paper gives).

    Under PEFT, modules_to_save keep a frozen original beside their trained copy; the total counts
    each weight the model holds once per copy, as PEFT's own count does.
    """
    named = list(model.named_parameters())
    trainable = sum(p.numel() for _, p in named if p.requires_grad)
    total = sum(p.numel() for _, p in named)
    return {
        "trainable_params": trainable,
        "total_params": total,
        "trainable_percent": round(100.0 * trainable / total, 4) if total else 0.0,
        "lora_params": sum(p.numel() for name, p in named if "lora_" in name),
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


def make_optimizer(
    model: nn.Module,
    optim: str,
    *,
    learning_rate: float,
    weight_decay: float,
    betas: tuple[float, float],
    eps: float,
) -> torch.optim.Optimizer:
    """AdamW, as both scripts use it (Trainer's `adamw_torch` / `adamw_torch_fused`).

    The fused kernel does the same update in one pass over the parameters (faster on CPU and GPU).
    """
    if optim not in ("adamw_torch", "adamw_torch_fused"):
        raise JobFailed(
            f"optim {optim!r} is not available; use adamw_torch or adamw_torch_fused", field="optim"
        )
    groups = optimizer_parameter_groups(model, weight_decay)
    return torch.optim.AdamW(
        groups, lr=learning_rate, betas=betas, eps=eps, fused=optim == "adamw_torch_fused"
    )


# ---------------------------------------------------------------------------------------------------
# Model files: what a checkpoint folder holds of the model
# ---------------------------------------------------------------------------------------------------


def save_model_files(model: nn.Module, tokenizer: PreTrainedTokenizerBase, folder: Path) -> None:
    """`save_pretrained` files (a PEFT model writes its adapter, classifier and pooler included) and
    the tokenizer: a folder that `from_pretrained` (or PeftModel.from_pretrained) loads."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        # PEFT's default ("auto") saves the embedding matrices when the vocabulary was resized, which
        # gluejobs never does, and finds out by asking the Hub about the base model's name at every
        # save (the job's name for it, not a local path): no Hub round trip per checkpoint.
        model.save_pretrained(str(folder), is_main_process=True, save_embedding_layers=False)
    else:
        model.save_pretrained(str(folder), is_main_process=True)  # type: ignore[operator]
    tokenizer.save_pretrained(str(folder))
    write_model_manifest(folder)  # what job:ID and promote take from here, by hash


def load_model_files(model: nn.Module, folder: Path) -> None:
    """Load what `save_model_files` wrote into a model of the same build (resume, best model)."""
    from peft import PeftModel, set_peft_model_state_dict
    from safetensors.torch import load_file

    if isinstance(model, PeftModel):
        loaded: Any = set_peft_model_state_dict(model, load_file(folder / "adapter_model.safetensors"))
        if loaded.unexpected_keys:
            raise ModelError(
                f"the adapter in {folder.name} does not fit this model: {loaded.unexpected_keys[:3]}"
            )
        return
    single = folder / "model.safetensors"
    result: Any
    if single.is_file():
        result = model.load_state_dict(load_file(single), strict=False)
    else:  # a large model's shards
        from transformers.trainer_utils import load_sharded_checkpoint

        result = load_sharded_checkpoint(model, str(folder), strict=False)
    # save_pretrained writes a weight shared by two modules once; the other name comes back missing.
    shared = _shared_parameter_names(model)
    missing = [key for key in result.missing_keys if key not in shared]
    if missing or result.unexpected_keys:
        raise ModelError(
            f"the model in {folder.name} does not fit this model (missing {missing[:3]}, "
            f"unexpected {list(result.unexpected_keys)[:3]})"
        )


def _shared_parameter_names(model: nn.Module) -> set[str]:
    seen: dict[int, str] = {}
    shared: set[str] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            shared |= {name, seen[id(tensor)]}
        seen[id(tensor)] = name
    return shared
