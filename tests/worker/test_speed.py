"""The fast path's switch, sorted evaluation and the throughput accounting (issue 10).

Timings belong in bench/speed_bench.py; these pin what the figures mean and what the switch sets.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import datasets
import numpy as np
import pandas as pd
import pytest
import torch
from fastapi.testclient import TestClient
from pydantic import ValidationError

from gluejobs.cli import main
from service.main import create_app
from shared.core.config import Settings
from shared.core.db import Database
from shared.core.errors import JobFailed
from shared.jobspec.spec import FAST_SETTINGS, JobSpec
from tests.support.e2e import LOOPBACK_URL
from tests.support.runs import RecordingReporter, make_spec
from worker.training import fast_dropout, precision, throughput
from worker.training.batches import pad_multiple
from worker.training.data import in_row_order, longest_first, row_lengths
from worker.training.loop import run_training
from worker.training.modeling import head_in_fp32, load_model

BASE = {"model_name_or_path": "tiny-bert", "task_name": "sst2"}


# --- the switch ---------------------------------------------------------------------------------------


def test_fast_fills_in_the_documented_settings_and_given_values_win() -> None:
    spec = JobSpec.model_validate({**BASE, "fast": True})
    assert {key: getattr(spec, key) for key in FAST_SETTINGS} == FAST_SETTINGS
    assert FAST_SETTINGS == {
        "group_by_length": True,
        "shuffle_length_groups": True,
        "bf16": True,
        "group_eval_by_length": True,
        "per_device_eval_batch_size": 64,
        "optim": "adamw_torch_fused",
        "freeze_word_embeddings": True,
        "fast_dropout": True,
    }
    # What is stored validates to itself (every value is explicit now).
    assert JobSpec.model_validate(spec.model_dump(mode="json")) == spec

    given = JobSpec.model_validate(
        {**BASE, "fast": "true", "group_by_length": False, "per_device_eval_batch_size": 8}
    )
    assert (given.group_by_length, given.per_device_eval_batch_size, given.bf16) == (False, 8, True)
    assert not given.shuffle_length_groups  # nothing to shuffle without length groups
    # fp16 asked for: fast keeps it rather than adding a second mixed precision.
    assert JobSpec.model_validate({**BASE, "fast": True, "fp16": True}).mixed_precision == "fp16"
    # Without the switch nothing changes: the faithful spec.
    plain = JobSpec.model_validate(BASE)
    assert (plain.group_by_length, plain.bf16, plain.group_eval_by_length, plain.fast) == (
        False,
        False,
        False,
        False,
    )
    assert not plain.freeze_word_embeddings and not plain.fast_dropout
    # Each lever can be left out of the fast path by name.
    levers_off = {"freeze_word_embeddings": False, "fast_dropout": False}
    kept = JobSpec.model_validate({**BASE, "fast": True, **levers_off})
    assert (kept.freeze_word_embeddings, kept.fast_dropout, kept.group_by_length) == (False, False, True)


def test_the_api_stores_what_fast_set(settings: Settings, db: Database) -> None:
    client = TestClient(create_app(settings, db), base_url=LOOPBACK_URL)
    response = client.post("/v1/jobs", json={"spec": {**BASE, "fast": True}})
    assert response.status_code == 201, response.text
    stored = client.get(f"/v1/jobs/{response.json()['id']}").json()["spec"]
    assert stored["fast"] is True
    assert {key: stored[key] for key in FAST_SETTINGS} == FAST_SETTINGS


def test_cli_submit_fast_dry_run_prints_the_resolved_spec(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["submit", "--url", "http://127.0.0.1:9", "--fast", "--dry-run", "--model_name_or_path", "m"]
    code = main([*argv, "--task_name", "sst2", "--per_device_eval_batch_size", "16"])
    out, err = capsys.readouterr()
    assert code == 0, err
    spec = json.loads(out)
    assert spec["fast"] is True
    assert {key: spec[key] for key in FAST_SETTINGS} == {**FAST_SETTINGS, "per_device_eval_batch_size": 16}


# --- sorted evaluation ----------------------------------------------------------------------------------


def test_longest_first_and_back() -> None:
    rows = datasets.Dataset.from_dict({"input_ids": [[1], [1, 2, 3], [1, 2], [4, 5, 6], [7]]})
    ordered, order = longest_first(rows)
    assert order.tolist() == [1, 3, 2, 0, 4]  # longest first, ties in row order
    assert row_lengths(ordered).tolist() == [3, 3, 2, 1, 1]
    # A `select`ed dataset's lengths follow its own rows.
    assert row_lengths(rows.select([4, 1])).tolist() == [1, 3]
    values = torch.tensor([10.0, 30.0, 20.0, 0.0, 40.0])  # computed on the sorted rows
    assert in_row_order(values, order).tolist() == [0.0, 10.0, 20.0, 30.0, 40.0]
    with pytest.raises(ValueError, match="4 results for 5 rows"):
        in_row_order(values[:4], order)


def test_sorted_evaluation_gives_the_unsorted_metrics_and_predictions(
    train_settings: Settings, tmp_path: Path, minilm_path: Path
) -> None:
    # STS-B (regression): every row's prediction is its own score, so a row put back in the wrong
    # place shows in the prediction file. The test file: 48 real dev pairs of many lengths. MiniLM,
    # because a tiny random model gives every row the same score.
    models = tmp_path / "models"
    shutil.copytree(minilm_path, models / "minilm")
    train_settings = train_settings.model_copy(update={"models_dir": models})
    dev = (train_settings.glue_dir / "STS-B" / "dev.tsv").read_text().splitlines()[1:49]  # type: ignore[operator]
    pairs = [line.split("\t")[7:9] for line in dev]
    (train_settings.data_dir / "stsb").mkdir(parents=True)
    pd.DataFrame(pairs, columns=["sentence1", "sentence2"]).to_csv(
        train_settings.data_dir / "stsb" / "test.csv", index=False
    )
    runs = {}
    for sorted_eval in (False, True):
        spec = make_spec(
            model_name_or_path="minilm",
            task_name="stsb",
            max_train_samples=8,  # one step of 8: the evaluations, not the training, are compared
            group_eval_by_length=sorted_eval,
            test_file="stsb/test.csv",
            max_eval_samples=32,
            per_device_eval_batch_size=8,
            eval_strategy="steps",
            eval_steps=1,
        )
        reporter = RecordingReporter()
        out = tmp_path / f"sorted-{sorted_eval}"
        result = run_training(spec, train_settings, output_dir=out, reporter=reporter)
        runs[sorted_eval] = (reporter, result, (out / "predict_results.tsv").read_text())
    (plain, _, plain_predictions), (ordered, ordered_result, ordered_predictions) = runs[False], runs[True]
    evals = [(step, name) for step, _, split, name, _ in plain.rows if split == "eval"]
    assert evals == [(step, name) for step, _, split, name, _ in ordered.rows if split == "eval"]
    names = {"pearson", "spearmanr", "combined_score", "loss"}
    assert {name for _, name in evals} == names and len(evals) == len(names)  # at step 1
    for name in names:
        # Other batches pad differently, which moves fp32 rounding in the last bits only.
        expected = [value for _, value in plain.values("eval", name)]
        assert [value for _, value in ordered.values("eval", name)] == pytest.approx(
            expected, rel=1e-5, abs=1e-5
        )
    assert ordered_predictions == plain_predictions
    scores = [line.split("\t")[1] for line in plain_predictions.splitlines()[1:]]
    assert len(scores) == 48 and len(set(scores)) > 24  # scores of their own rows, not one answer
    assert ordered_result["eval_runtime_s"] > 0
    assert any("evaluated in" in line for line in ordered.logs)


# --- throughput accounting ------------------------------------------------------------------------------


def test_result_accounts_for_tokens_and_flops(
    train_settings: Settings, tmp_path: Path, minilm_path: Path
) -> None:
    spec = make_spec(max_train_samples=48, num_train_epochs=2, max_length=32, eval_strategy="no")
    settings = train_settings.model_copy(update={"peak_flops": 1e12})
    result = run_training(spec, settings, output_dir=tmp_path / "run", reporter=RecordingReporter())

    # The real tokens, counted independently: SST-2's first 48 train rows, tokenised as the job does.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    sentences = [
        line.split("\t")[0]
        for line in (train_settings.glue_dir / "SST-2" / "train.tsv").read_text().splitlines()[1:49]
    ]  # type: ignore[operator]
    lengths = np.array(
        [len(ids) for ids in tokenizer(sentences, truncation=True, max_length=32)["input_ids"]]
    )
    assert result["real_tokens"] == 2 * lengths.sum()
    assert lengths.sum() * 2 <= result["padded_tokens"] <= 2 * 48 * 32
    assert result["padding_efficiency"] == pytest.approx(
        result["real_tokens"] / result["padded_tokens"], abs=1e-4
    )
    assert 0 < result["padding_efficiency"] <= 1
    seconds = result["train_runtime_s"]
    assert result["real_tokens_per_second"] == pytest.approx(result["real_tokens"] / seconds, rel=0.01)
    assert result["padded_tokens_per_second"] >= result["real_tokens_per_second"]
    assert result["train_cpu_s"] > 0
    assert result["train_samples_per_cpu_second"] == pytest.approx(96 / result["train_cpu_s"], rel=0.01)

    # FLOPs: 6·N per token (everything trains) plus attention's 12·layers·hidden·S² per sequence.
    model = load_model(str(train_settings.models_dir / "tiny-bert"), num_labels=2, label_names=None)
    weights = sum(
        p.numel() for name, p in model.named_parameters() if p.dim() >= 2 and "embeddings" not in name
    )
    config = model.config
    expected = (
        6 * weights * result["real_tokens"]
        + 12 * config.num_hidden_layers * config.hidden_size * 2 * (lengths**2).sum()
    )
    assert result["model_flops"] == pytest.approx(expected)
    assert result["hardware_flops"] >= result["model_flops"]
    assert (result["peak_flops"], result["peak_flops_source"]) == (1e12, "GLUEJOBS_PEAK_FLOPS")
    assert result["mfu"] == pytest.approx(result["model_flops"] / seconds / 1e12, rel=0.01)
    assert 0 < result["mfu"] <= result["hfu"] < 1


def test_peak_flops_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    peak, source = throughput.peak_flops(torch.device("cpu"), "no", None)
    assert peak is not None and peak > 1e8 and source.startswith("measured: best of 5 1024×1024 float32")
    assert throughput.peak_flops(torch.device("cpu"), "bf16", 5e11) == (5e11, "GLUEJOBS_PEAK_FLOPS")
    monkeypatch.setattr(throughput, "cpu_has_native_bf16", lambda: False)
    peak, source = throughput.peak_flops(torch.device("cpu"), "bf16", None)
    assert source.startswith("measured: best of 5 1024×1024 float32") and source.endswith("instructions)")
    names = [name for name, _, _ in throughput.GPU_PEAK_FLOPS]
    # First match wins, so no name may come after a shorter one it contains.
    for i, name in enumerate(names):
        assert not any(earlier in name for earlier in names[:i]), name


def test_lora_counts_weight_gradients_of_trained_weights_only(train_settings: Settings) -> None:
    from worker.training.modeling import apply_lora

    model = load_model(str(train_settings.models_dir / "tiny-bert"), num_labels=2, label_names=None)
    total, trainable = throughput.matmul_parameters(model)
    assert total == trainable
    adapted = apply_lora(model, r=4, alpha=8)
    total_lora, trainable_lora = throughput.matmul_parameters(adapted)
    assert trainable_lora < total_lora


# --- bf16: the head in fp32 ------------------------------------------------------------------------------


def test_pads_to_a_multiple_of_8_only_on_cuda() -> None:
    from accelerate import Accelerator

    assert pad_multiple(Accelerator(mixed_precision="bf16", cpu=True)) is None

    # A CUDA accelerator cannot be made on a machine without a GPU: a stand-in with the two things
    # pad_multiple reads (its precision, its device) plays one.
    def on_cuda(mixed_precision: str) -> Any:
        return SimpleNamespace(mixed_precision=mixed_precision, device=torch.device("cuda", 0))

    assert pad_multiple(on_cuda("bf16")) == 8
    assert pad_multiple(on_cuda("fp16")) == 8
    assert pad_multiple(on_cuda("no")) is None  # fp32 matmuls gain nothing from it


def test_head_runs_in_fp32_under_autocast(train_settings: Settings) -> None:
    model = load_model(str(train_settings.models_dir / "tiny-bert"), num_labels=2, label_names=None)
    ids = torch.tensor([[101, 2023, 2003, 102, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(input_ids=ids, attention_mask=mask).logits.dtype == torch.bfloat16
    assert head_in_fp32(model) == ["bert.pooler", "classifier"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(input_ids=ids, attention_mask=mask, labels=torch.tensor([1]))
    assert out.logits.dtype == torch.float32 and out.loss.dtype == torch.float32
    # The backbone still runs in bf16, and the weights stay fp32.
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_bf16_job_on_cpu_pads_to_no_multiple_and_reports_its_fp32_modules(
    train_settings: Settings, tmp_path: Path
) -> None:
    spec = make_spec(bf16=True, group_by_length=True, max_train_samples=32, max_eval_samples=16)
    reporter = RecordingReporter()
    result = run_training(spec, train_settings, output_dir=tmp_path / "run", reporter=reporter)
    assert result["mixed_precision"] == "bf16"  # asked for without fast: honoured on any CPU
    assert any("in fp32: bert.pooler, classifier" in line for line in reporter.logs)
    # The bf16 rate where the CPU has bf16 instructions; else fp32's (emulated bf16 is no peak).
    source = result["peak_flops_source"]
    native = precision.cpu_has_native_bf16()
    assert source.startswith("measured") and ("bfloat16" in source) == native, source
    assert source.endswith("(this CPU has no bf16 instructions)") != native, source
    assert result["final_metrics"]["accuracy"] >= 0


# --- bf16 where the device has it ------------------------------------------------------------------------


@pytest.mark.parametrize("native", [True, False], ids=["bf16-cpu", "avx2-cpu"])
def test_a_fast_job_trains_in_bf16_only_on_a_cpu_with_bf16_instructions(
    native: bool, train_settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Emulated bf16 took 24x as long as fp32 on an AVX2 CPU (worker/training/precision.py): the fast path
    would have been the slow one there."""
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: native)
    monkeypatch.setattr("worker.training.loop.training_device", lambda: precision.CPU)  # on a GPU host too
    reporter = RecordingReporter()
    spec = make_spec(fast=True, max_train_samples=16, max_eval_samples=8)
    result = run_training(spec, train_settings, output_dir=tmp_path / "run", reporter=reporter)
    assert result["mixed_precision"] == ("bf16" if native else "no")
    said = [
        (message, level, data)
        for message, level, data in zip(reporter.logs, reporter.log_levels, reporter.log_data, strict=True)
        if level == "warning"
    ]
    fp32_instead = precision.training_precision(spec, device=precision.CPU, native_bf16=False)
    assert said == ([] if native else [(fp32_instead.warning, "warning", {"mixed_precision": "no"})])
    assert native == any("in fp32: bert.pooler, classifier" in line for line in reporter.logs)


