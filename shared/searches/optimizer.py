"""Optuna's samplers and pruners over a study rebuilt from the database (ask-and-tell).

Every step of a search's driver rebuilds an in-memory study from the search_trials rows: finished
trials with their value and intermediate values, running ones with what was reported so far, and
each trial's system attributes (successive halving keeps its rungs there). New evaluations are then
reported (`Trial.report`) and judged (`Trial.should_prune`), and new trials are asked for
(`Study.ask` with the space's distributions). Nothing of Optuna's lives outside these rows, so any
API process can take over a search, and the sampler draws the same parameters for the same history:
each ask seeds the sampler from the search's seed and the trial's number.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shared.searches.config import Categorical, FloatRange, IntRange, Parameter

# Optuna (and numpy, which it imports) is imported in the functions that use it: the API imports this
# module at start for its routes and names, and a study is built only on a search's step, so that the
# API's start does not pay for their import (~0.6 s of CPU; issue 34 item 4).
if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution

RUNNING, COMPLETE, PRUNED, FAILED = "running", "complete", "pruned", "failed"
_STATES = {RUNNING: "RUNNING", COMPLETE: "COMPLETE", PRUNED: "PRUNED", FAILED: "FAIL"}  # TrialState's names


@dataclass
class TrialRecord:
    """A trial as the optimizer needs it (a search_trials row)."""

    number: int
    params: dict[str, Any]
    state: str = RUNNING
    value: float | None = None
    intermediate: dict[int, float] = field(default_factory=dict)  # evaluation number → value
    system_attrs: dict[str, Any] = field(default_factory=dict)


def distributions(space: dict[str, Parameter]) -> dict[str, BaseDistribution]:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    found: dict[str, BaseDistribution] = {}
    for name, parameter in space.items():
        if isinstance(parameter, FloatRange):
            found[name] = FloatDistribution(parameter.low, parameter.high, log=parameter.log)
        elif isinstance(parameter, IntRange):
            step = None if parameter.log else parameter.step
            found[name] = IntDistribution(parameter.low, parameter.high, log=parameter.log, step=step or 1)
        elif isinstance(parameter, Categorical):
            found[name] = CategoricalDistribution(parameter.choices)
    return found


def make_sampler(config: dict[str, Any], seed: int) -> optuna.samplers.BaseSampler:
    import optuna

    if config["type"] == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=config["n_startup_trials"])


def make_pruner(config: dict[str, Any]) -> optuna.pruners.BasePruner:
    import optuna

    kind = config["type"]
    if kind == "median":
        # Evaluations are numbered from 1 (the driver reports evaluation k as step k), and Optuna
        # prunes once step >= n_warmup_steps: shifted by one, so that a trial with n_warmup_steps=w
        # is never pruned at its first w evaluations (as in Optuna's own steps, which count from 0).
        return optuna.pruners.MedianPruner(
            n_startup_trials=config["n_startup_trials"], n_warmup_steps=config["n_warmup_steps"] + 1
        )
    if kind in ("asha", "successive_halving"):
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=config["min_resource"], reduction_factor=config["reduction_factor"]
        )
    return optuna.pruners.NopPruner()


class Optimizer:
    """One search's study, rebuilt from its trials (in number order, as Optuna numbers them)."""

    def __init__(
        self,
        *,
        space: dict[str, Parameter],
        direction: str,
        sampler: dict[str, Any],
        pruner: dict[str, Any],
        seed: int,
        trials: Iterable[TrialRecord],
    ) -> None:
        import optuna
        from optuna.study import StudyDirection
        from optuna.trial import TrialState, create_trial

        # Here, not at import: Optuna announces each study it creates at INFO.
        optuna.logging.set_verbosity(logging.WARNING)
        self.distributions = distributions(space)
        self._sampler, self._seed = sampler, seed
        way = StudyDirection.MAXIMIZE if direction == "maximize" else StudyDirection.MINIMIZE
        self.study = optuna.create_study(direction=way, pruner=make_pruner(pruner))
        for number, record in enumerate(sorted(trials, key=lambda t: t.number)):
            if record.number != number:
                raise ValueError(f"trial numbers must run 0, 1, …: found {record.number} at {number}")
            state = TrialState[_STATES[record.state]]
            self.study.add_trial(
                create_trial(
                    state=state,
                    value=record.value if state == TrialState.COMPLETE else None,
                    params=record.params,
                    distributions=self.distributions,
                    intermediate_values=dict(record.intermediate),
                    system_attrs=dict(record.system_attrs),
                )
            )

    def ask(self) -> tuple[int, dict[str, Any]]:
        """The next trial's number and parameters (a running trial of the study from now on)."""
        number = len(self.study.trials)
        self.study.sampler = make_sampler(self._sampler, (self._seed + number) % 2**32)
        trial = self.study.ask(self.distributions)
        return trial.number, dict(trial.params)

    def report(self, number: int, values: Sequence[tuple[int, float]], *, may_prune: bool) -> int | None:
        """Report a running trial's new evaluations (evaluation number, value) in order; the
        evaluation at which the pruner stops it (when `may_prune`), or None. Evaluations after that
        one are not reported."""
        import optuna

        frozen = self.study.trials[number]
        trial = optuna.Trial(self.study, frozen._trial_id)
        for step, value in values:
            trial.report(value, step)
            # Asked even when the answer cannot be acted on (the trial has ended): successive
            # halving records the trial's rungs as it answers, and the other trials are judged by them.
            if trial.should_prune() and may_prune:
                return step
        return None

    def system_attrs(self, number: int) -> dict[str, Any]:
        return dict(self.study.trials[number].system_attrs)


def best_value(values: Iterable[float], direction: str) -> float:
    """A trial's value: its best evaluation (a GLUE paper keeps the best dev score over epochs)."""
    return max(values) if direction == "maximize" else min(values)


def best_trial(records: Iterable[TrialRecord], direction: str) -> TrialRecord | None:
    """The completed trial with the best value; the first of equals."""
    done = [r for r in records if r.state == COMPLETE and r.value is not None]
    if not done:
        return None
    sign = 1.0 if direction == "maximize" else -1.0
    return max(done, key=lambda r: (sign * (r.value or 0.0), -r.number))
