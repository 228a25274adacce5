"""Batches: the training and evaluation data loaders, length-grouped batches (Trainer's
group_by_length, and its shuffled variant for the fast path), padding, and each epoch's order."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow.compute
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase, default_data_collator
from transformers.trainer_pt_utils import LengthGroupedSampler

from worker.training.data import TokenizedData, longest_first


def make_dataloaders(
    data: TokenizedData,
    tokenizer: PreTrainedTokenizerBase,
    *,
    pad_to_max_length: bool,
    group_by_length: bool,
    shuffle_length_groups: bool = False,
    group_eval_by_length: bool = False,
    train_batch_size: int,
    eval_batch_size: int,
    seed: int,
    pad_to_multiple_of: int | None = None,
) -> tuple[DataLoader, dict[str, DataLoader], LengthGroupedSampler | None, dict[str, np.ndarray | None]]:
    """The training loader, the evaluation loaders, the training loader's length-grouped sampler
    (None without group_by_length) and, for sorted evaluation, each split's order."""
    collate = collator(tokenizer, pad_to_max_length=pad_to_max_length, pad_to_multiple_of=pad_to_multiple_of)
    assert data.train is not None, "a job that trains has its training rows"
    sampler = None
    if group_by_length:
        # Batches of similar lengths waste less compute on padding (Trainer's group_by_length).
        lengths = pyarrow.compute.list_value_length(data.train.data.column("input_ids")).to_pylist()
        grouped = ShuffledLengthGroups if shuffle_length_groups else LengthGroupedSampler
        sampler = grouped(train_batch_size, lengths=lengths)
    train = DataLoader(
        data.train,
        shuffle=sampler is None,
        sampler=sampler,
        collate_fn=collate,
        batch_size=train_batch_size,
        # A generator of its own: otherwise each epoch's iterator draws from the global RNG, and a
        # resumed run's dropout masks would drift from those of the run it continues.
        generator=torch.Generator().manual_seed(seed),
    )
    evals, orders = eval_dataloaders(
        data, collate, group_eval_by_length=group_eval_by_length, eval_batch_size=eval_batch_size
    )
    return train, evals, sampler, orders


def eval_dataloaders(
    data: TokenizedData, collate: Any, *, group_eval_by_length: bool, eval_batch_size: int
) -> tuple[dict[str, DataLoader], dict[str, np.ndarray | None]]:
    """Each evaluation split's loader and, for sorted evaluation, its order."""
    evals: dict[str, DataLoader] = {}
    orders: dict[str, np.ndarray | None] = {}
    for split, rows in data.evals.items():
        orders[split] = None
        if group_eval_by_length:
            rows, orders[split] = longest_first(rows)
        evals[split] = DataLoader(rows, collate_fn=collate, batch_size=eval_batch_size)
    return evals, orders


class ShuffledLengthGroups(LengthGroupedSampler):
    """LengthGroupedSampler's batches, in a shuffled order.

    Trainer's sampler sorts megabatches of 50 batches by length, so an epoch runs as a few stretches
    of batches from the longest rows to the shortest. These are the same batches (the same rows
    together, so the same padding), drawn in a random order (from the same generator, so a seed and
    an epoch give one order); a last, partial batch stays last, where the DataLoader cuts it."""

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        size = self.batch_size
        full = len(indices) // size
        batches = [indices[i * size : (i + 1) * size] for i in range(full)]
        for position in torch.randperm(full, generator=self.generator).tolist():
            yield from batches[position]
        yield from indices[full * size :]


def pad_multiple(accelerator: Accelerator) -> int | None:
    """8 under mixed precision on CUDA, where tensor cores want dimensions in multiples of 8 (the
    script's rule, which it applies on every device); elsewhere (CPUs) it only adds padded tokens."""
    return 8 if accelerator.mixed_precision != "no" and accelerator.device.type == "cuda" else None


def collator(
    tokenizer: PreTrainedTokenizerBase, *, pad_to_max_length: bool, pad_to_multiple_of: int | None
) -> Callable[..., Any]:
    if pad_to_max_length:
        return default_data_collator
    return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad_to_multiple_of)


def epoch_batches(
    accelerator: Accelerator,
    dataloader: Any,
    length_sampler: LengthGroupedSampler | None,
    *,
    seed: int,
    epoch: int,
    skip: int,
) -> Any:
    """The epoch's training batches, in the order (seed, epoch) gives them; on resuming, without
    the `skip` first ones (already trained on)."""
    if length_sampler is not None:
        length_sampler.generator = torch.Generator().manual_seed(seed + epoch)
    if hasattr(dataloader, "set_epoch"):
        dataloader.set_epoch(epoch)
    if skip:
        return accelerator.skip_first_batches(dataloader, skip)
    return dataloader