def test_the_precision_a_spec_trains_in_on_each_kind_of_device() -> None:
    def on(spec: dict[str, Any], device: str = precision.CPU, *, native: bool = False) -> tuple[str, bool]:
        job = JobSpec.model_validate({**BASE, **spec})
        chosen = precision.training_precision(job, device=device, native_bf16=native)
        return chosen.mixed_precision, chosen.warning is not None

    assert on({}) == ("no", False)
    assert on({"fast": True}, native=True) == ("bf16", False)
    assert on({"fast": True}) == ("no", True)  # fast asks for speed: fp32 where bf16 is emulated
    assert on({"fast": True, "bf16": True}) == ("no", True)  # the stored spec cannot tell them apart
    assert on({"bf16": True}) == ("bf16", True)  # asked for itself: honoured, and its cost said
    assert on({"bf16": True}, native=True) == ("bf16", False)
    assert on({"fast": True}, precision.CUDA, native=True) == ("bf16", False)
    assert on({"fast": True}, precision.CUDA) == ("no", True)  # a T4 or V100 emulates bf16 too
    assert on({"fp16": True}, precision.CUDA) == ("fp16", False)
    assert on({"fast": True, "fp16": True}, precision.CUDA) == ("fp16", False)
    assert on({"fast": True}, precision.OTHER) == ("bf16", False)  # MPS, XPU: accelerate's to check
    with pytest.raises(JobFailed, match="fp16 needs a CUDA GPU"):
        on({"fp16": True})


