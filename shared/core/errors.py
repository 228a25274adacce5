"""One exception hierarchy for gluejobs; the API maps it to HTTP in one handler.

Each class's docstring is its default message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

# An answer lists at most this many problems (and says how many more there were): a spec with 10,000
# unknown keys is refused in a bounded answer.
MAX_PROBLEMS = 50


@dataclass(frozen=True)
class Problem:
    """One thing a check found: where (`spec.learning_rate`, `file`), a code a program can act on
    (`unknown_field`, `invalid_data`, `rare_class` …) and the sentence a person reads. Refusals and
    warnings both take this shape."""

    field: str
    code: str
    message: str

    def line(self) -> str:
        """The one-line form every problem takes: `field: message`."""
        return self.message if self.message.startswith(f"{self.field}: ") else f"{self.field}: {self.message}"

    def as_dict(self) -> dict[str, str]:
        return {"field": self.field, "code": self.code, "message": self.message}

    def under(self, prefix: str) -> Problem:
        """The problem located under `prefix` (a spec's `train_file` is a request's `spec.train_file`)."""
        return Problem(f"{prefix}.{self.field}", self.code, self.message)


class GluejobsError(Exception):
    """Something went wrong in gluejobs.

    A check that found several problems raises one error carrying them all (`problems`); its message
    and field are the first's, so code that reads only those still reads a true sentence.
    """

    status_code = 500
    code = "internal_error"

    def __init__(
        self,
        message: str | None = None,
        *,
        field: str | None = None,
        problems: Sequence[Problem] = (),
    ) -> None:
        if problems and message is None:
            message, field = problems[0].message, problems[0].field
        self.message = message or (self.__doc__ or "").strip()
        self.field = field
        self._problems = tuple(problems)
        super().__init__(self.message)

    @property
    def problems(self) -> tuple[Problem, ...]:
        """Every problem found; a plain error is its own one problem. A field of "" names the whole
        (the request, or the spec): the API's answer says which."""
        if self._problems:
            return self._problems
        return (Problem(self.field or "", self.code, self.message),)


class InvalidSpec(GluejobsError):
    """The job spec is invalid."""

    status_code = 422
    code = "invalid_spec"


class InvalidRequest(GluejobsError):
    """The request is invalid."""

    status_code = 422
    code = "invalid_request"


class NotFound(GluejobsError):
    """No such object."""

    status_code = 404
    code = "not_found"


class Conflict(GluejobsError):
    """The object is not in a state that allows this."""

    status_code = 409
    code = "conflict"


class Unauthorized(GluejobsError):
    """A valid `Authorization: Bearer <key>` header is required."""

    status_code = 401
    code = "unauthorized"


class Forbidden(GluejobsError):
    """This key may not do this."""

    status_code = 403
    code = "forbidden"


class TooBusy(GluejobsError):
    """The API is busy with other requests of this kind; try again shortly."""

    status_code = 429
    code = "too_many_requests"

    def __init__(self, message: str | None = None, *, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RateLimited(TooBusy):
    """This key has made too many requests; try again after Retry-After seconds."""

    code = "rate_limited"


class OverQuota(TooBusy):
    """The owner's quota does not allow this."""

    code = "over_quota"


class JobFailed(GluejobsError):
    """The job failed."""


class StaleClaim(GluejobsError):
    """This process's claim on the job is no longer the current one (its lease ran out and the job
    was handed to another attempt): its writes are refused and it must stop."""

    status_code = 409
    code = "stale_claim"


# Error messages quote at most this much of a value a client sent: enough to recognise it, and a
# 100,000-character string is not echoed back (nor written to logs) whole.
QUOTE_CHARS = 40


def shorten(text: str, limit: int = QUOTE_CHARS) -> str:
    """`text` cut to its first `limit` characters (a field name made of a key the client sent …)."""
    return text if len(text) <= limit else f"{text[:limit]}…"


def quote(value: object, limit: int = QUOTE_CHARS) -> str:
    """`repr` of a value for an error message, cut to its first `limit` characters."""
    text = value if isinstance(value, str) else str(value)
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}… ({len(text)} characters)"


def field_error(field: str, message: str, value: object = None) -> ValidationError:
    """A pydantic ValidationError located at `field`, for model-level checks that concern one field.

    Raised inside a validator, it nests under the parent's location (so the API reports `spec.<field>`).
    """
    return ValidationError.from_exception_data(
        "JobSpec",
        [InitErrorDetails(type=PydanticCustomError("invalid_spec", message), loc=(field,), input=value)],
    )


def field_errors(found: Sequence[tuple[str, str]]) -> ValidationError:
    """One pydantic ValidationError for several model-level problems (`(field, message)` each), so a
    spec's every incoherence is refused at once rather than the first of them."""
    return ValidationError.from_exception_data(
        "JobSpec",
        [
            InitErrorDetails(type=PydanticCustomError("invalid_spec", message), loc=(field,), input=None)
            for field, message in found
        ],
    )
