"""What a search is made of, as POST /v1/searches takes it and the searches table stores it: the
space (float and int ranges, on a log scale or not, and categorical choices), the objective, the
sampler and the pruner. Pydantic models, so that a bad value is a 422 naming its field."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_TRIALS = 100
MAX_PARALLELISM = 32
MAX_CHOICES = 50
# Evaluations a pruner's settings may count (a job evaluates once per eval_steps: far fewer than this).
MAX_EVALUATIONS = 1_000_000

Choice = bool | int | float | str


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# A range's ends, in size: Optuna draws from a float range with NumPy's uniform(low, high), which
# refuses a width past the largest float (±1.7e308 answered 500, issue 32), and draws an int range's
# values through floats too: TPE failed outright on ±10**30, and its truncated normals divided by
# zero past 2**47 on a log scale and 2**51 on a linear one. A 32-bit int's range is far more than
# any count a spec takes.
MAX_FLOAT_BOUND = 1e300
MAX_INT_BOUND = 2**31


class FloatRange(_Strict):
    type: Literal["float"]
    low: float = Field(ge=-MAX_FLOAT_BOUND, le=MAX_FLOAT_BOUND)
    high: float = Field(ge=-MAX_FLOAT_BOUND, le=MAX_FLOAT_BOUND)
    log: bool = Field(default=False, description="Sample on a log scale (learning rates)")

    @model_validator(mode="after")
    def _ordered(self) -> FloatRange:
        if not self.low < self.high:
            raise ValueError("low must be below high")
        if self.log and self.low <= 0:
            raise ValueError("a log scale needs low > 0")
        return self


class IntRange(_Strict):
    type: Literal["int"]
    low: int = Field(ge=-MAX_INT_BOUND, le=MAX_INT_BOUND)
    high: int = Field(ge=-MAX_INT_BOUND, le=MAX_INT_BOUND)
    step: int = Field(default=1, ge=1, le=MAX_INT_BOUND)
    log: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> IntRange:
        if not self.low < self.high:
            raise ValueError("low must be below high")
        if self.step > self.high - self.low:
            raise ValueError("step must be at most high - low: a range of one value is no search")
        if self.log and (self.low < 1 or self.step != 1):
            raise ValueError("a log scale needs low >= 1 and step 1")
        return self


class Categorical(_Strict):
    type: Literal["categorical"]
    choices: list[Choice] = Field(min_length=1, max_length=MAX_CHOICES)

    @model_validator(mode="after")
    def _distinct(self) -> Categorical:
        if len({repr(c) for c in self.choices}) != len(self.choices):
            raise ValueError("choices repeat: each choice once")
        return self


Parameter = Annotated[FloatRange | IntRange | Categorical, Field(discriminator="type")]


class Objective(_Strict):
    metric: str | None = Field(
        default=None,
        description="An evaluation metric the trials report (accuracy, f1, matthews_correlation, pearson, "
        "loss …); default: the task's main metric",
    )
    direction: Literal["maximize", "minimize"] | None = Field(
        default=None, description="Default: the metric's own (larger is better but for loss and mse)"
    )


class Sampler(_Strict):
    type: Literal["tpe", "random"] = "tpe"
    n_startup_trials: int = Field(
        default=4, ge=0, le=MAX_TRIALS, description="TPE: random trials before it models the space"
    )
    seed: int | None = Field(
        default=None,
        ge=0,
        lt=2**31,
        description="The sampler's seed (drawn when absent): two searches with one seed and the random "
        "sampler draw the same trials",
    )


class Pruner(_Strict):
    type: Literal["median", "asha", "successive_halving", "none"] = Field(
        default="median",
        description="median: stop a trial whose value is worse than the median of the others at the same "
        "evaluation; asha / successive_halving: Optuna's asynchronous successive halving; none",
    )
    n_startup_trials: int = Field(
        default=2, ge=0, le=MAX_TRIALS, description="median: trials that finish before any is pruned"
    )
    n_warmup_steps: int = Field(
        default=0,
        ge=0,
        le=MAX_EVALUATIONS,
        description="median: evaluations a trial makes before it can be pruned (1: never at its first)",
    )
    min_resource: int = Field(
        default=1, ge=1, le=MAX_EVALUATIONS, description="asha: evaluations before the first rung"
    )
    reduction_factor: int = Field(default=2, ge=2, le=10, description="asha: 1/reduction_factor go on")


def dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json")