def test_only_x86_cpus_without_the_instructions_count_as_emulating_bf16(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(precision.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert precision.cpu_has_native_bf16() is False
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)  # AMX without AVX512-BF16
    assert precision.cpu_has_native_bf16() is True
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    assert precision.cpu_has_native_bf16() is True  # a torch without the probes: as before the check
    monkeypatch.setattr(precision.platform, "machine", lambda: "aarch64")
    assert precision.cpu_has_native_bf16() is True  # the probes know x86 only


# --- shuffled length groups --------------------------------------------------------------------------------


def test_shuffled_length_groups_are_trainers_batches_in_another_order() -> None:
    from transformers.trainer_pt_utils import LengthGroupedSampler

    from worker.training.batches import ShuffledLengthGroups

    lengths = [int(n) for n in np.random.default_rng(0).integers(3, 60, size=1000)]  # 31 batches of 32 + 8

    def batches(sampler: LengthGroupedSampler, seed: int) -> list[list[int]]:
        sampler.generator = torch.Generator().manual_seed(seed)
        indices = list(sampler)
        return [indices[i : i + 32] for i in range(0, len(indices), 32)]

    trainers = batches(LengthGroupedSampler(32, lengths=lengths), 7)
    shuffled = batches(ShuffledLengthGroups(32, lengths=lengths), 7)
    assert sorted(map(sorted, shuffled)) == sorted(map(sorted, trainers))  # the same batches
    assert shuffled != trainers
    assert shuffled[-1] == trainers[-1] and len(shuffled[-1]) == 8  # the partial batch stays last
    assert shuffled == batches(ShuffledLengthGroups(32, lengths=lengths), 7)  # one order per seed
    # Trainer's runs from long to short are broken up: lengths no longer fall batch after batch.
    longest = [max(lengths[i] for i in batch) for batch in shuffled[:-1]]
    assert sum(a >= b for a, b in itertools.pairwise(longest)) < 0.8 * len(longest)


def test_shuffle_length_groups_needs_group_by_length() -> None:
    with pytest.raises(ValidationError, match="shuffle_length_groups needs group_by_length"):
        JobSpec.model_validate({**BASE, "shuffle_length_groups": True})


# --- the fast path's CPU levers: PCG64 dropout masks, a frozen word-embedding table -----------------------


def test_pcg_dropout_has_torch_dropouts_law_and_gradient() -> None:
    layer = fast_dropout.PcgDropout(0.1, fast_dropout.MaskSource(seed=7, process_index=0))
    layer.source.at_step(0)
    x = torch.ones(64, 32, 128, requires_grad=True)
    y = layer(x)
    kept = y != 0
    assert abs(1 - kept.float().mean().item() - 0.1) < 0.005  # 262,144 draws: the 0.005 bound is 10 sigma
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / 0.9))
    y.sum().backward()
    assert x.grad is not None and torch.equal(x.grad, y.detach())  # d(x·factor)/dx = factor
    # bf16 under autocast keeps its dtype; eval mode and p = 0 are the identity.
    assert layer(torch.ones(4, 8, dtype=torch.bfloat16)).dtype == torch.bfloat16
    layer.eval()
    assert layer(x) is x
    assert fast_dropout.PcgDropout(0.0, layer.source).train()(x) is x


