"""What a model name may look like: one rule for the API and the worker.

A job names its model as a folder under GLUEJOBS_MODELS_DIR (relative to it, or absolute inside it)
or as a Hugging Face Hub id. The API checks the name when the job is submitted and every worker checks
it again before it loads anything (a stored spec is not trusted), both through `check_model_name`, so
the API never accepts a name that a worker would refuse. Names are refused, not rewritten: a job's
spec says exactly what ran.
"""

from __future__ import annotations

import re

# The longest file name (one path component) that Linux filesystems take (NAME_MAX), in bytes.
NAME_MAX_BYTES = 255
MAX_MODEL_NAME_CHARS = 512

# huggingface_hub's validate_repo_id: "name" or "org/name", each part 1 to 96 of [A-Za-z0-9_.-],
# starting and ending with [A-Za-z0-9_]; no "--" or "..", no ".git" at the end.
_HUB_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_HUB_ID = re.compile(rf"{_HUB_PART}(?:/{_HUB_PART})?")


def is_hub_id(name: str) -> bool:
    """Whether the Hugging Face Hub would take `name` as a model id."""
    return (
        bool(_HUB_ID.fullmatch(name)) and "--" not in name and ".." not in name and not name.endswith(".git")
    )


def check_model_name(name: str) -> str:
    """`name` itself, or a ValueError that says what is wrong with it.

    Refused: empty names, surrounding spaces, control characters, text that is not UTF-8 (lone
    surrogates), a trailing slash, empty components (`org//name`), `.` and `..` components (`.`,
    `org/..`, `../x`), components longer than a file name can be (ENAMETOOLONG otherwise), and names
    longer than MAX_MODEL_NAME_CHARS.
    """
    if not name:
        raise ValueError("the model name is empty")
    if len(name) > MAX_MODEL_NAME_CHARS:
        raise ValueError(f"the model name is longer than {MAX_MODEL_NAME_CHARS} characters")
    if name != name.strip():
        raise ValueError("the model name starts or ends with a space")
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in name):
        raise ValueError("the model name contains a control character")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the model name is not valid UTF-8 text") from None
    if name.endswith("/"):
        raise ValueError("the model name ends with '/': name the folder without it")
    parts = name.removeprefix("/").split("/")
    if "" in parts:
        raise ValueError("the model name has an empty component ('//')")
    if any(part in (".", "..") for part in parts):
        raise ValueError("the model name has a '.' or '..' component: name the folder itself")
    if any(len(part.encode("utf-8")) > NAME_MAX_BYTES for part in parts):
        raise ValueError(
            f"a component of the model name is longer than {NAME_MAX_BYTES} bytes (a file name's limit)"
        )
    return name
