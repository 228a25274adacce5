"""`gluejobs submit` takes the three recipes as the user has them: run_glue_no_trainer.py and
run_glue.py command lines behind their launchers, microsoft/LoRA's shell configs, and the Trainer
page's arguments as a file. Flags that only steer a script's bookkeeping are accepted with a note;
anything gluejobs cannot honour is refused by name."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from gluejobs.cli import main
from gluejobs.cli.script_args import ScriptArgsError, command_to_spec, shell_script_to_spec
from shared.jobspec.spec import JobSpec
from tests.support.lora_scripts import DEBERTA_V2_XXLARGE_MNLI, ROBERTA_BASE_MNLI

# microsoft/LoRA, examples/NLU: the two configs as the issue quotes them.
# What each resolves to besides JobSpec's defaults; every other field must hold its default.
ROBERTA_EXPECTED: dict[str, Any] = {
    "model_name_or_path": "roberta-base",
    "task_name": "mnli",
    "recipe": "trainer",
    "num_processes": 8,
    "max_length": 512,
    "pad_to_max_length": True,  # run_glue.py's default
    "per_device_train_batch_size": 16,
    "learning_rate": 5e-4,
    "num_train_epochs": 30,
    "logging_steps": 10,
    "eval_strategy": "epoch",
    "do_eval": True,
    "save_strategy": "epoch",
    "save_steps": 500,  # Trainer's default, unused under save_strategy epoch (TrainingArguments shows it too)
    "warmup_ratio": 0.06,
    "apply_lora": True,
    "lora_r": 8,
    "lora_alpha": 16.0,
    "seed": 0,
    "weight_decay": 0.1,
    "max_grad_norm": 1.0,  # Trainer's, which the script never sets
    "adam_beta1": 0.9,
    "adam_beta2": 0.999,
    "adam_epsilon": 1e-8,
    "use_deterministic_algorithms": False,
}
DEBERTA_EXPECTED: dict[str, Any] = {
    "model_name_or_path": "microsoft/deberta-v2-xxlarge",
    "task_name": "mnli",
    "recipe": "trainer",
    "num_processes": 8,
    "max_length": 256,
    "pad_to_max_length": True,
    "per_device_train_batch_size": 8,
    "learning_rate": 1e-4,
    "num_train_epochs": 5,
    "logging_steps": 10,
    "fp16": True,
    "eval_strategy": "steps",
    "eval_steps": 500,
    "do_eval": True,
    "save_strategy": "steps",
    "save_steps": 500,
    "num_warmup_steps": 1000,
    "cls_dropout": 0.15,
    "apply_lora": True,
    "lora_r": 16,
    "lora_alpha": 32.0,
    "seed": 0,
    "weight_decay": 0.0,
    "max_grad_norm": 1.0,
    "use_deterministic_algorithms": True,
}


def dry_run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[dict[str, Any], str]:
    code = main(["submit", "--dry-run", *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    spec: dict[str, Any] = json.loads(out)
    return spec, err


def defaults() -> dict[str, Any]:
    return JobSpec.model_validate({"model_name_or_path": "m", "task_name": "mnli"}).model_dump(mode="json")


@pytest.mark.parametrize(
    ("script", "expected"),
    [(ROBERTA_BASE_MNLI, ROBERTA_EXPECTED), (DEBERTA_V2_XXLARGE_MNLI, DEBERTA_EXPECTED)],
    ids=["roberta-base", "deberta-v2-xxlarge"],
)
def test_the_lora_shell_configs_resolve_field_by_field(
    script: str, expected: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.sh"
    path.write_text(script)

    spec, notes = dry_run(capsys, "--script", str(path))

    assert set(spec) == set(defaults())
    for name, value in spec.items():
        assert value == expected.get(name, defaults()[name]), name
    # The bookkeeping flags are accepted and say what they mean here.
    for flag in ("--output_dir", "--overwrite_output_dir", "--do_train"):
        assert f"note: {flag}:" in notes
    assert "note: export CUBLAS_WORKSPACE_CONFIG" in notes and "note: export PYTHONHASHSEED" in notes
    assert "$output_dir is not set in the script" in notes


@pytest.mark.parametrize(
    "command",
    [
        "torchrun --nproc_per_node 2 run_glue.py --model_name_or_path m --task_name rte --do_train",
        "python -m torch.distributed.run --nproc-per-node=2 --nnodes=1 --standalone run_glue.py "
        "--model_name_or_path m --task_name rte --do_train",
        "python3 examples/run_glue.py --model_name_or_path m --task_name rte --do_train --num_processes 2",
    ],
)
def test_run_glue_behind_torch_launchers_or_none(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    spec, _ = dry_run(capsys, *shlex.split(command))

    assert (spec["recipe"], spec["num_processes"], spec["max_grad_norm"], spec["seed"]) == (
        "trainer",
        2,
        1.0,
        42,
    )
    # Without --do_eval run_glue.py does not evaluate; Trainer logs every 500 steps and saves too.
    assert (spec["eval_strategy"], spec["do_eval"], spec["logging_steps"]) == ("no", False, 500)
    assert (spec["save_strategy"], spec["save_steps"]) == ("steps", 500)


def test_do_eval_alone_evaluates_at_the_end(capsys: pytest.CaptureFixture[str]) -> None:
    spec, _ = dry_run(capsys, "--model_name_or_path", "m", "--task_name", "rte", "--do_train", "--do_eval")

    assert (spec["recipe"], spec["eval_strategy"], spec["do_eval"]) == ("trainer", "no", True)


@pytest.mark.parametrize(
    "command",
    [
        "accelerate launch --num_processes 2 --mixed_precision bf16 run_glue_no_trainer.py",
        "python -m accelerate.commands.launch --multi_gpu --num_processes=2 --mixed_precision=bf16 "
        "run_glue_no_trainer.py",
    ],
)
def test_run_glue_no_trainer_behind_accelerate_launch(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec, _ = dry_run(capsys, *shlex.split(command), "--model_name_or_path", "m", "--task_name", "mrpc")

    assert (spec["recipe"], spec["num_processes"], spec["bf16"]) == ("no_trainer", 2, True)
    # The script's own defaults: no clipping, evaluation every epoch, a random seed (drawn by the API).
    assert (spec["max_grad_norm"], spec["eval_strategy"], spec["seed"], spec["logging_steps"]) == (
        None,
        "epoch",
        None,
        10,
    )


def test_a_trainer_page_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The Trainer page's TrainingArguments, with the model and data arguments beside them.
    args = {
        "model_name_or_path": "tiny-bert",
        "train_file": "reviews/train.csv",
        "validation_file": "reviews/dev.csv",
        "output_dir": "my_awesome_model",
        "learning_rate": 2e-5,
        "per_device_train_batch_size": 16,
        "per_device_eval_batch_size": 16,
        "num_train_epochs": 2.0,
        "weight_decay": 0.01,
        "eval_strategy": "epoch",
        "save_strategy": "epoch",
        "load_best_model_at_end": True,
        "metric_for_best_model": "f1",
        "greater_is_better": True,
        "push_to_hub": False,
        "report_to": ["tensorboard"],
    }
    json_file = tmp_path / "args.json"
    json_file.write_text(json.dumps(args))
    yaml_file = tmp_path / "args.yaml"
    yaml_file.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in args.items()))

    from_json, notes = dry_run(capsys, "--config", str(json_file))
    from_yaml, _ = dry_run(capsys, "--config", str(yaml_file), "--num_train_epochs", "3")

    assert from_json["recipe"] == "trainer" and from_json["num_train_epochs"] == 2
    assert (from_json["metric_for_best_model"], from_json["load_best_model_at_end"]) == ("f1", True)
    assert (from_json["train_file"], from_json["report_to"], from_json["max_grad_norm"]) == (
        "reviews/train.csv",
        ["tensorboard"],
        1.0,
    )
    assert "note: --output_dir" in notes
    assert from_yaml == {**from_json, "num_train_epochs": 3}  # flags after the file override it


def test_shell_expansion_follows_the_shell() -> None:
    script = """\