def test_pcg_dropout_masks_follow_from_seed_process_and_step() -> None:
    """A resumed run re-seeds at its step and draws the masks the uninterrupted run drew."""

    def masks(seed: int, process: int, steps: list[int]) -> list[torch.Tensor]:
        source = fast_dropout.MaskSource(seed, process)
        drawn = []
        for step in steps:
            source.at_step(step)
            drawn.append(source.keep(torch.Size([1000]), 0.5))
        return drawn

    straight = masks(42, 0, [0, 0, 1, 2])  # step 0 has two micro-batches: two different masks
    assert not torch.equal(straight[0], straight[1])
    assert torch.equal(masks(42, 0, [2])[0], straight[3])  # resumed at step 2
    assert not torch.equal(masks(43, 0, [2])[0], straight[3])
    assert not torch.equal(masks(42, 1, [2])[0], straight[3])  # each process its own masks


def test_install_swaps_plain_dropout_layers_and_changes_no_weights(train_settings: Settings) -> None:
    model = load_model(str(train_settings.models_dir / "tiny-bert"), num_labels=2, label_names=None)
    plain = [name for name, m in model.named_modules() if type(m) is torch.nn.Dropout]
    keys = set(model.state_dict())
    _, swapped = fast_dropout.install(model, seed=1, process_index=0)
    assert swapped == len(plain) > 0
    assert not [name for name, m in model.named_modules() if type(m) is torch.nn.Dropout]
    assert all(isinstance(dict(model.named_modules())[name], fast_dropout.PcgDropout) for name in plain)
    assert set(model.state_dict()) == keys


