"""The reference for bench/speed_bench.py's `script` mode: run_glue_no_trainer.py's default training
(Hugging Face's examples), restated so that it runs offline on transformers 5. Prints one JSON line.

The published script loads GLUE and its metric from the Hub and, in its older releases, imports
names transformers 5 removed (transformers.AdamW, datasets.load_metric), so it cannot run here as
published. This program does what the script does with its defaults and the benchmark's flags
(--max_length 128 --per_device_train_batch_size 32 --learning_rate 5e-5 --num_train_epochs 1
--seed N), step for step: set_seed; the rows tokenised unpadded through `datasets.map` with
truncation at max_length; DataCollatorWithPadding (no pad_to_multiple_of in fp32); a shuffled
DataLoader of 32 and an evaluation DataLoader of 8 (the script's default eval batch); torch's AdamW
over two parameter groups (no weight decay on biases and LayerNorm weights; weight decay 0 by
default); accelerator.prepare; a linear schedule without warm-up; forward, backward, step,
scheduler step, zero_grad, with no clipping; then the dev accuracy. Only its GLUE rows come from
../shared/glue_data (the same rows the Hub's glue/sst2 holds) instead of the Hub.

Its training time is counted as gluejobs counts a job's (worker/training/meter.py): the epoch's loop,
batches fetched and collated included, evaluation excluded.

    python bench/reference_script.py --seed 42 --train-rows 8000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GLUE = REPO.parent / "shared" / "glue_data" / "SST-2"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="a local model folder (MiniLM's)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--train-rows", type=int, default=8000, help="SST-2's first N train rows")
    parser.add_argument("--glue-dir", type=Path, default=GLUE, help="SST-2's folder (train.tsv, dev.tsv)")
    args = parser.parse_args()
    started = time.perf_counter()

    # Imported here so that --help answers without torch.
    import torch
    from accelerate import Accelerator
    from datasets import load_dataset
    from torch.utils.data import DataLoader
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        get_scheduler,
        set_seed,
    )

    accelerator = Accelerator()
    set_seed(args.seed)
    files = {"train": str(args.glue_dir / "train.tsv"), "validation": str(args.glue_dir / "dev.tsv")}
    raw = load_dataset("csv", data_files=files, delimiter="\t", quoting=3)
    raw["train"] = raw["train"].select(range(min(args.train_rows, len(raw["train"]))))
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=2)

    def preprocess(examples: dict) -> dict:
        result = tokenizer(examples["sentence"], padding=False, max_length=128, truncation=True)
        result["labels"] = examples["label"]
        return result

    processed = raw.map(preprocess, batched=True, remove_columns=raw["train"].column_names)
    collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=None)
    train_loader = DataLoader(processed["train"], shuffle=True, collate_fn=collator, batch_size=32)
    eval_loader = DataLoader(processed["validation"], collate_fn=collator, batch_size=8)

    no_decay = ["bias", "LayerNorm.weight"]
    groups = [
        {
            "params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
            "weight_decay": 0.0,
        },
        {
            "params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
            "weight_decay": 0.0,
        },
    ]
    optimizer = torch.optim.AdamW(groups, lr=5e-5)
    model, optimizer, train_loader, eval_loader = accelerator.prepare(
        model, optimizer, train_loader, eval_loader
    )
    lr_scheduler = get_scheduler(
        "linear", optimizer=optimizer, num_warmup_steps=0, num_training_steps=len(train_loader)
    )

    model.train()
    samples = padded = real = 0
    train_started, cpu_started = time.perf_counter(), time.process_time()
    for batch in train_loader:
        outputs = model(**batch)
        accelerator.backward(outputs.loss)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
        rows, width = batch["input_ids"].shape
        samples, padded, real = (
            samples + rows,
            padded + rows * width,
            real + int(batch["attention_mask"].sum()),
        )
    train_s, train_cpu_s = time.perf_counter() - train_started, time.process_time() - cpu_started

    model.eval()
    eval_started = time.perf_counter()
    correct = total = 0
    for batch in eval_loader:
        with torch.no_grad():
            predictions = model(**batch).logits.argmax(dim=-1)
        correct += int((predictions == batch["labels"]).sum())
        total += len(predictions)
    print(
        json.dumps(
            {
                "status": "succeeded",
                "train_samples_per_second": round(samples / train_s, 3),
                "train_samples_per_cpu_second": round(samples / train_cpu_s, 3),
                "padded_tokens": padded,
                "real_tokens": real,
                "padding_efficiency": round(real / padded, 3),
                "accuracy": correct / total,
                "eval_runtime_s": round(time.perf_counter() - eval_started, 1),
                "wall_s": round(time.perf_counter() - started, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
