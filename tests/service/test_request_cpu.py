"""No request's CPU grows with what it sends past a bound (issue 32, items 1 and 11): a body's shape is
refused at the edge before any model validates it, a refusal puts into words only the problems it
lists, the work that can take more than a moment runs off the event loop, and a search's ranges are
bounded where Optuna can draw from them. On SQLite and Postgres, through the real app.

What the bounds buy in time (/healthz's latency while each attack runs) is bench/attack_latency.py's
to measure; these tests pin the bounds themselves: counts of the work done, and where it ran.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.edge import input_checks
from service.main import create_app
from shared.core.config import Settings
from shared.core.db import Database
from shared.core.errors import MAX_PROBLEMS
from shared.core.tables import Job, Search, Sweep
from shared.jobspec import suggest, validation_messages
from shared.searches.config import MAX_FLOAT_BOUND, MAX_INT_BOUND, FloatRange, IntRange, Parameter
from shared.searches.optimizer import COMPLETE, Optimizer, TrialRecord
from shared.searches.specs import corners
from tests.support.dbutil import count_rows
from tests.support.e2e import LOOPBACK_URL

SPEC = {"model_name_or_path": "tiny-bert", "task_name": "sst2"}
LR = {"type": "float", "low": 1e-5, "high": 1e-3, "log": True}


@pytest.fixture
def client(settings: Settings, db: Database) -> Iterator[TestClient]:
    with TestClient(create_app(settings, db), base_url=LOOPBACK_URL) as http:
        yield http


def post(client: TestClient, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    # Sent as bytes: the body's size is the attack's, with no client-side re-encoding.
    raw = compact(body).encode()
    response = client.post(path, content=raw, headers={"Content-Type": "application/json"})
    return response.status_code, response.json()


def compact(body: dict[str, Any]) -> str:
    return json.dumps(body, separators=(",", ":"))


def unknown_keys(count: int) -> dict[str, int]:
    return {f"k{i}": i for i in range(count)}


def assert_nothing_stored(db: Database) -> None:
    assert count_rows(db, Job) == 0 and count_rows(db, Sweep) == 0 and count_rows(db, Search) == 0


# ---------------------------------------------------------------------------------------------------
# The body's shape, at the edge
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "extra"),
    [
        ("/v1/jobs", {}),
        ("/v1/sweeps", {"seeds": [1, 2]}),
        ("/v1/searches", {"space": {"learning_rate": LR}}),
    ],
)
def test_the_security_reports_spec_of_70000_unknown_keys_is_refused_naming_the_limit(
    client: TestClient, db: Database, path: str, extra: dict[str, Any]
) -> None:
    body = {"spec": {**SPEC, **unknown_keys(70_000)}, **extra}
    assert len(compact(body)) < settings_cap()  # under the byte cap: only the shape refuses it
    status, answer = post(client, path, body)
    assert status == 422, answer
    error = answer["error"]
    assert error["field"] == "spec"
    assert error["message"] == (
        f"spec holds 70002 keys; an object in a request holds at most {input_checks.MAX_OBJECT_KEYS}"
    )
    assert_nothing_stored(db)


def settings_cap() -> int:
    return int(Settings.model_fields["max_request_bytes"].default)


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        # 400,000 list items in under 1 MiB: each once cost a path of its own in the check.
        ({"spec": SPEC, "seeds": [0] * 400_000}, "seeds", "holds 400000 items; a list in a request holds"),
        (
            {"spec": SPEC, "seeds": [1], "grid": {"learning_rate": [[0] * 999] * 6}},
            "grid.learning_rate.4",
            f"takes the body past {input_checks.MAX_BODY_VALUES} values",
        ),
        (
            {"spec": SPEC, "seeds": [1], "grid": {"learning_rate": json.loads("[" * 20 + "]" * 20)}},
            "grid.learning_rate" + ".0" * 14,  # the list at depth 16 (the body is depth 0)
            f"nested at most {input_checks.MAX_BODY_DEPTH} levels",
        ),
    ],
)
def test_a_wide_or_deep_body_is_refused_before_validation_naming_where(
    client: TestClient, db: Database, body: dict[str, Any], field: str, words: str
) -> None:
    status, answer = post(client, "/v1/sweeps", body)
    assert status == 422, answer
    assert answer["error"]["field"] == field
    assert words in answer["error"]["message"]
    assert_nothing_stored(db)


def test_a_body_at_every_shape_limit_still_reaches_its_checks(client: TestClient, db: Database) -> None:
    """The limits stand above real bodies: a sweep of 1,000 seeds and a spec of 500 names pass the
    edge and are answered by the sweep's own rules (at most 100 jobs) and the spec's (unknown names)."""
    seeds = list(range(input_checks.MAX_LIST_ITEMS))
    status, answer = post(client, "/v1/sweeps", {"spec": SPEC, "seeds": seeds})
    assert status == 422 and answer["error"]["field"] == "grid", answer
    assert answer["error"]["message"] == "the sweep would make 1000 jobs; at most 100 in one sweep"
    spec = {**SPEC, **unknown_keys(input_checks.MAX_OBJECT_KEYS - len(SPEC))}
    status, answer = post(client, "/v1/jobs", {"spec": spec})
    assert status == 422 and answer["error"]["field"] == "spec.k0", answer
    assert_nothing_stored(db)


def test_the_walk_stops_at_the_first_limit_it_passes() -> None:
    """Its cost is bounded by the limits, not by the body: the 500,001st item is never looked at."""
    seen = 0

    class Counted(list[Any]):
        def __getitem__(self, index: Any) -> Any:
            nonlocal seen
            seen += 1
            return super().__getitem__(index)

    body = {"b": [0] * 500_000, "a": Counted([0] * input_checks.MAX_LIST_ITEMS)}
    assert input_checks.find_unstorable(body, bounded=True) == (
        "b",
        f"holds 500000 items; a list in a request holds at most {input_checks.MAX_LIST_ITEMS}",
    )
    # "b" is refused by its length as the walk reaches it; "a", walked after it, is never read.
    assert seen == 0
    # Unbounded (an upload's form values): the same walk still finds what no database stores.
    assert input_checks.find_unstorable({"x": [1, {"y": float("nan")}]}) == (
        "x.1.y",
        "is not a finite number",
    )


def test_a_large_body_is_walked_off_the_event_loop(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    where: list[bool] = []
    walk = input_checks.find_unstorable

    def recording(value: Any, *, bounded: bool = False) -> Any:
        where.append(_on_event_loop())
        return walk(value, bounded=bounded)

    monkeypatch.setattr(input_checks, "find_unstorable", recording)
    small = {"spec": SPEC, "seeds": [1]}
    large = {"spec": SPEC, "seeds": [1], "grid": {"k": ["a value"] * 900}}
    assert len(compact(small)) <= input_checks.LOOP_WALK_BYTES < len(compact(large))
    post(client, "/v1/sweeps", small)
    post(client, "/v1/sweeps", large)
    assert where == [True, False]


# ---------------------------------------------------------------------------------------------------
# A refusal's messages: counted and capped before any is written
# ---------------------------------------------------------------------------------------------------


@pytest.fixture
def suggestions(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Every near-match search a message makes, as whether it ran on the event loop."""
    made: list[bool] = []
    real = suggest.did_you_mean

    def counted(word: str, choices: Any, **options: Any) -> str:
        made.append(_on_event_loop())
        return real(word, choices, **options)

    monkeypatch.setattr(validation_messages, "did_you_mean", counted)
    return made


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def test_a_spec_of_500_unknown_names_costs_50_messages_written_off_the_loop(
    client: TestClient, db: Database, suggestions: list[bool]
) -> None:
    unknown = input_checks.MAX_OBJECT_KEYS - len(SPEC) - 1  # and a typo: 500 names in all
    status, answer = post(client, "/v1/jobs", {"spec": {**SPEC, **unknown_keys(unknown), "learing_rate": 1}})
    assert status == 422, answer
    error = answer["error"]
    assert len(error["errors"]) == MAX_PROBLEMS
    assert error["errors_omitted"] == unknown + 1 - MAX_PROBLEMS  # every problem counted
    assert error["message"].startswith(f"spec.k0: unknown field (and {unknown} more: spec.k1, ")
    assert error["message"].endswith(f" and {unknown - 10} more fields)")
    assert len(suggestions) == MAX_PROBLEMS and not any(suggestions)
    assert_nothing_stored(db)