def test_fast_dropout_is_refused_by_a_warning_off_the_cpu() -> None:
    reporter = RecordingReporter()
    cuda = SimpleNamespace(device=torch.device("cuda"), is_main_process=True, process_index=0)
    report = fast_dropout.MainProcessReporter(reporter, cuda)  # type: ignore[arg-type]
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1))
    assert fast_dropout.for_job(model, True, cuda, seed=1, report=report) is None  # type: ignore[arg-type]
    assert type(model[1]) is torch.nn.Dropout
    assert reporter.log_levels == ["warning"] and "CPU only" in reporter.logs[0]


def test_a_fast_job_keeps_its_word_embeddings_and_draws_pcg_masks(
    train_settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors.torch import load_file

    monkeypatch.setattr("worker.training.loop.training_device", lambda: precision.CPU)  # on a GPU host too
    reporter = RecordingReporter()
    spec = make_spec(fast=True, max_train_samples=32, max_eval_samples=8)
    result = run_training(spec, train_settings, output_dir=tmp_path / "run", reporter=reporter)
    assert any(line.startswith("fast_dropout: ") and "dropout layers" in line for line in reporter.logs)
    loaded = load_model(str(train_settings.models_dir / "tiny-bert"), num_labels=2, label_names=None)
    table = loaded.get_input_embeddings().weight
    assert result["total_params"] - result["trainable_params"] == table.numel()
    trained = load_file(tmp_path / "run" / "model.safetensors")
    name = next(k for k in trained if k.endswith("word_embeddings.weight"))
    assert torch.equal(trained[name], table.detach())
    # The rest trained: the position embeddings moved.
    position = next(k for k in trained if k.endswith("position_embeddings.weight"))
    assert not torch.equal(trained[position], loaded.state_dict()[position])
