"""The GLUE metric shipped as a local `evaluate` module: loaded through evaluate without the Hub, the
GLUE metric's definitions and names (checked by hand and against the formulas of evaluate's GLUE
metric), what jobs on their own files report, and no NaN for undefined cases."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import f1_score, matthews_corrcoef

from shared.jobspec.metric_rules import metric_plan, possible_metrics, task_plan
from shared.jobspec.tasks import TASKS
from worker.training.glue_metric import GLUE_MODULE, compute_plan, glue_module

RNG = np.random.default_rng(0)
CLASS_PREDS = RNG.integers(0, 2, size=200)
CLASS_REFS = np.where(RNG.random(200) < 0.7, CLASS_PREDS, 1 - CLASS_PREDS)
SCORES_REFS = RNG.uniform(0, 5, size=200)
SCORES_PREDS = SCORES_REFS + RNG.normal(0, 1.5, size=200)


@pytest.fixture(autouse=True)
def no_warnings() -> Iterator[None]:
    """Every metric here must be computed without a warning (they end up in worker logs)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def metrics_for(task_name: str, preds: np.ndarray, refs: np.ndarray) -> dict[str, float]:
    """A GLUE task's evaluation, scored as the training loop scores it."""
    task = TASKS[task_name]
    plan = metric_plan(task_name, is_regression=task.is_regression, num_labels=task.num_labels)
    return compute_plan(plan, preds, refs)


def own_files(preds: np.ndarray, refs: np.ndarray, *, num_labels: int) -> dict[str, float]:
    """A job on its own files, scored as the training loop scores it (num_labels 1: scores)."""
    return compute_plan(metric_plan(None, is_regression=num_labels == 1, num_labels=num_labels), preds, refs)


@pytest.mark.parametrize("task_name", list(TASKS))
def test_each_task_reports_its_metric_names_as_plain_floats(task_name: str) -> None:
    task = TASKS[task_name]
    preds, refs = (SCORES_PREDS, SCORES_REFS) if task.is_regression else (CLASS_PREDS, CLASS_REFS)

    metrics = metrics_for(task_name, preds, refs)

    assert tuple(metrics) == task_plan(task_name).names
    assert all(type(value) is float for value in metrics.values())


def test_accuracy_by_hand() -> None:
    metrics = metrics_for("sst2", np.array([0, 1, 1, 0]), np.array([0, 1, 0, 0]))

    assert metrics == {"accuracy": 0.75}


def test_accuracy_and_f1_by_hand() -> None:
    # tp=2, fp=1, fn=1: precision = recall = f1 = 2/3; accuracy 2/4.
    metrics = metrics_for("mrpc", np.array([1, 1, 1, 0]), np.array([1, 0, 1, 1]))

    assert metrics == pytest.approx({"accuracy": 0.5, "f1": 2 / 3, "combined_score": (0.5 + 2 / 3) / 2})


@pytest.mark.parametrize("task_name", ["mrpc", "qqp"])
def test_accuracy_and_f1_agree_with_sklearn(task_name: str) -> None:
    metrics = metrics_for(task_name, CLASS_PREDS, CLASS_REFS)

    f1 = f1_score(CLASS_REFS, CLASS_PREDS)
    accuracy = float(np.mean(CLASS_PREDS == CLASS_REFS))
    assert metrics == pytest.approx({"accuracy": accuracy, "f1": f1, "combined_score": (accuracy + f1) / 2})


def test_matthews_correlation_agrees_with_sklearn_and_by_hand() -> None:
    assert metrics_for("cola", CLASS_PREDS, CLASS_REFS) == pytest.approx(
        {"matthews_correlation": matthews_corrcoef(CLASS_REFS, CLASS_PREDS)}
    )
    labels = np.array([0, 1, 1, 0, 1])
    assert metrics_for("cola", labels, labels) == {"matthews_correlation": 1.0}
    assert metrics_for("cola", 1 - labels, labels) == {"matthews_correlation": -1.0}


def test_pearson_and_spearman_agree_with_scipy() -> None:
    metrics = metrics_for("stsb", SCORES_PREDS, SCORES_REFS)

    pearson = pearsonr(SCORES_PREDS, SCORES_REFS)[0]
    spearman = spearmanr(SCORES_PREDS, SCORES_REFS)[0]
    expected = {"pearson": pearson, "spearmanr": spearman, "combined_score": (pearson + spearman) / 2}
    assert metrics == pytest.approx(expected)


def test_spearman_sees_rank_order_where_pearson_sees_a_curve() -> None:
    refs = np.array([1.0, 2.0, 3.0, 4.0])

    metrics = metrics_for("stsb", refs**3, refs)

    assert metrics["spearmanr"] == pytest.approx(1.0)
    assert 0.9 < metrics["pearson"] < 1.0


def test_regression_output_of_shape_n_by_1_is_accepted() -> None:
    metrics = metrics_for("stsb", SCORES_PREDS[:, None], SCORES_REFS)

    assert metrics == metrics_for("stsb", SCORES_PREDS, SCORES_REFS)


@pytest.mark.parametrize(
    ("is_regression", "names"),
    [
        (False, ("accuracy", "f1", "combined_score")),
        (True, ("pearson", "spearmanr", "combined_score", "mse")),
    ],
)
def test_jobs_on_their_own_files(is_regression: bool, names: tuple[str, ...]) -> None:
    preds, refs = (SCORES_PREDS, SCORES_REFS) if is_regression else (CLASS_PREDS, CLASS_REFS)

    metrics = own_files(preds, refs, num_labels=1 if is_regression else 2)

    assert tuple(metrics) == names
    assert set(metrics) <= set(possible_metrics(None))


