"""Models as the recipes build them: cls_dropout on the built classifier of every family the seeds
use, and LoRA as microsoft/LoRA trains it (backbone frozen, everything outside it trainable)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import (
    AutoModelForSequenceClassification,
    BertConfig,
    BertModel,
    DebertaConfig,
    DebertaModel,
    DebertaV2Config,
    DebertaV2Model,
    RobertaConfig,
    RobertaModel,
)

from tests.support.kit import TINY_DEBERTA_V2, TINY_MODEL, TINY_ROBERTA
from worker.training.modeling import ModelError, apply_lora, classifier_dropouts, load_model, parameter_counts

SMALL = {"vocab_size": 100, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2}
FAMILIES = {
    "bert": (BertConfig, BertModel),
    "roberta": (RobertaConfig, RobertaModel),
    "deberta": (DebertaConfig, DebertaModel),
    "deberta-v2": (DebertaV2Config, DebertaV2Model),
}


@pytest.fixture(scope="module")
def backbones(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tiny backbone of each family, saved as a pretrained checkpoint is (no head)."""
    root = tmp_path_factory.mktemp("families")
    folders = {}
    for name, (config_class, model_class) in FAMILIES.items():
        model_class(config_class(**SMALL, intermediate_size=32, hidden_dropout_prob=0.1)).save_pretrained(
            root / name
        )
        folders[name] = root / name
    return folders


@pytest.mark.parametrize("family", list(FAMILIES))
def test_cls_dropout_reaches_the_built_classifier(
    family: str, backbones: dict[str, Path], tmp_path: Path
) -> None:
    model = load_model(str(backbones[family]), num_labels=3, label_names=None, cls_dropout=0.37)

    head = classifier_dropouts(model)
    assert head, f"no classifier dropout found on {type(model).__name__}"
    assert [d.p for d in head] == [0.37] * len(head)
    # The backbone's own dropouts keep the config's hidden_dropout_prob.
    backbone = getattr(model, model.base_model_prefix)
    assert {m.p for m in backbone.modules() if isinstance(m, nn.Dropout)} <= {0.1, 0.0}
    # A checkpoint of the model rebuilds the same classifier: the value is in its config.json.
    model.save_pretrained(tmp_path / "saved")
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "saved")
    assert [d.p for d in classifier_dropouts(reloaded)] == [0.37] * len(head)


def test_without_cls_dropout_the_classifier_keeps_the_models_own(backbones: dict[str, Path]) -> None:
    model = load_model(str(backbones["deberta-v2"]), num_labels=2, label_names=None)

    assert [d.p for d in classifier_dropouts(model)] == [0.1]


def _lora_model(models_dir: Path, name: str, **options: object) -> nn.Module:
    model = load_model(str(models_dir / name), num_labels=3, label_names=None)
    return apply_lora(model, r=4, alpha=8, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "trained_outside"),
    [
        (TINY_MODEL, {"classifier"}),  # BERT's pooler is inside the backbone (bert.pooler): frozen
        (TINY_ROBERTA, {"classifier"}),
        (TINY_DEBERTA_V2, {"classifier", "pooler"}),  # DeBERTa's sits outside it: it trains
    ],
)
def test_lora_freezes_the_backbone_and_trains_everything_outside_it(
    models_dir: Path, name: str, trained_outside: set[str]
) -> None:
    model = _lora_model(models_dir, name)

    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    outside = {n for n in trainable if "lora_" not in n}
    # PEFT keeps a trainable copy of each module outside the backbone (modules_to_save).
    assert {n.split(".")[2] for n in outside} == trained_outside
    assert all(".modules_to_save." in n for n in outside)
    assert all(n.split(".")[-2] in ("lora_A", "lora_B") or ".default." in n for n in trainable - outside)
    backbone_prefix = model.base_model.model.base_model_prefix
    frozen = [n for n, p in model.named_parameters() if backbone_prefix in n and "lora_" not in n]
    assert frozen and not any(dict(model.named_parameters())[n].requires_grad for n in frozen)
    counts = parameter_counts(model)
    assert 0 < counts["lora_params"] < counts["trainable_params"] < counts["total_params"]


def test_roberta_base_lora_r8_on_query_and_value_has_the_papers_0_3m_parameters() -> None:
    # roberta-base's shape, built on the meta device: no download, no memory.
    config = RobertaConfig(
        vocab_size=50265,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        max_position_embeddings=514,
        type_vocab_size=1,
        num_labels=3,
    )
    with torch.device("meta"):
        model = AutoModelForSequenceClassification.from_config(config)

    counts = parameter_counts(apply_lora(model, r=8, alpha=16, target_modules=["query", "value"]))

    # 12 layers × 2 matrices × (A: 8×768 + B: 768×8) = 294,912: the LoRA paper's "0.3M" (Table 2).
    assert counts["lora_params"] == 12 * 2 * (8 * 768 + 768 * 8) == 294_912
    # Trainable beside them: the classification head (dense 768×768 + out_proj 768×3, with biases).
    assert counts["trainable_params"] == 294_912 + (768 * 768 + 768) + (768 * 3 + 3)


def test_cls_dropout_on_a_model_without_a_classifier_dropout_fails_clearly(tmp_path: Path) -> None:
    from transformers import GPT2Config, GPT2Model

    GPT2Model(GPT2Config(vocab_size=100, n_embd=16, n_layer=1, n_head=2, n_positions=32)).save_pretrained(
        tmp_path / "gpt2"
    )

    with pytest.raises(ModelError, match="cls_dropout: a GPT2ForSequenceClassification has no dropout"):
        load_model(str(tmp_path / "gpt2"), num_labels=2, label_names=None, cls_dropout=0.2)
