"""What a dry run's tokenizer runs: in a child process under limits (service/bounded_child.py), never in
the API's own.

A fast tokenizer's tokenizer.json is a program as much as a file: its normalizer and pre-tokenizer
hold regular expressions (Oniguruma's, which backtrack), and a registered model's are its owner's. A
`Split` on `^(a+)+$` took 0.28 s a row; on longer rows Oniguruma gives up and the Rust library
panics (PanicException, which derives from BaseException). In the child, the worst either does is
use up that dry run's limits. The forkserver imports this module (and so `tokenizers`) once; it
never tokenises there: a tokenizer that has run its thread pool before a fork turns parallelism off
in every child.
"""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer


def measure(path: str, splits: list[tuple[str, list[Any]]]) -> tuple[str, Any]:
    """("measured", {split: each row's token count, untruncated}), or ("unreadable", the exception's type)
    for a tokenizer.json the library cannot load."""
    # numpy here, not at the top: the API imports this module at start (a dry run names `measure` to
    # its child) and never measures; the child's forkserver has numpy imported already.
    import numpy as np

    try:
        tokenizer = Tokenizer.from_file(path)
    except Exception as exc:  # the tokenizers library raises its own exception types for a bad file
        return "unreadable", type(exc).__name__
    tokenizer.no_padding()
    tokenizer.no_truncation()  # the plan truncates, so truncated rows can be counted
    lengths = {
        name: np.array([len(encoding.ids) for encoding in tokenizer.encode_batch(inputs)], dtype=np.int64)
        for name, inputs in splits
    }
    return "measured", lengths