def test_a_listed_typo_is_still_suggested_in_a_short_refusal(
    client: TestClient, suggestions: list[bool]
) -> None:
    status, answer = post(client, "/v1/jobs", {"spec": {**SPEC, "learing_rate": 1e-4}})
    assert status == 422
    assert answer["error"]["message"] == "spec.learing_rate: unknown field; did you mean 'learning_rate'?"
    assert suggestions == [True]  # one message: written on the loop, not worth a thread


def test_a_sweeps_combination_suggests_only_for_the_problems_it_lists(
    client: TestClient, db: Database, suggestions: list[bool]
) -> None:
    unknown = input_checks.MAX_OBJECT_KEYS - len(SPEC)
    status, answer = post(client, "/v1/sweeps", {"spec": {**SPEC, **unknown_keys(unknown)}, "seeds": [1]})
    assert status == 422, answer
    assert answer["error"]["errors_omitted"] == unknown - MAX_PROBLEMS
    assert len(suggestions) == MAX_PROBLEMS
    assert_nothing_stored(db)


def test_a_near_match_reads_a_bounded_choice_list_and_skips_a_name_longer_than_any() -> None:
    assert suggest.near_matches("learing_rate", ["learning_rate", "seed"]) == ["learning_rate"]
    assert suggest.near_matches("x" * (suggest.MAX_WORD_CHARS + 1), ["x" * suggest.MAX_WORD_CHARS]) == []
    read = 0

    def choices() -> Iterator[str]:
        nonlocal read
        for index in range(2 * suggest.MAX_CHOICES):
            read += 1
            yield f"name_{index}"

    suggest.near_matches("name_x", choices())
    assert read == suggest.MAX_CHOICES