# comments and blank lines are skipped
set -e
MODEL=tiny-bert
export TASK=mrpc LR=2e-5
mkdir -p "$OUT"
python run_glue_no_trainer.py --model_name_or_path "${MODEL}" --task_name $TASK \\
  --learning_rate ${LR:-1e-3} --per_device_train_batch_size ${BATCH:-4} \\
  --apply_lora --lora_target_modules '$literal' x   # a trailing comment
"""
    translation = shell_script_to_spec(script, overrides=["--seed", "3"])

    assert translation.spec == {
        "recipe": "no_trainer",
        "model_name_or_path": "tiny-bert",
        "task_name": "mrpc",
        "learning_rate": "2e-5",
        "per_device_train_batch_size": "4",
        "apply_lora": "true",
        "lora_target_modules": ["$literal", "x"],
        "seed": "3",
    }
    assert any("$OUT is not set" in note for note in translation.notes)


@pytest.mark.parametrize(
    ("script", "message"),
    [
        (
            "export NCCL_DEBUG=INFO\npython run_glue.py --model_name_or_path m --task_name rte",
            "export NCCL_DEBUG=INFO",
        ),
        ("CUDA_VISIBLE_DEVICES=0 python run_glue.py --model_name_or_path m", "export CUDA_VISIBLE_DEVICES=0"),
        (
            "export CUBLAS_WORKSPACE_CONFIG=:1:1\npython run_glue.py --model_name_or_path m",
            "CUBLAS_WORKSPACE_CONFIG",
        ),
        ("python run_glue.py --model_name_or_path $(cat model.txt)", "command substitution"),
        (
            "python run_glue.py --model_name_or_path m\npython run_glue.py --model_name_or_path n",
            "a second command",
        ),
        ("pip install peft\npython run_glue.py --model_name_or_path m", "`pip`: gluejobs runs one"),
        (
            "torchrun --nnodes 2 --node_rank 1 --nproc_per_node 8 run_glue.py --model_name_or_path m",
            "--node_rank 1: not supported (the service sets each machine's rank",
        ),
        (
            "accelerate launch --gpu_ids 0,1 run_glue_no_trainer.py --model_name_or_path m",
            "--gpu_ids 0,1: not supported",
        ),
        ("python train.py --model_name_or_path m", "not train.py"),
        (
            "python run_glue.py --model_name_or_path m --fp16_opt_level O2",
            "--fp16_opt_level: unknown flag",
        ),
        ("python run_glue.py --model_name_or_path m --push_to_hub", "--push_to_hub is not supported"),
        (
            "python run_glue.py --model_name_or_path m --lora_r 8",
            "--lora_r has no effect without --apply_lora",
        ),
    ],
)
def test_what_gluejobs_cannot_honour_is_refused_by_name(script: str, message: str) -> None:
    with pytest.raises(ScriptArgsError, match=re.escape(message)):
        shell_script_to_spec(script)


def test_a_refusal_reaches_the_user_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.sh"
    path.write_text("python run_glue.py --model_name_or_path m --task_name rte --lora_alpha 32\n")

    assert main(["submit", "--script", str(path), "--dry-run"]) == 2
    assert "--lora_alpha has no effect without --apply_lora" in capsys.readouterr().err


def test_a_dry_run_validates_the_spec(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["submit", "--dry-run", "--model_name_or_path", "m", "--task_name", "rte", "--learning_rate", "0"]
    )

    assert code == 2
    assert "gluejobs submit: spec.learning_rate: must be greater than 0, not '0'" in capsys.readouterr().err


def test_bare_flags_stay_run_glue_no_trainer_flags() -> None:
    translation = command_to_spec(shlex.split("--model_name_or_path m --task_name sst2 --with_tracking"))

    assert translation.spec == {"model_name_or_path": "m", "task_name": "sst2", "with_tracking": "true"}
