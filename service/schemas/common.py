"""Bodies that no one resource owns: a page of a list, the error answer, the health answer, and the
limits of the labels (`metadata`) that jobs and sweeps carry."""

from __future__ import annotations

from typing import Annotated, Generic, TypeVar

from pydantic import BaseModel, Field

T = TypeVar("T")

MAX_METADATA_KEYS = 32
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512

# Constraints in the types (not in a validator) so the schema documents them and an error names the
# offending key: `metadata.<key>`.
MetadataKey = Annotated[str, Field(min_length=1, max_length=MAX_METADATA_KEY_CHARS)]
MetadataValue = Annotated[str, Field(max_length=MAX_METADATA_VALUE_CHARS)]


class Page(BaseModel, Generic[T]):
    data: list[T]
    has_more: bool
    next_cursor: str | None = Field(description="Pass as `after` for the next page")


class ProblemPublic(BaseModel):
    """One problem a check found (or one warning): where, a code a program can act on, a sentence."""

    field: str = Field(description="Where: spec.learning_rate, spec.train_file, file, priority …")
    code: str = Field(
        description="unknown_field, required, wrong_type, out_of_range, not_allowed, invalid_value, "
        "invalid_spec, invalid_data, not_found …; warnings: label_near_duplicate, rare_class, "
        "label_imbalance, long_rows …"
    )
    message: str


class ErrorBody(BaseModel):
    code: str
    message: str = Field(description="The first problem (with how many more there are)")
    field: str | None = Field(default=None, description="The first problem's field")
    errors: list[ProblemPublic] | None = Field(
        default=None,
        description="422: every problem found, the first as `field`/`message`; at most 50 (`errors_omitted` "
        "counts the rest)",
    )
    errors_omitted: int | None = Field(default=None, description="Problems found beyond those listed")
    warnings: list[ProblemPublic] | None = Field(
        default=None, description="What passed with a word of warning beside the refusal"
    )


class ErrorResponse(BaseModel):
    error: ErrorBody


class Health(BaseModel):
    status: str
    database: str | None = None
    detail: str | None = None
