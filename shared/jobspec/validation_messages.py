"""Validation errors in the user's words: one line naming the field, what was wrong, and the near match.

pydantic words its errors for Python programmers ("Input should be a valid integer, unable to parse
string as an integer", "Extra inputs are not permitted", "Value error, …"). Every place that reports
a spec it refused — the API's handler, a sweep's combinations, a rerun, and the CLI's own checks
before it sends anything — turns pydantic's errors into messages through `problem`, so a user reads
the same line wherever the spec was refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from shared.core.errors import quote
from shared.jobspec.suggest import did_you_mean

# pydantic's error types, by what the user must give instead.
_MUST_BE = {
    "int_parsing": "a whole number",
    "int_type": "a whole number",
    "int_from_float": "a whole number",
    "float_parsing": "a number",
    "float_type": "a number",
    "finite_number": "a finite number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "text",
    "list_type": "a list",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}
_BOUNDS = {
    "greater_than": ("gt", "greater than"),
    "greater_than_equal": ("ge", "at least"),
    "less_than": ("lt", "less than"),
    "less_than_equal": ("le", "at most"),
}
_QUOTED = re.compile(r"'((?:[^'\\]|\\.)*)'")
# Locations that are the request's parts, not fields the user named.
_REQUEST_PARTS = ("body", "query", "path", "header")


@dataclass(frozen=True)
class Problem:
    """One refused value: where (`spec.learning_rate`), and what was wrong with it."""

    field: str | None
    message: str

    def line(self) -> str:
        """The one-line form every error takes: `field: message`."""
        return f"{self.field}: {self.message}" if self.field else self.message


def location(loc: Sequence[int | str], *, prefix: str = "") -> str | None:
    """`("body", "spec", "learning_rate")` as `spec.learning_rate`; parts a client chose (metadata
    keys) are cut short by the caller's own rules."""
    parts = [str(part) for part in loc if part not in _REQUEST_PARTS]
    joined = ".".join(parts)
    if prefix and joined:
        return f"{prefix}.{joined}"
    return joined or (prefix or None)


def message(error: Mapping[str, Any], known: Callable[[tuple[Any, ...]], Iterable[str]] | None = None) -> str:
    """One pydantic error (`ValidationError.errors()` item) in the user's words. `known(loc)` names
    the fields that the object holding an unknown field does take, for "did you mean"."""
    kind = str(error.get("type", ""))
    ctx = error.get("ctx") or {}
    given = error.get("input")
    loc = tuple(error.get("loc") or ())
    if kind == "extra_forbidden":
        name = str(loc[-1]) if loc else ""
        choices = list(known(loc[:-1])) if known else []
        return "unknown field" + (did_you_mean(name, choices) if choices else "")
    if kind == "missing":
        return "is required"
    if kind in _MUST_BE:
        return f"must be {_MUST_BE[kind]}{_not(given)}"
    if kind in _BOUNDS:
        key, words = _BOUNDS[kind]
        return f"must be {words} {_number(ctx.get(key))}{_not(given)}"
    if kind in ("literal_error", "enum"):
        choices = _QUOTED.findall(str(ctx.get("expected", "")))
        hint = did_you_mean(str(given), choices) if isinstance(given, str) else ""
        return f"must be one of {', '.join(choices)}{_not(given)}{hint}"
    if kind == "string_too_short":
        least = ctx.get("min_length", 1)
        return "must not be empty" if least == 1 else f"must be at least {least} characters"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters"
    if kind == "too_long":
        return f"must hold at most {ctx.get('max_length')} items"
    if kind == "too_short":
        return f"must hold at least {ctx.get('min_length')} items"
    text = str(error.get("msg", "is not valid"))
    # Our own validators' messages (ValueError, field_error) are already in the user's words.
    return (
        text.removeprefix("Value error, ")
        .removeprefix("Assertion failed, ")
        .replace("Input should be", "must be")
    )


def code(error: Mapping[str, Any]) -> str:
    """A code for one pydantic error that a program can act on: `unknown_field`, `required`,
    `wrong_type`, `out_of_range`, `not_allowed` (not one of the choices), else `invalid_value`."""
    kind = str(error.get("type", ""))
    if kind == "extra_forbidden":
        return "unknown_field"
    if kind == "missing":
        return "required"
    if kind in _MUST_BE:
        return "wrong_type"
    if kind in _BOUNDS or kind in ("string_too_short", "string_too_long", "too_long", "too_short"):
        return "out_of_range"
    if kind in ("literal_error", "enum"):
        return "not_allowed"
    if kind in _OWN_CODES:  # our own checks' codes (field_errors, the data checks' problems)
        return kind
    return "invalid_value"


# Codes our own checks give their pydantic errors (shared/core/errors.field_error and the data checks).
_OWN_CODES = ("invalid_spec", "invalid_data", "not_found")


def problem(
    exc: ValidationError,
    *,
    prefix: str = "",
    known: Callable[[tuple[Any, ...]], Iterable[str]] | None = None,
) -> Problem:
    """The first of `exc`'s errors (and how many more there are), located under `prefix`."""
    errors = exc.errors()
    first = errors[0]
    field = location(tuple(first.get("loc") or ()), prefix=prefix)
    text = message(first, known)
    if len(errors) > 1:
        others = [location(tuple(e.get("loc") or ()), prefix=prefix) for e in errors[1:]]
        text += f" (and {len(errors) - 1} more: {', '.join(o for o in others if o)})"
    return Problem(field, text)


def _number(value: Any) -> Any:
    """0.0 as 0, as a person writes a bound; a large one stays 1e+300 (not its 301 digits)."""
    whole = isinstance(value, float) and value.is_integer() and abs(value) < _WHOLE_UP_TO
    return int(value) if whole else value


_WHOLE_UP_TO = 1e15


def _not(given: Any) -> str:
    if isinstance(given, (str, int, float)) and not isinstance(given, bool):
        return f", not {quote(given)}" if isinstance(given, str) else f", not {given}"
    return ""
