"""The `gluejobs` CLI: a run_glue_no_trainer.py command line becomes a job spec."""

from __future__ import annotations

import re
import shlex

import pytest

from gluejobs.cli import main
from gluejobs.cli.script_args import ScriptArgsError, script_flags_to_spec
from shared.jobspec.spec import JobSpec

# A command line from the transformers README, with `gluejobs submit` in place of the script.
SCRIPT_COMMAND = """
  --model_name_or_path bert-base-cased --task_name mrpc --max_length 128 --per_device_train_batch_size 32
  --learning_rate 2e-5 --num_train_epochs 3 --output_dir /tmp/mrpc/ --seed 42 --pad_to_max_length
  --lr_scheduler_type cosine --num_warmup_steps 10 --checkpointing_steps epoch --with_tracking
"""


def test_a_script_command_line_translates_one_for_one() -> None:
    notes: list[str] = []
    spec = script_flags_to_spec(shlex.split(SCRIPT_COMMAND), notes=notes)
    resolved = JobSpec.model_validate(spec)

    assert (resolved.model_name_or_path, resolved.task_name, resolved.max_length) == (
        "bert-base-cased",
        "mrpc",
        128,
    )
    assert (resolved.per_device_train_batch_size, resolved.learning_rate, resolved.seed) == (32, 2e-5, 42)
    assert resolved.pad_to_max_length and resolved.with_tracking
    assert (resolved.lr_scheduler_type, resolved.num_warmup_steps, resolved.save_strategy) == (
        "cosine",
        10,
        "epoch",
    )
    assert "output_dir" not in spec
    assert any(note.startswith("--output_dir") for note in notes)


def test_aliases_booleans_and_lists() -> None:
    spec = script_flags_to_spec(
        shlex.split(
            "--model_name_or_path m --task_name sst2 --max_seq_length 64 --evaluation_strategy no "
            "--apply_lora --lora_target_modules query value --fp16 false --trust_remote_code false"
        )
    )
    resolved = JobSpec.model_validate(spec)

    assert (resolved.max_length, resolved.eval_strategy, resolved.apply_lora, resolved.fp16) == (
        64,
        "no",
        True,
        False,
    )
    assert resolved.lora_target_modules == ["query", "value"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            "--model_name_or_path m --task_name sst2 --num_epochs 3",
            "--num_epochs: unknown flag; did you mean --num_train_epochs?",
        ),
        ("--model_name_or_path m --task_name sst2 --push_to_hub", "--push_to_hub is not supported"),
    ],
)
def test_flags_the_service_cannot_take_are_refused(flags: str, message: str) -> None:
    with pytest.raises(ScriptArgsError, match=re.escape(message)):
        script_flags_to_spec(shlex.split(flags))


def test_submit_to_an_unreachable_api_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["submit", "--url", "http://127.0.0.1:9", "--model_name_or_path", "m", "--task_name", "sst2"])

    assert code == 2
    assert "cannot reach the API at http://127.0.0.1:9" in capsys.readouterr().err
