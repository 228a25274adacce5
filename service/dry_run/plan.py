"""The dry-run plan (POST /v1/jobs?dry_run=true): what can be known about a job without a GPU.

Torch-free. The data checks are shared/admission/data_checks.py's (the same ones a real submission runs);
on top of them the plan holds:
- the schedule: run_glue_no_trainer.py's arithmetic, computed by the training loop's own code
  (shared/jobspec/schedule.py) on the batches `accelerator.prepare` would give each process;
- tokenised lengths, measured with the `tokenizers` library from the model folder's
  tokenizer.json (what the worker's fast tokenizer runs) in a child process under limits
  (service/dry_run/tokenizer_child.py), and the padding that dynamic padding,
  group_by_length and pad_to_max_length would cost, simulated over one epoch's batches;
- an estimate of the worker memory for the model, batch and precision.

A job on several machines (num_machines, a gang: shared/jobs_repo/gangs.py) is planned whole: its
processes are num_processes on each machine, and the loader shards the data over all of them, so the
schedule's batches per process, eval batches and global batch (samples per optimizer step) count
num_processes × num_machines; `machines` and `devices` say what it holds while it runs (N × D
devices: what its owner's max_devices and device-hours count, shared/scheduling/machines.py).
The memory estimate stays per process: each device holds one.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from service.bounded_child import ChildFailed, ChildLimits, run_bounded
from service.dry_run.tokenizer_child import measure
from service.files.upload_checks import first_rows
from shared.admission.data_checks import DataReport, read_and_check
from shared.core.config import Settings
from shared.core.errors import InvalidRequest
from shared.data.limits import FileLimits
from shared.data.reading import JobData, Split
from shared.jobspec.column_mapping import ColumnMapping
from shared.jobspec.data_scope import DataScope
from shared.jobspec.schedule import spec_schedule
from shared.jobspec.spec import JobSpec, job_kind
from shared.jobspec.tasks import EVAL_SPLIT, TASKS
from shared.model_folders.reading import api_model_folder, count, read_config, safetensors_shapes
from shared.scheduling.machines import devices_words

# numpy and pandas are imported where used: the API imports this module at start and plans only on a
# dry run's request, so that its start does not pay for their import.
if TYPE_CHECKING:
    import numpy as np

logger = logging.getLogger(__name__)

# Tokenising is the plan's one cost that grows with the data, and it runs inside the API: measure at
# most this many rows of each split (a seeded random sample beyond it, so the figures do not depend on
# the file's order; the plan's `sample` says so). Measured on 100,000-row train and eval files: every
# row 14 s of CPU and +620 MB, a 20,000-row sample 4.7 s, a 5,000-row one 1.0-1.4 s and +145 MB (most
# of it reading the files), with a mean length 0.08 token from the whole file's and the same longest
# row. GLUEJOBS_MAX_DRY_RUNS bounds how many run at once.
MAX_TOKENIZED_ROWS = 5_000
SAMPLE_SEED = 0
# transformers' LengthGroupedSampler sorts megabatches of 50 batches by length.
LENGTH_GROUPED_MEGABATCH = 50
# Workers pad to a multiple of 8 under mixed precision on CUDA (worker.training.batches.pad_multiple); the API
# does not know the worker's device, so the plan counts that case (on a CPU a job pads less).
MIXED_PRECISION_PAD_MULTIPLE = 8
MAX_LISTED_STEPS = 50
GIB = 1024**3
# Module names PEFT adapts by default in the common encoders (BERT/RoBERTa, DeBERTa, DistilBERT, …).
DEFAULT_LORA_TARGETS = ("query", "value", "query_proj", "value_proj", "q_lin", "v_lin", "q_proj", "v_proj")


def plan_job(spec: JobSpec, settings: Settings, *, scope: DataScope) -> dict[str, Any]:
    """The plan of a job whose spec is resolved (shared.admission.job_checks.check_job_spec, seed recorded);
    InvalidSpec when its data would fail it on a worker (quoting only the caller's own files)."""
    data, report = read_and_check(spec, settings, scope=scope)
    data = _with_sampled_texts(spec, data, settings, scope)
    train_rows = len(data.train) if data.train is not None else None
    eval_rows = {name: len(rows) for name, rows in data.evals.items()}
    if spec.trains:
        schedule = training_schedule(spec, train_rows, eval_rows)
    else:
        schedule = evaluation_schedule(spec, eval_rows, test_rows=len(data.test) if data.test else None)
    tokens = token_lengths(spec, settings, data)
    num_labels = 1 if report.is_regression else len(report.label_names or ())
    measured_split = "train" if spec.trains else EVAL_SPLIT
    longest = tokens.get(measured_split, {}).get("longest") if tokens["status"] == "measured" else None
    memory = memory_estimate(spec, settings, num_labels=num_labels, longest=longest)
    return {
        "dry_run": True,
        "spec": spec.model_dump(mode="json"),
        "data": report.as_dict(),
        "schedule": schedule,
        "tokens": tokens,
        "memory": memory,
        "warnings": _warnings(spec, report, schedule, tokens),
    }


def _with_sampled_texts(spec: JobSpec, data: JobData, settings: Settings, scope: DataScope) -> JobData:
    """An uploaded file's splits are its upload's label tally (shared/jobspec/upload_tally.py), with no texts:
    the token lengths measure its first MAX_TOKENIZED_ROWS rows instead, read from this machine's copy
    (fetched when missing), never the whole file."""
    import pandas as pd

    record_of = {record.sha256: record for record in (spec.uploaded_files or {}).values()}

    def sampled(rows: Split | None) -> Split | None:
        if rows is None or rows.weights is None or rows.table.path is None or scope.fetch_upload is None:
            return rows
        record = record_of.get(rows.table.path.stem)
        if record is None:
            return rows
        path = scope.fetch_upload(record)
        head = first_rows(path, MAX_TOKENIZED_ROWS, FileLimits.of(settings))
        head = ColumnMapping.of(spec).apply(head, TASKS[spec.task_name].text_keys if spec.task_name else None)
        keys = [key for key in data.text_keys if key is not None and key in head.columns]
        texts = pd.DataFrame({key: head[key].astype(str).reset_index(drop=True) for key in keys})
        return replace(rows, texts=texts)

    return replace(
        data,
        train=sampled(data.train),
        evals={name: sampled(rows) or rows for name, rows in data.evals.items()},
    )


# ---------------------------------------------------------------------------------------------------
# The schedule
# ---------------------------------------------------------------------------------------------------


def training_schedule(spec: JobSpec, train_rows: int | None, eval_rows: dict[str, int]) -> dict[str, Any]:
    """Optimizer steps, warmup, evaluations and checkpoints, counted as the training loop counts them."""
    if train_rows is None:
        return {
            "status": "unknown",
            "reason": "the training rows come from the Hub, which the API does not read",
        }
    processes = _processes(spec)
    batches = math.ceil(train_rows / spec.per_device_train_batch_size)
    # accelerate's sharded loader: each process gets every n-th batch, the last ones evened out.
    batches_per_process = math.ceil(batches / processes)
    schedule = spec_schedule(spec, batches_per_process)  # the loop's own arithmetic
    steps_per_epoch, total = schedule.steps_per_epoch, schedule.max_train_steps
    epochs, warmup = schedule.num_epochs, schedule.warmup_steps
    evaluations = _steps_at(spec.eval_strategy, spec.eval_steps, total, steps_per_epoch, epochs, final=True)
    if not evaluations and spec.evaluates:
        evaluations = [total]  # do_eval without an eval_strategy: once, on the final weights
    saves = _steps_at(spec.save_strategy, spec.save_steps, total, steps_per_epoch, epochs, final=False)
    return {
        "status": "known",
        "train_rows": train_rows,
        **_placement(spec),
        "batches_per_epoch": batches,
        "batches_per_process_per_epoch": batches_per_process,
        "steps_per_epoch": steps_per_epoch,
        "epochs": epochs,
        "total_optimizer_steps": total,
        "warmup_steps": warmup,
        "samples_per_optimizer_step": spec.per_device_train_batch_size
        * processes
        * spec.gradient_accumulation_steps,
        "evaluations": len(evaluations),
        "evaluation_steps": evaluations[:MAX_LISTED_STEPS],
        "checkpoints": len(saves),
        "eval_batches": {
            name: math.ceil(math.ceil(rows / spec.per_device_eval_batch_size) / processes)
            for name, rows in eval_rows.items()
        },
    }


def evaluation_schedule(spec: JobSpec, eval_rows: dict[str, int], *, test_rows: int | None) -> dict[str, Any]:
    """A job that does not train (do_train false): no optimizer step, one evaluation of the model as
    loaded (at step 0) and/or its predictions, no checkpoint."""
    processes = _processes(spec)
    evaluations = [0] if spec.do_eval else []
    return {
        "status": "known",
        "kind": job_kind(spec),
        **_placement(spec),
        "total_optimizer_steps": 0,
        "evaluations": len(evaluations),
        "evaluation_steps": evaluations,
        "checkpoints": 0,
        "eval_batches": {
            name: math.ceil(math.ceil(rows / spec.per_device_eval_batch_size) / processes)
            for name, rows in eval_rows.items()
        }
        if spec.do_eval
        else {},
        "predicted_rows": test_rows,
    }


def _processes(spec: JobSpec) -> int:
    """Every process of the job, over all its machines: what the loader shards the batches over."""
    return spec.num_processes * (spec.num_machines or 1)


def _placement(spec: JobSpec) -> dict[str, Any]:
    """Where the job's processes run: one machine's figures as before, and for a job on several
    machines how many, the processes on each, and the devices it holds in all (device-hours count
    them all: an hour of the run is `devices` device-hours)."""
    machines = spec.num_machines or 1
    if machines == 1:
        return {"processes": spec.num_processes}
    return {
        "processes": _processes(spec),
        "machines": machines,
        "processes_per_machine": spec.num_processes,
        "devices": _processes(spec),
        "devices_note": f"holds {devices_words(spec.num_processes, machines)} while it runs: each hour "
        f"of its run is {_processes(spec)} device-hours of its owner's",
    }


def _steps_at(
    strategy: str, every: int | None, total: int, steps_per_epoch: int, epochs: int, *, final: bool
) -> list[int]:
    if strategy == "epoch":  # at the end of each epoch, the last one cut short by max_train_steps
        return [min((epoch + 1) * steps_per_epoch, total) for epoch in range(epochs)]
    if strategy == "steps" and every:
        steps = list(range(every, total + 1, every))
        if final and (not steps or steps[-1] != total):
            steps.append(total)  # the loop evaluates the final weights when no evaluation fell on them
        return steps
    return []


# ---------------------------------------------------------------------------------------------------
# Tokenised lengths and padding
# ---------------------------------------------------------------------------------------------------


def token_lengths(spec: JobSpec, settings: Settings, data: JobData) -> dict[str, Any]:
    folder = api_model_folder(spec, settings)
    if folder is None:
        return {
            "status": "unknown",
            "reason": f"{spec.model_name_or_path!r} is a Hub id: the API does not fetch it",
        }
    path = folder / "tokenizer.json"
    if not path.is_file():
        return {"status": "unknown", "reason": "the model folder has no tokenizer.json (a fast tokenizer)"}
    if data.train is None and spec.trains:
        return {
            "status": "unknown",
            "reason": "the training rows come from the Hub, which the API does not read",
        }
    # Sampled here (the seed, the first rows), measured in a child under limits: the tokenizer is the
    # model owner's program (service/dry_run/tokenizer_child.py). A job that does not train: its
    # evaluation rows.
    splits = {"train": data.train} if data.train is not None else {}
    splits.update(data.evals)
    if not splits:
        return {"status": "unknown", "reason": "the job reads no rows the API measures (a test split alone)"}
    inputs = {name: _inputs(rows) for name, rows in splits.items()}
    answer, value = _measure_in_child(
        spec, settings, str(path), [(name, texts) for name, (texts, _) in inputs.items()]
    )
    if answer == "unreadable":
        # The library's message names the file by its server path: its kind says enough.
        reason = f"the model folder's tokenizer.json could not be read ({value})"
        return {"status": "unknown", "reason": reason}
    result: dict[str, Any] = {
        "status": "measured",
        "tokenizer": f"{spec.model_name_or_path}/tokenizer.json",
        "max_length": spec.max_length,
    }
    for name, rows in splits.items():
        lengths, sampled = value[name], inputs[name][1]
        result[name] = {
            **_length_stats(lengths, len(rows), sampled, spec.max_length, first=rows.weights is not None)
        }
        if name == "train":
            result[name]["padding"] = padding_costs(spec, lengths)
    return result


def _inputs(rows: Split) -> tuple[list[Any], bool]:
    """The texts (or text pairs) to measure, and whether they are a sample of the split's rows."""
    import numpy as np

    # An uploaded file's texts are its first rows already (_with_sampled_texts), fewer than the file's.
    available = len(rows.texts)
    indices = np.arange(available)
    sampled = available > MAX_TOKENIZED_ROWS or available < len(rows)
    if available > MAX_TOKENIZED_ROWS:
        indices = np.sort(
            np.random.default_rng(SAMPLE_SEED).choice(available, MAX_TOKENIZED_ROWS, replace=False)
        )
    columns = [rows.texts[key].to_numpy()[indices].tolist() for key in rows.texts.columns]
    inputs: list[Any] = columns[0] if len(columns) == 1 else list(zip(*columns, strict=True))
    return inputs, sampled


def _measure_in_child(
    spec: JobSpec, settings: Settings, path: str, splits: list[tuple[str, list[Any]]]
) -> tuple[str, Any]:
    """tokenizer_child.measure under GLUEJOBS_DRY_RUN_TOKENIZER_*; a tokenizer past a limit, panicking or
    failing is the spec's model's problem: 422 naming the limit (no backtrace: the child's stderr is
    dropped, the log has one line)."""
    limits = ChildLimits(
        memory_bytes=settings.dry_run_tokenizer_memory_bytes,
        cpu_s=settings.dry_run_tokenizer_cpu_s,
        wall_s=settings.dry_run_tokenizer_deadline_s,
    )
    try:
        answer: tuple[str, Any] = run_bounded(
            measure, (path, splits), limits, name="gluejobs-dry-run-tokenizer", quiet=True
        )
        return answer
    except ChildFailed as failed:
        words = {
            "memory": f"needed more than {limits.memory_bytes} bytes of memory "
            "(GLUEJOBS_DRY_RUN_TOKENIZER_MEMORY_BYTES raises it)",
            "cpu": f"took more than {limits.cpu_s} s of CPU (GLUEJOBS_DRY_RUN_TOKENIZER_CPU_S raises it)",
            "deadline": f"took more than {limits.wall_s:g} s "
            "(GLUEJOBS_DRY_RUN_TOKENIZER_DEADLINE_S raises it)",
        }.get(failed.kind)
        if words is None:  # a panic, an exception or a crash: one line in the log, its kind to the caller
            logger.warning("a dry run's tokenizer (%s) failed: %s", spec.model_name_or_path, failed.detail)
            detail = failed.detail if "/" not in failed.detail and "\\" not in failed.detail else failed.kind
            words = f"failed on these rows ({detail})"
        raise InvalidRequest(
            f"measuring the token lengths with {spec.model_name_or_path!r}'s tokenizer {words}",
            field="spec.model_name_or_path",
        ) from None


def _length_stats(
    raw: np.ndarray, rows: int, sampled: bool, max_length: int, *, first: bool = False
) -> dict[str, Any]:
    import numpy as np

    truncated = np.minimum(raw, max_length)
    sample = f"random {len(raw)} of {rows} rows (seed {SAMPLE_SEED})" if sampled else "all rows"
    if first:
        sample = f"the first {len(raw)} of {rows} rows (an uploaded file)"
    return {
        "rows": rows,
        "rows_measured": len(raw),
        "sample": sample,
        "longest": int(truncated.max()),
        "longest_before_truncation": int(raw.max()),
        "mean": round(float(truncated.mean()), 2),
        "truncated_rows": int((raw > max_length).sum()),
    }


def padding_costs(spec: JobSpec, raw_lengths: np.ndarray) -> dict[str, Any]:
    """Tokens per epoch (of the rows measured) under each padding scheme, and how many are padding."""
    import numpy as np

    lengths = np.minimum(raw_lengths, spec.max_length)
    batch = spec.per_device_train_batch_size
    multiple = MIXED_PRECISION_PAD_MULTIPLE if spec.mixed_precision != "no" else 1
    # One epoch's order as the loader would draw it (a shuffle); the seed makes the figure repeatable.
    shuffled = lengths[np.random.default_rng(spec.seed or 0).permutation(len(lengths))]
    megabatch = batch * LENGTH_GROUPED_MEGABATCH
    grouped = np.concatenate(
        [np.sort(shuffled[i : i + megabatch])[::-1] for i in range(0, len(shuffled), megabatch)]
    )
    real = int(lengths.sum())
    schemes = {
        "dynamic": _padded_tokens(shuffled, batch, multiple),
        "group_by_length": _padded_tokens(grouped, batch, multiple),
        "pad_to_max_length": len(lengths) * spec.max_length,
    }
    used = (
        "pad_to_max_length"
        if spec.pad_to_max_length
        else "group_by_length"
        if spec.group_by_length
        else "dynamic"
    )
    return {
        "real_tokens": real,
        "used": used,
        **{
            name: {
                "tokens": total,
                "padding_tokens": total - real,
                "padding_percent": round(100.0 * (total - real) / total, 1) if total else 0.0,
            }
            for name, total in schemes.items()
        },
    }


def _padded_tokens(lengths: np.ndarray, batch: int, multiple: int) -> int:
    total = 0
    for start in range(0, len(lengths), batch):
        chunk = lengths[start : start + batch]
        total += len(chunk) * math.ceil(int(chunk.max()) / multiple) * multiple
    return total


# ---------------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------------


def memory_estimate(
    spec: JobSpec, settings: Settings, *, num_labels: int, longest: int | None
) -> dict[str, Any]:
    """Weights, gradients, AdamW's two moments and the activations of one training batch.

    Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
    Transformer Models"): s·b·h·(34 + 5·a·s/h) bytes per layer with 16-bit activations, twice that
    in fp32. Not counted: the CUDA context and the allocator's fragmentation (add ~0.5–1 GiB).
    """
    folder = api_model_folder(spec, settings)
    if folder is None:
        return {
            "status": "unknown",
            "reason": f"{spec.model_name_or_path!r} is a Hub id: the API does not fetch it",
        }
    config = read_config(folder)
    dims = _dimensions(config or {})
    if config is None or dims is None:
        return {
            "status": "unknown",
            "reason": "the model folder's config.json does not give the model's sizes",
        }
    hidden, layers, heads, intermediate = dims
    shapes = safetensors_shapes(folder)
    if shapes is not None:
        backbone, basis = count(shapes), "safetensors headers"
        has_head = any(name.split(".")[0] in ("classifier", "score") for name in shapes)
    else:
        backbone, basis = (
            _bert_style_parameters(config, hidden, layers, intermediate),
            "config.json (BERT-style)",
        )
        has_head = False
    head = 0 if has_head else hidden * num_labels + num_labels
    parameters = backbone + head
    if spec.apply_lora:
        trainable = _lora_parameters(spec, shapes, hidden, layers) + head
    elif spec.freeze_word_embeddings:
        # worker/training/loop.py's _build_model keeps the input embedding table as loaded (no gradient,
        # no optimizer state): on MiniLM half the parameters (22.7M planned was 11.0M trained).
        trainable = parameters - _word_embedding_parameters(config, shapes, hidden)
    else:
        trainable = parameters
    if not spec.trains:
        trainable = 0  # no gradient, no optimizer state
    # The spec's precision: a worker without bf16 units trains a `fast` job in fp32
    # (worker/training/precision.py), which this plan cannot know; the estimate is then low on activations.
    mixed = spec.mixed_precision != "no"
    sequence = spec.max_length if spec.pad_to_max_length or longest is None else longest
    batch = spec.per_device_train_batch_size if spec.trains else spec.per_device_eval_batch_size
    per_layer_16bit = sequence * batch * hidden * (34 + 5 * heads * sequence / hidden)
    # Without gradients (evaluation under no_grad) a layer's activations are freed once the next has
    # its input: about one layer's worth at a time, not every layer's.
    held_layers = layers if spec.trains else 1
    activations = int(held_layers * per_layer_16bit * (1 if mixed else 2))
    # fp32 master weights (the worker loads them so); autocast keeps 16-bit copies of them too.
    weights = 4 * parameters + (2 * parameters if mixed else 0)
    gradients, optimizer = 4 * trainable, 8 * trainable
    total = weights + gradients + optimizer + activations
    return {
        "status": "estimated",
        "basis": basis,
        "parameters": parameters,
        "trainable_parameters": trainable,
        "precision": spec.mixed_precision if mixed else "fp32",
        "batch": batch,
        "sequence_length": sequence,
        "bytes": {
            "weights": weights,
            "gradients": gradients,
            "optimizer": optimizer,
            "activations": activations,
            "total": total,
        },
        "total_gib": round(total / GIB, 3),
        "per_process": True,
    }


def _dimensions(config: dict[str, Any]) -> tuple[int, int, int, int] | None:
    """hidden size, layers, attention heads, feed-forward size, under the names models use for them."""

    def first(*names: str) -> int | None:
        for name in names:
            if isinstance(config.get(name), int) and config[name] > 0:
                return int(config[name])
        return None

    hidden = first("hidden_size", "dim", "d_model", "n_embd")
    layers = first("num_hidden_layers", "n_layers", "num_layers", "n_layer")
    heads = first("num_attention_heads", "n_heads", "encoder_attention_heads", "n_head")
    if hidden is None or layers is None or heads is None:
        return None
    return hidden, layers, heads, first("intermediate_size", "hidden_dim", "ffn_dim") or 4 * hidden


def _bert_style_parameters(config: dict[str, Any], hidden: int, layers: int, intermediate: int) -> int:
    def size(name: str) -> int:
        value = config.get(name)
        return value if isinstance(value, int) and value > 0 else 0

    vocab, positions, types = size("vocab_size"), size("max_position_embeddings"), size("type_vocab_size")
    embeddings = (vocab + positions + types) * hidden + 2 * hidden
    attention = 4 * hidden * hidden + 4 * hidden
    feed_forward = 2 * hidden * intermediate + intermediate + hidden
    norms = 4 * hidden
    pooler = hidden * hidden + hidden
    return embeddings + layers * (attention + feed_forward + norms) + pooler


# The input embedding table's name in the architectures the workers train (BERT, RoBERTa, DeBERTa,
# ELECTRA, ALBERT: word_embeddings; DistilBERT too; BART/T5-style: embed_tokens or shared; GPT-2: wte).
WORD_EMBEDDING_NAMES = ("word_embeddings.weight", "embed_tokens.weight", "wte.weight", "shared.weight")


def _word_embedding_parameters(
    config: dict[str, Any], shapes: dict[str, list[int]] | None, hidden: int
) -> int:
    """The parameters of the table that freeze_word_embeddings freezes (what the model's
    get_input_embeddings() returns): its shape in the safetensors header where there is one, else
    vocab_size × the embedding width (ALBERT's embedding_size, or the hidden size)."""
    for suffix in WORD_EMBEDDING_NAMES:
        found = [shape for name, shape in (shapes or {}).items() if name.endswith(suffix) and len(shape) == 2]
        if found:
            return found[0][0] * found[0][1]
    vocab, width = config.get("vocab_size"), config.get("embedding_size", hidden)
    return vocab * width if isinstance(vocab, int) and isinstance(width, int) else 0


def _lora_parameters(spec: JobSpec, shapes: dict[str, list[int]] | None, hidden: int, layers: int) -> int:
    targets = tuple(spec.lora_target_modules or DEFAULT_LORA_TARGETS)
    if shapes is None:
        return layers * 2 * spec.lora_r * 2 * hidden  # two square projections per layer
    total = 0
    for name, shape in shapes.items():
        parts = name.split(".")
        if len(shape) == 2 and parts[-1] == "weight" and len(parts) > 1 and parts[-2] in targets:
            total += spec.lora_r * (shape[0] + shape[1])
    return total


# ---------------------------------------------------------------------------------------------------
# Warnings: things that will run, but probably not as meant
# ---------------------------------------------------------------------------------------------------


def _warnings(
    spec: JobSpec, report: DataReport, schedule: dict[str, Any], tokens: dict[str, Any]
) -> list[str]:
    warnings = list(report.warnings)
    train = report.splits.get("train")
    if train is not None and spec.max_train_samples and spec.max_train_samples > train.rows:
        warnings.append(
            f"max_train_samples {spec.max_train_samples} is more than the {train.rows} training rows"
        )
    if train is not None and train.label_counts:
        absent = [name for name, n in train.label_counts.items() if n == 0]
        if absent:
            warnings.append(f"no training rows for label(s) {', '.join(absent)}")
    if schedule.get("status") == "known" and spec.trains:
        if spec.logging_steps > schedule["total_optimizer_steps"]:
            warnings.append(
                f"logging_steps {spec.logging_steps} is more than the {schedule['total_optimizer_steps']} "
                "optimizer steps: one training-loss row, at the end"
            )
        if schedule["warmup_steps"] >= schedule["total_optimizer_steps"]:
            warnings.append("the warmup lasts the whole run: the learning rate never reaches learning_rate")
    measured = tokens.get("train") if tokens.get("status") == "measured" else None
    if measured and measured["truncated_rows"] > 0.05 * measured["rows_measured"]:
        warnings.append(
            f"{measured['truncated_rows']} of {measured['rows_measured']} training rows measured are longer "
            f"than max_length {spec.max_length} and will be truncated"
        )
    return warnings