# ---------------------------------------------------------------------------------------------------
# A search's ranges (item 11)
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("space", "field", "words"),
    [
        # The report's case: NumPy's uniform refused a width past the largest float (500).
        (
            {"learning_rate": {"type": "float", "low": -1.7e308, "high": 1.7e308}},
            "space.learning_rate.float.low",
            "must be at least -1e+300, not -1.7e+308",
        ),
        (
            {"learning_rate": {"type": "float", "low": 0, "high": 1e301}},
            "space.learning_rate.float.high",
            "must be at most 1e+300",
        ),
        (
            {"learning_rate": {"type": "float", "low": -1e-3, "high": 1e-3, "log": True}},
            "space.learning_rate.float",
            "a log scale needs low > 0",
        ),
        (
            {"num_train_epochs": {"type": "int", "low": -(10**30), "high": 10**30}},
            "space.num_train_epochs.int.low",
            f"must be at least -{MAX_INT_BOUND}",
        ),
        (
            {"num_train_epochs": {"type": "int", "low": 1, "high": 3, "step": 10**30}},
            "space.num_train_epochs.int.step",
            f"must be at most {MAX_INT_BOUND}",
        ),
        (
            {"num_train_epochs": {"type": "int", "low": 1, "high": 3, "step": 5}},
            "space.num_train_epochs.int",
            "step must be at most high - low",
        ),
        (
            {"num_train_epochs": {"type": "int", "low": 0, "high": 3, "log": True}},
            "space.num_train_epochs.int",
            "a log scale needs low >= 1",
        ),
    ],
)
def test_a_search_range_optuna_cannot_draw_from_is_refused_naming_the_field(
    client: TestClient, db: Database, space: dict[str, Any], field: str, words: str
) -> None:
    status, answer = post(client, "/v1/searches", {"spec": SPEC, "space": space})
    assert status == 422, answer
    assert answer["error"]["field"] == field
    assert words in answer["error"]["message"]
    assert_nothing_stored(db)


def test_a_pruner_count_past_any_job_is_refused(client: TestClient, db: Database) -> None:
    body = {
        "spec": SPEC,
        "space": {"learning_rate": LR},
        "pruner": {"type": "median", "n_warmup_steps": 10**30},
    }
    status, answer = post(client, "/v1/searches", body)
    assert status == 422 and answer["error"]["field"] == "pruner.n_warmup_steps", answer
    assert_nothing_stored(db)


@pytest.mark.parametrize(
    "parameter",
    [
        FloatRange(type="float", low=-MAX_FLOAT_BOUND, high=MAX_FLOAT_BOUND),
        FloatRange(type="float", low=1e-300, high=MAX_FLOAT_BOUND, log=True),
        IntRange(type="int", low=-MAX_INT_BOUND, high=MAX_INT_BOUND),
        IntRange(type="int", low=1, high=MAX_INT_BOUND, log=True),
    ],
)
@pytest.mark.parametrize("sampler", ["random", "tpe"])
@pytest.mark.filterwarnings("error::RuntimeWarning")  # NumPy's overflow or division by zero in TPE
def test_optuna_draws_inside_every_range_the_bounds_admit(
    parameter: FloatRange | IntRange, sampler: str
) -> None:
    """The bounds are enough: at their extremes, both samplers draw finite values inside the range,
    past TPE's random start-up trials, without a NumPy warning, and a range's checked points are
    finite."""
    space: dict[str, Parameter] = {"x": parameter}
    assert all(math.isfinite(point["x"]) for point in corners(space))
    trials: list[TrialRecord] = []
    for step in range(8):
        optimizer = Optimizer(
            space=space,
            direction="maximize",
            sampler={"type": sampler, "n_startup_trials": 2},
            pruner={"type": "none"},
            seed=7,
            trials=trials,
        )
        number, params = optimizer.ask()
        value = params["x"]
        assert math.isfinite(value) and parameter.low <= value <= parameter.high, (step, value)
        trials.append(TrialRecord(number=number, params=params, state=COMPLETE, value=float(step % 3)))