def test_own_binary_labels_give_f1_and_own_scores_give_mse_by_hand() -> None:
    # The Trainer page's example: two classes, F1 beside accuracy. tp=1, fp=1, fn=1 → F1 = 1/2.
    binary = own_files(np.array([1, 1, 0, 0]), np.array([1, 0, 1, 0]), num_labels=2)
    assert binary == pytest.approx({"accuracy": 0.5, "f1": 0.5, "combined_score": 0.5})

    # Errors 0.5, -1 and 0: mse (0.25 + 1 + 0) / 3; Pearson and Spearman as for STS-B.
    scores = own_files(np.array([1.5, 1.0, 3.0]), np.array([1.0, 2.0, 3.0]), num_labels=1)
    assert scores["mse"] == pytest.approx(1.25 / 3)
    assert scores["spearmanr"] == pytest.approx(0.5)
    assert scores["combined_score"] == pytest.approx((scores["pearson"] + scores["spearmanr"]) / 2)


def test_many_classes_on_own_files() -> None:
    metrics = own_files(np.array([0, 4, 2, 2]), np.array([0, 4, 2, 3]), num_labels=5)

    assert metrics == {"accuracy": 0.75}
    assert own_files(np.array([0, 1]), np.array([0, 1]), num_labels=3) == {"accuracy": 1.0}


def test_the_glue_metric_is_a_local_evaluate_module(monkeypatch: pytest.MonkeyPatch) -> None:
    import evaluate

    monkeypatch.setenv("HF_EVALUATE_OFFLINE", "1")  # nothing may come from the Hub
    module = evaluate.load(str(GLUE_MODULE), config_name="qqp", keep_in_memory=True)

    assert isinstance(module, evaluate.EvaluationModule)
    assert (module.name, module.config_name) == ("glue", "qqp")
    assert module.compute(predictions=[1, 1, 0, 0], references=[1, 0, 1, 0]) == {"accuracy": 0.5, "f1": 0.5}
    assert glue_module("cola") is glue_module("cola")  # loaded once per process
    with pytest.raises(KeyError, match="unknown GLUE configuration"):
        evaluate.load(str(GLUE_MODULE), config_name="squad", keep_in_memory=True)


# The formulas of evaluate's GLUE metric (its glue.py), written out here to check the module against.
def _evaluate_glue_formulas(config: str, preds: np.ndarray, refs: np.ndarray) -> dict[str, float]:
    if config == "cola":
        return {"matthews_correlation": matthews_corrcoef(refs, preds)}
    if config == "stsb":
        return {"pearson": pearsonr(preds, refs)[0], "spearmanr": spearmanr(preds, refs)[0]}
    if config in ("mrpc", "qqp"):
        return {"accuracy": (preds == refs).mean(), "f1": f1_score(y_true=refs, y_pred=preds)}
    return {"accuracy": (preds == refs).mean()}


@pytest.mark.parametrize("config", ["cola", "stsb", "mrpc", "qqp", "sst2", "mnli", "mnli_mismatched", "rte"])
def test_the_module_agrees_with_evaluates_glue_formulas(config: str) -> None:
    preds, refs = (SCORES_PREDS, SCORES_REFS) if config == "stsb" else (CLASS_PREDS, CLASS_REFS)

    scored = glue_module(config).compute(predictions=preds, references=refs)

    # The module stores stsb's inputs as float32, as the Hub's module does: agreement to float32 precision.
    assert scored == pytest.approx(_evaluate_glue_formulas(config, preds, refs), rel=1e-6)


@pytest.mark.parametrize(
    ("preds", "refs"),
    [
        (np.full(6, 2.5), np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])),  # a fresh model predicts one value
        (np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0]), np.full(6, 3.0)),  # a subset whose scores are all equal
        (np.array([1.0]), np.array([2.0])),  # a single example
        (np.array([np.nan, 1.0, 2.0]), np.array([0.0, 1.0, 2.0])),  # a diverged model
    ],
)
def test_undefined_correlations_score_zero_without_warnings(preds: np.ndarray, refs: np.ndarray) -> None:
    assert metrics_for("stsb", preds, refs) == {"pearson": 0.0, "spearmanr": 0.0, "combined_score": 0.0}
    assert own_files(preds, refs, num_labels=1)["combined_score"] == 0.0


def test_constant_class_predictions_score_zero_without_warnings() -> None:
    zeros = np.zeros(6, dtype=np.int64)
    refs = np.array([0, 1, 0, 1, 1, 0])

    assert metrics_for("cola", zeros, refs) == {"matthews_correlation": 0.0}
    assert metrics_for("mrpc", zeros, refs) == {"accuracy": 0.5, "f1": 0.0, "combined_score": 0.25}


@pytest.mark.parametrize(
    ("preds", "refs", "message"),
    [
        (np.array([0, 1]), np.array([0, 1, 1]), "2 predictions but 3 references"),
        (np.array([]), np.array([]), "no predictions"),
        (np.zeros((3, 2)), np.array([0, 1, 1]), "one value per example"),
    ],
)
def test_bad_input_is_refused(preds: np.ndarray, refs: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        metrics_for("sst2", preds, refs)


def test_an_unknown_task_is_refused() -> None:
    # (Whether a GLUE task is a regression is the task's own: shared/data/reading.py reads it off TASKS.)
    with pytest.raises(ValueError, match="unknown GLUE task"):
        metric_plan("squad", is_regression=False, num_labels=2)
