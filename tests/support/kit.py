"""The real things the tests use, by name: the repository, the GLUE kit beside it, the Postgres,
the tiny models conftest.py builds, the tests' keys and standard spec, and a small MNLI folder in
GLUE's layout.

Test modules import these from here (never from conftest.py or from another test module). The
benchmarks in bench/ use it too (bench imports tests' support, never the reverse)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from shared.core.config import Settings

# The repository and the kit beside it (CI has it at the same relative path): real GLUE rows.
REPO = Path(__file__).resolve().parents[2]
GLUE_DATA = REPO.parent / "shared" / "glue_data"
# A job a worker runs in seconds: SST-2's first 32 rows, two steps, no evaluation, no checkpoint
# (the benchmarks' quick job too, so that both train the same things).
QUICK_JOB: dict[str, Any] = {
    "model_name_or_path": "tiny-bert",
    "task_name": "sst2",
    "max_train_samples": 32,
    "max_eval_samples": 16,
    "per_device_train_batch_size": 16,
    "num_train_epochs": 1,
    "save_strategy": "no",
    "eval_strategy": "no",
}

POSTGRES_URL = os.environ.get(
    "GLUEJOBS_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
SKIP_POSTGRES = os.environ.get("GLUEJOBS_TEST_SKIP_POSTGRES") == "1"
TINY_MODEL = "tiny-bert"
# Tiny models of the families microsoft/LoRA's GLUE configs fine-tune (roberta-base, deberta-v2-xxlarge).
TINY_ROBERTA = "tiny-roberta"
TINY_DEBERTA_V2 = "tiny-deberta-v2"


# The tests' keys (secrets). Configure them bare (`api_keys=[ALICE]`: the owner is derived from the
# key) or named (`api_keys=[f"alice={ALICE}"]`); ROOT as an admin key.
ALICE = "alice-key-0123456789abcdef"
BOB = "bob-key-0123456789abcdef"
ROOT = "root-key-0123456789abcdef"
# The standard tiny job: the tiny model on the kit's SST-2 (what most API tests submit).
SPEC = {"model_name_or_path": TINY_MODEL, "task_name": "sst2"}


def auth(key: str) -> dict[str, str]:
    """The headers that send `key`: a key, or a configured entry `owner=key`."""
    return {"Authorization": f"Bearer {key.split('=', 1)[-1]}"}


def settings_under(root: Path, database_url: str, *, models_dir: Path, **overrides: object) -> Settings:
    """The tests' settings: the benchmarks' stack under `root` with the tiny models and short leases and
    polls (conftest's settings_factory; a module-wide service builds its own from the same)."""
    (root / "data").mkdir(exist_ok=True)
    values = {"models_dir": models_dir, "lease_s": 30.0, "heartbeat_s": 0.5, "poll_interval_s": 0.2}
    return stack_settings(root, database_url=database_url, **{**values, "cancel_grace_s": 5.0, **overrides})


def save_tiny_bert(folder: Path, tokenizer_dir: Path, **shape: int) -> Path:
    """A randomly initialised BERT backbone (no head, like a pretrained checkpoint: each job adds a
    head of its own size) over the tokenizer in `tokenizer_dir`, saved in `folder`. Two layers of
    width 32 by default, what the tests and the quick benchmarks train in seconds; `shape` sizes it
    otherwise (bench/harness.py's ROBERTA_BASE_SHAPE)."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tiny = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
    config = BertConfig(vocab_size=tokenizer.vocab_size, max_position_embeddings=512, **{**tiny, **shape})
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def stack_settings(root: Path, *, database_url: str | None = None, **overrides: Any) -> Settings:
    """A stack of its own under `root`: a SQLite database there (unless `database_url`), its
    artifacts, data, models and tokenisation cache, the kit's GLUE rows, quick polling (the
    benchmarks' settings as well as the tests')."""
    values: dict[str, Any] = {
        "database_url": database_url or f"sqlite:///{root / 'gluejobs.db'}",
        "artifacts_dir": root / "artifacts",
        "data_dir": root / "data",
        "glue_dir": GLUE_DATA,
        "models_dir": root / "models",
        "cache_dir": root / "cache",
        "heartbeat_s": 5.0,
        "poll_interval_s": 0.5,
    }
    return Settings(**{**values, **overrides})


MNLI_HEADER = (
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label"
)
MNLI_ROWS = [
    ("A man is playing a guitar on stage.", "A man is performing music.", "entailment"),
    ("A man is playing a guitar on stage.", "The man is asleep at home.", "contradiction"),
    ("A man is playing a guitar on stage.", "The man is a famous musician.", "neutral"),
    ("Two dogs run through the snow.", "Animals are outside.", "entailment"),
    ("Two dogs run through the snow.", "The dogs are sleeping indoors.", "contradiction"),
    ("Two dogs run through the snow.", "The dogs belong to a farmer.", "neutral"),
    ("The committee approved the budget on Monday.", "The budget was approved.", "entailment"),
    ("The committee approved the budget on Monday.", "The committee rejected the budget.", "contradiction"),
    ("The committee approved the budget on Monday.", "The vote was unanimous.", "neutral"),
    ("A child is reading a book in the library.", "A kid is reading.", "entailment"),
    ("A child is reading a book in the library.", "The child is swimming.", "contradiction"),
    ("A child is reading a book in the library.", "The book is about dinosaurs.", "neutral"),
]


def write_mnli(folder: Path, genre: str = "fiction") -> None:
    folder.mkdir(parents=True)
    for name, repeat in (("train.tsv", 4), ("dev_matched.tsv", 1), ("dev_mismatched.tsv", 1)):
        lines = [MNLI_HEADER]
        for i, (premise, hypothesis, label) in enumerate(MNLI_ROWS * repeat):
            lines.append(
                f"{i}\t{i}\t{i}{label[0]}\t{genre}\t( x )\t( y )\t(ROOT x)\t(ROOT y)\t"
                f"{premise}\t{hypothesis}\t{label}\t{label}"
            )
        (folder / name).write_text("\n".join(lines) + "\n")
