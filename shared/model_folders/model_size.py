"""How large a model's declared shape is, from its config.json alone, refused past a setting.

A config.json names the sizes transformers builds the model from; a worker allocates whatever they
say before it reads a weight (`hidden_size` 10^6 asked a worker for 16 TB). The API estimates the
parameter count from those sizes and refuses a model past GLUEJOBS_MAX_MODEL_PARAMETERS at upload,
at submit and in the dry run, with the memory full fine-tuning would need (fp32 weights and
gradients, AdamW's two moments: 16 bytes a parameter).

The estimate is a transformer's: embeddings (vocabulary, positions, token types; ALBERT's factorised
embedding), and per layer four attention projections (eight in a decoder layer, which also attends to
the encoder) and the feed-forward block (three matrices where a gated MLP is declared by
`num_key_value_heads`, the Llama-style families). ALBERT shares its layers (`num_hidden_groups`), so
only the distinct ones count. Biases and norms are counted roughly: they are a rounding error beside
the matrices. A config that does not give a hidden size and a layer count is not sized (None): the
worker would build transformers' defaults for its family.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shared.core.errors import GluejobsError, InvalidRequest

# config.json is read whole at upload, submit and dry run; real ones are a few KB (id2label tables
# of thousands of labels stay under 1 MiB).
MAX_CONFIG_BYTES = 1024 * 1024
BYTES_PER_TRAINED_PARAMETER = 16  # fp32 weights, gradients, AdamW's two moments
GIB = 1024**3

HIDDEN = ("hidden_size", "d_model", "n_embd", "dim")
LAYERS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers")
DECODER_LAYERS = ("num_decoder_layers", "decoder_layers")
FEED_FORWARD = ("intermediate_size", "d_ff", "n_inner", "ffn_dim", "hidden_dim", "encoder_ffn_dim")
POSITIONS = ("max_position_embeddings", "n_positions")
OTHER_SIZES = ("vocab_size", "type_vocab_size", "embedding_size", "num_hidden_groups", "inner_group_num")


def read_config(path: Path) -> dict[str, Any] | None:
    """config.json as a dict, read no further than MAX_CONFIG_BYTES (None when missing, larger,
    not JSON or not an object): a local folder's file may be anything."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_CONFIG_BYTES:
        return None
    try:
        config = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        return None
    return config if isinstance(config, dict) else None


def estimate_parameters(
    config: dict[str, Any], *, field: str, error: type[GluejobsError] = InvalidRequest
) -> int | None:
    """The parameters the config's sizes declare (None when it gives no hidden size or layer count);
    `error` naming `field` for a size that is not a whole number, 0 or more."""
    sizes = _sizes(config, field=field, error=error)

    def first(names: tuple[str, ...]) -> int | None:
        return next((sizes[name] for name in names if name in sizes), None)

    hidden, layers = first(HIDDEN), first(LAYERS)
    if hidden is None or layers is None:
        return None
    decoder_layers = first(DECODER_LAYERS) or 0
    feed_forward = first(FEED_FORWARD) or 4 * hidden
    embedding = sizes.get("embedding_size", hidden)
    if config.get("model_type") == "albert":  # layers shared in groups: only the distinct ones hold weights
        layers = sizes.get("num_hidden_groups", 1) * sizes.get("inner_group_num", 1)
    vocab = sizes.get("vocab_size", 0)
    tokens = vocab + (first(POSITIONS) or 0) + sizes.get("type_vocab_size", 0)
    matrices = 3 if "num_key_value_heads" in config else 2
    block = matrices * hidden * feed_forward + feed_forward + 9 * hidden
    encoder_layer = 4 * hidden * hidden + block
    decoder_layer = 8 * hidden * hidden + block + 4 * hidden
    projection = embedding * hidden if embedding != hidden else 0
    output = vocab * hidden if config.get("tie_word_embeddings") is False else 0
    return tokens * embedding + projection + layers * encoder_layer + decoder_layers * decoder_layer + output


def check_model_size(
    config: dict[str, Any], max_parameters: int, *, field: str, error: type[GluejobsError] = InvalidRequest
) -> int | None:
    """The estimate of `estimate_parameters`; `error` naming `field` when it is past `max_parameters`
    (GLUEJOBS_MAX_MODEL_PARAMETERS), with the memory full fine-tuning it would take."""
    parameters = estimate_parameters(config, field=field, error=error)
    if parameters is not None and parameters > max_parameters:
        raise error(
            f"config.json declares a model of {_about(parameters)} parameters ({_memory(parameters)} to "
            f"fine-tune), more than the {_words(max_parameters)} this service accepts "
            "(GLUEJOBS_MAX_MODEL_PARAMETERS)",
            field=field,
        )
    return parameters


def _sizes(config: dict[str, Any], *, field: str, error: type[GluejobsError]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for name in (*HIDDEN, *LAYERS, *DECODER_LAYERS, *FEED_FORWARD, *POSITIONS, *OTHER_SIZES):
        if name not in config or config[name] is None:
            continue
        value = config[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise error(
                f"config.json's {name} must be a whole number, 0 or more, not {value!r:.40}", field=field
            )
        sizes[name] = value
    return sizes


# Past this a count is said as "more than": a config's sizes are Python ints of any length, and a
# float of their product overflowed (a hidden_size of 10**400 answered 500, found by
# tests/service/test_fuzz_bodies.py).
BEYOND_WORDS = 10**18


def _about(count: int) -> str:
    return "more than a million trillion" if count > BEYOND_WORDS else f"about {_words(count)}"


def _words(count: int) -> str:
    for unit, scale in (("trillion", 10**12), ("billion", 10**9), ("million", 10**6)):
        if count >= scale:
            return f"{count / scale:,.1f} {unit}"
    return f"{count:,}"


def _memory(parameters: int) -> str:
    if parameters > BEYOND_WORDS:
        return "more memory than any machine has"
    return f"about {parameters * BYTES_PER_TRAINED_PARAMETER / GIB:,.0f} GiB"
