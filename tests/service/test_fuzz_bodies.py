"""A property-based fuzz of the bodies the schema fuzz (tests/shared/test_fuzz.py) cannot generate (issue 32's
last point): a model folder's tar for POST /v1/models, and a search's space and pruner for
POST /v1/searches. schemathesis sees the model upload as an opaque binary part and a space as JSON of
the right shape; neither reaches the tar reader's corners or the ranges Optuna has to draw from.

The model tars start from a folder that registers (a tiny BERT config, MiniLM's tokenizer files, a
stand-in weights file: the upload checks the folder's shape, not its weights) and are mutated: member
names (bytes that are not UTF-8, long, twice, both a file and a folder), links, sparse members (GNU's
old headers and PAX's maps), sizes declared apart from the data (huge, negative), cut-short archives,
config.json values and bad JSON. Whatever the archive, the API answers JSON below 500 naming the field,
and a refusal leaves nothing in the store or the upload folder; an accepted model is what its tar held.

The searches draw float, int, log, step and choice ranges with their extremes (±1.7e308, 2**63, 0 and
negatives on log scales, empty and huge choice lists, and the NaN and Infinity literals a Python JSON
parser accepts), samplers and pruners. No answer is a 5xx, and an accepted search's later trials can
be drawn and resolve to job specs, as its driver draws them.

The fuzz is hypothesis' and seeded (the same cases every run); GLUEJOBS_TEST_BODY_FUZZ_CASES sets its
cases per test (more, e.g. nightly). The regression tests of what it found are not slow: their
local-store and SQLite cases run with every `make test-fast`.
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from service.main import create_app
from shared.core.config import Settings
from shared.core.db import Database
from shared.core.storage import Store, open_store
from shared.core.tables import Job, Search
from shared.searches import store as searches_store
from shared.searches.driver import optimizer_for, record_of, trial_job
from shared.searches.optimizer import COMPLETE, TrialRecord
from tests.support.dbutil import count_rows
from tests.support.e2e import LOOPBACK_URL
from tests.support.kit import ALICE, ROOT

# Cases per test: 120 model tars, 80 searches (measured below with their cost); set
# GLUEJOBS_TEST_BODY_FUZZ_CASES to run that many of each (e.g. 2000 nightly).
_CASES = os.environ.get("GLUEJOBS_TEST_BODY_FUZZ_CASES")
MODEL_CASES = int(_CASES or 120)
SEARCH_CASES = int(_CASES or 80)
SEED = 20240605
MAX_MODEL_BYTES = 8 * 1024 * 1024


def fuzz_settings(cases: int) -> Any:
    return settings(
        max_examples=cases,
        deadline=None,
        database=None,  # no .hypothesis/ folder, and every run is the same run
        suppress_health_check=list(HealthCheck),
    )


def as_(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _client(settings: Settings) -> TestClient:
    # A failure inside the app answers 500 here, as it does behind a server, and the fuzz sees it.
    return TestClient(create_app(settings), base_url=LOOPBACK_URL, raise_server_exceptions=False)


# ---------------------------------------------------------------------------------------------------
# Model folders as tars
# ---------------------------------------------------------------------------------------------------

TINY_CONFIG: dict[str, Any] = {
    "model_type": "bert",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "vocab_size": 30522,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
}
TOKENIZER_FILES = ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.json")


@dataclass(frozen=True)
class Member:
    """One member as an attacker writes it: the header's fields are the archive's, not the data's."""

    name: str  # surrogates stand for bytes that are not UTF-8 (tarfile's surrogateescape)
    data: bytes = b""
    kind: bytes = tarfile.REGTYPE
    linkname: str = ""
    declared: int | None = None  # the size the header declares, when not the data's
    # (real size, [(offset, bytes)…], "gnu" | "pax01" | "pax10"): a sparse member and how it is written
    sparse: tuple[int, tuple[tuple[int, int], ...], str] | None = None
    pax: dict[str, str] = field(default_factory=dict)  # PAX records, written as a PAX header


def header(member: Member) -> bytes:
    info = tarfile.TarInfo(member.name)
    info.type = member.kind
    info.linkname = member.linkname
    info.mode = 0o755 if member.kind == tarfile.DIRTYPE else 0o644
    info.mtime = 1_700_000_000
    info.size = len(member.data) if member.declared is None else member.declared
    if member.sparse is not None and member.sparse[2] == "gnu":
        return _gnu_sparse_header(info, member.sparse[0], member.sparse[1])
    records = dict(member.pax)
    if member.sparse is not None:
        real, chunks, how = member.sparse
        numbers = [str(n) for chunk in chunks for n in chunk]
        if how == "pax01":
            records |= {"GNU.sparse.size": str(real), "GNU.sparse.map": ",".join(numbers)}
        else:
            records |= {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.realsize": str(real)}
    if not records:
        return info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")
    info.pax_headers = records
    head = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    if member.sparse is not None and member.sparse[2] == "pax10":
        # Version 1.0 keeps its map in the data, ahead of the chunks: a count, then offset and size
        # of each, a number a line.
        numbers = [str(len(member.sparse[1]))] + [str(n) for chunk in member.sparse[1] for n in chunk]
        head += "\n".join(numbers).encode().ljust(tarfile.BLOCKSIZE, b"\0")[: tarfile.BLOCKSIZE]
    return head


def _gnu_sparse_header(info: tarfile.TarInfo, real: int, chunks: tuple[tuple[int, int], ...]) -> bytes:
    """GNU's old sparse header ('S'), which tarfile reads but cannot write: up to four (offset, size)
    pairs and the real size in the header's spare room, the checksum recomputed."""
    info.type = tarfile.GNUTYPE_SPARSE
    raw = bytearray(info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape"))
    block = raw[-tarfile.BLOCKSIZE :]  # after any long-name blocks
    for i, (offset, size) in enumerate(chunks[:4]):
        at = 386 + 24 * i
        block[at : at + 24] = _number(offset) + _number(size)
    block[483:495] = _number(real)
    block[148:156] = b" " * 8
    block[148:155] = b"%06o\0" % sum(block)  # the header's checksum: its bytes, the checksum's as spaces
    raw[-tarfile.BLOCKSIZE :] = block
    return bytes(raw)


def _number(value: int) -> bytes:
    """A 12-byte header number as GNU tar writes it: octal, or base-256 past octal's room or below 0."""
    if 0 <= value < 8**11:
        return b"%011o\0" % value
    return (value % 256**12 | (0x80 << 88 if value >= 0 else 0)).to_bytes(12, "big")


def archive(members: list[Member], *, ended: bool = True) -> bytes:
    out = bytearray()
    for member in members:
        out += header(member) + member.data + bytes(-len(member.data) % tarfile.BLOCKSIZE)
    return bytes(out + (bytes(2 * tarfile.BLOCKSIZE) if ended else b""))


def base_folder(tokenizer: dict[str, bytes], config: dict[str, Any] | bytes) -> list[Member]:
    """A folder that registers: config, tokenizer files, a stand-in weights file."""
    raw = config if isinstance(config, bytes) else json.dumps(config).encode()
    members = [Member("config.json", raw)]
    members += [Member(name, data) for name, data in sorted(tokenizer.items())]
    return [*members, Member("model.safetensors", b"\x08" + bytes(63))]


# Names: the folder's own, ones that clash with it, and hostile text.
NAMES = st.one_of(
    st.sampled_from(
        [
            "config.json",
            "vocab.txt",
            "model.safetensors",
            "extra.json",
            "./extra.json",
            "1_Pooling",
            "1_Pooling/config.json",
            "config.json/inner.json",
            "a/b/c/d/e.json",
            "../up.json",
            "/etc/abs.json",
            "code.py",
            ".hidden.json",
            "back\\slash.json",
            "tab\there.json",
            "\udcff\udcfe.json",
            "caf\udce9.json",
            "é" * 130 + ".json",
            "a" * 300 + ".json",
            "x" * 99 + ".json",
        ]
    ),
    st.text(min_size=1, max_size=40).map(lambda s: s + ".json"),
    st.binary(min_size=1, max_size=40).map(lambda b: b.decode("utf-8", "surrogateescape")),
)
SIZES = st.one_of(
    st.sampled_from([0, 1, 511, 512, 2**20 + 1, 2**26 + 1, 2**31, 2**33, 2**63, 2**80, -1, -(2**40)]),
    st.integers(min_value=-(2**87), max_value=2**87 - 1),
)
KINDS = st.sampled_from(
    [
        tarfile.REGTYPE,
        tarfile.DIRTYPE,
        tarfile.SYMTYPE,
        tarfile.LNKTYPE,
        tarfile.CHRTYPE,
        tarfile.FIFOTYPE,
        b"Z",
    ]
)
SPARSE_MAPS = st.lists(st.tuples(SIZES, SIZES), min_size=0, max_size=5).map(tuple)
CONFIG_VALUES: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from([10**6, 10**12, 10**400, -1, 0, 2**63, 1.5, "12", True, None, float("nan"), [32], {}]),
    st.integers(),
)
CONFIG_KEYS = st.sampled_from(
    ["hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size", "max_position_embeddings",
     "embedding_size", "num_hidden_groups", "model_type", "auto_map", "num_key_value_heads", "d_model"]
)  # fmt: skip
BAD_JSON = st.sampled_from(
    [b"", b"{", b"[]", b"null", b'"bert"', b"\xff\xfe{}", b"{" * 100_000, b"[" * 200_000, b"1" * 5000]
)


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any] | bytes:
    if draw(st.integers(0, 5)) == 0:
        return draw(BAD_JSON)
    config = dict(TINY_CONFIG)
    for key in draw(st.lists(CONFIG_KEYS, max_size=3)):
        config[key] = draw(CONFIG_VALUES)
    if draw(st.booleans()) and draw(st.booleans()):
        config["model_type"] = draw(st.sampled_from(["llama", "albert", "t5", "no-such-type", ""]))
    return config


@st.composite
def mutations(draw: st.DrawFn, members: list[Member]) -> list[Member]:
    """The folder with members added, changed, repeated or removed."""
    members = list(members)
    for _ in range(draw(st.integers(0, 3))):
        how = draw(
            st.sampled_from(["add", "rename", "kind", "declare", "sparse", "pax", "repeat", "drop", "parent"])
        )
        at = draw(st.integers(0, max(len(members) - 1, 0)))
        if how == "add" or not members:
            data = draw(st.binary(max_size=600))
            members.insert(at, Member(draw(NAMES), data))
        elif how == "rename":
            members[at] = replace(members[at], name=draw(NAMES))
        elif how == "kind":
            kind = draw(KINDS)
            link = draw(st.sampled_from(["config.json", "../../etc/passwd", "/etc/passwd", ""]))
            data = members[at].data if kind == tarfile.REGTYPE else b""
            members[at] = replace(members[at], kind=kind, linkname=link, data=data)
        elif how == "declare":
            members[at] = replace(members[at], declared=draw(SIZES))
        elif how == "sparse":
            how_written = draw(st.sampled_from(["gnu", "pax01", "pax10"]))
            chunks = draw(SPARSE_MAPS)
            data = bytes(max(0, min(sum(max(size, 0) for _, size in chunks), 4096)))
            members[at] = replace(members[at], data=data, sparse=(draw(SIZES), chunks, how_written))
        elif how == "pax":
            key = draw(
                st.sampled_from(["path", "size", "GNU.sparse.map", "GNU.sparse.size", "linkpath", "mtime"])
            )
            value = draw(st.one_of(st.text(max_size=30), SIZES.map(str), st.just("1,2,3")))
            members[at] = replace(members[at], pax={key: value})
        elif how == "repeat":
            members.insert(at, members[at])
        elif how == "drop":
            members.pop(at)
        else:  # a folder where a file is, or the other way round
            members.insert(at, Member(members[at].name, kind=tarfile.DIRTYPE))
    return members


class Tar(bytes):
    """An archive as the fuzz reports it: its size, not half a megabyte of bytes (the seed replays it)."""

    def __repr__(self) -> str:
        return f"<a tar of {len(self)} bytes>"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # hypothesis' printer asks for this
        printer.text(repr(self))


@st.composite
def model_tars(draw: st.DrawFn, tokenizer: dict[str, bytes]) -> Tar:
    files = {
        name: data for name, data in tokenizer.items() if name != "tokenizer.json" or draw(st.booleans())
    }
    members = base_folder(files, draw(configs()))
    if draw(st.integers(0, 4)):  # mostly mutated: an untouched folder registers, once is enough
        members = draw(mutations(members))
    data = archive(members, ended=draw(st.integers(0, 6)) > 0)
    cut = draw(st.sampled_from(["whole"] * 6 + ["cut", "garbage", "flip"]))
    if cut == "cut" and data:
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif cut == "garbage":
        data += draw(st.binary(min_size=1, max_size=1024))
    elif cut == "flip" and data:
        at = draw(st.integers(0, min(len(data), 8 * tarfile.BLOCKSIZE) - 1))
        data = data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1 :]
    return Tar(data)


def stored(settings: Settings) -> list[str]:
    """Every object under models/, partial copies included (a store of the test's own: opening one
    on S3 costs a second, so each settings' store is opened once)."""
    key = settings.storage_url or str(settings.artifacts_dir)
    if key not in _stores:
        _stores[key] = open_store(settings)
    return [f.path for f in _stores[key].list("models")]


_stores: dict[str, Store] = {}


def staged(settings: Settings) -> list[Path]:
    """What the API left in its upload folder."""
    folder = settings.cache_dir / "uploads"
    return sorted(folder.iterdir()) if folder.is_dir() else []


def upload(client: TestClient, tar: bytes, name: str = "fuzzed") -> Any:  # the test client's response
    return client.post(
        "/v1/models", files={"file": ("model.tar", tar)}, data={"name": name}, headers=as_(ALICE)
    )


def assert_refused_in_words(answer: Any, settings: Settings) -> None:
    assert answer.status_code < 500, answer.text
    assert answer.headers["content-type"].startswith("application/json"), answer.text
    error = answer.json()["error"]
    assert error["field"] in ("file", "name"), error
    message = error["message"]
    assert message and "Traceback" not in message, error
    assert str(settings.cache_dir) not in message and "/" + settings.cache_dir.name not in message, error
    assert stored(settings) == [] and staged(settings) == []


def assert_registered_as_sent(answer: Any, tar: bytes, settings: Settings, client: TestClient) -> None:
    """An accepted model is what its tar held: each file at its real size, within the cap, and nothing
    but the model's objects in the store. Then it is deleted, and the store is empty again."""
    model = answer.json()
    with tarfile.open(fileobj=io.BytesIO(tar)) as held:
        sizes = {
            m.name.removeprefix("./"): len(held.extractfile(m).read())  # type: ignore[union-attr]
            for m in held.getmembers()
            if m.isfile()
        }
    files = {f["path"]: f["bytes"] for f in model["files"]}
    assert files == {path: sizes[path] for path in files}, (files, sizes)
    assert all(size >= 0 for size in files.values()) and 0 <= model["bytes"] <= MAX_MODEL_BYTES
    blobs = {f"blobs/{f['sha256']}" for f in model["files"]}
    assert sorted(stored(settings)) == sorted([*blobs, f"manifests/{model['sha256']}.json"])
    assert staged(settings) == []
    deleted = client.delete(f"/v1/models/{model['name']}", headers=as_(ALICE))
    assert deleted.status_code == 200, deleted.text
    assert stored(settings) == []


@pytest.fixture(scope="module")
def tokenizer_files(minilm_path: Path) -> dict[str, bytes]:
    return {name: (minilm_path / name).read_bytes() for name in TOKENIZER_FILES}


# Each store on one database, as in tests/service/test_model_upload_bounds.py: both are covered.
STORES = [
    pytest.param(("local", "sqlite"), id="local-sqlite"),
    pytest.param(("s3", "postgres"), id="s3-postgres", marks=pytest.mark.postgres),
]


@pytest.fixture(params=STORES)
def keyed(request: pytest.FixtureRequest, settings_factory: Any) -> Settings:
    store, database = request.param
    store_url = request.getfixturevalue("s3_url") if store == "s3" else None
    settings: Settings = settings_factory(
        request.getfixturevalue(f"{database}_url"),
        storage_url=store_url,
        api_keys=[f"alice={ALICE}"],
        admin_keys=[f"root={ROOT}"],
        max_model_bytes=MAX_MODEL_BYTES,
        orphan_grace_s=0.0,
        # The rate limits off: the fuzz's hundreds of uploads would mostly meet 429 (tested on their
        # own in tests/service/test_rate_limits.py) instead of the route.
        rate_submits_per_minute=0,
        rate_reads_per_minute=0,
    )
    open_store(settings).check()
    return settings


@pytest.fixture
def client(keyed: Settings) -> Iterator[TestClient]:
    with _client(keyed) as test_client:
        yield test_client


@pytest.mark.slow
def test_fuzzed_model_tars_are_refused_in_words_or_registered_as_sent(
    client: TestClient, keyed: Settings, tokenizer_files: dict[str, bytes]
) -> None:
    answers: dict[int, int] = {}

    @fuzz_settings(MODEL_CASES)
    @seed(SEED)
    @given(tar=model_tars(tokenizer_files))
    def fuzz(tar: Tar) -> None:
        answer = upload(client, tar)
        answers[answer.status_code] = answers.get(answer.status_code, 0) + 1
        if answer.status_code == 201:
            assert_registered_as_sent(answer, tar, keyed, client)
        else:
            assert_refused_in_words(answer, keyed)

    fuzz()
    # The fuzz reached both ends: folders that register and archives refused in each way.
    assert answers.get(201, 0) > 0 and answers.get(422, 0) > 0, answers
    listing = client.get("/v1/models", headers=as_(ALICE))
    assert listing.status_code == 200 and listing.json()["data"] == []


# What the fuzz found (each a 500 before its fix), on both stores and both databases.

DEEP = b"[" * 200_000  # within config.json's 1 MiB, deeper than the JSON parser recurses
GIB3 = 3 * 2**30
MALFORMED = "the tar is cut short or malformed"
NOT_A_SIZE = "declares a size it cannot have"


def found(
    id: str,
    words: str,
    *,
    config: Any = TINY_CONFIG,
    files: dict[str, bytes] | None = None,
    first: tuple[Member, ...] = (),
    extra: tuple[Member, ...] = (),
) -> Any:
    """A finding: the folder's config, tokenizer files that replace MiniLM's, members before and after
    the folder's own, and the words its refusal says."""
    return (id, config, files or {}, first, extra, words)


FOUND = [
    # A config's sizes are ints of any length: their product overflowed a float in the refusal's words.
    found("huge-int", "more than a million trillion", config={**TINY_CONFIG, "hidden_size": 10**400}),
    found("deep-config", "config.json is not valid JSON", config=DEEP),
    found("deep-tokenizer-config", "tokenizer_config.json is not valid JSON",
          files={"tokenizer_config.json": b"{" * 200_000}),
    # A negative size (base-256) sent tarfile's next read backwards: OSError.
    found("negative-size", NOT_A_SIZE, extra=(Member("extra.json", b"{}", declared=-1),)),
    # A negative sparse size lowered the sum held to the cap: 3 GiB of zeros passed an 8 MiB cap.
    found("negative-sparse-size-under-the-cap", NOT_A_SIZE, extra=(
        Member("a.safetensors", sparse=(-GIB3, (), "gnu")),
        Member("b.safetensors", b"x", sparse=(GIB3 + 100, ((GIB3 + 99, 1),), "gnu")),
    )),
    found("sparse-piece-past-its-size", NOT_A_SIZE,
          extra=(Member("b.safetensors", b"x", sparse=(100, ((2**40, 1),), "pax01")),)),
    # tarfile reads pax numbers and sparse maps with int() and lets its ValueError through.
    found("pax-size-not-a-number", MALFORMED,
          extra=(Member("e.json", b"{}", pax={"GNU.sparse.size": "lots"}),)),
    found("pax-sparse-map-not-numbers", MALFORMED,
          extra=(Member("e.json", b"{}", pax={"GNU.sparse.map": "1,x"}),)),
    found("first-member-pax-not-a-number", "not an (uncompressed) tar",
          first=(Member("e.json", b"{}", pax={"GNU.sparse.size": "lots"}),)),
]  # fmt: skip


def test_what_the_fuzz_found_is_refused_in_words_and_keeps_nothing(
    client: TestClient, keyed: Settings, tokenizer_files: dict[str, bytes]
) -> None:
    """One test a store, each finding in turn (a store of its own costs seconds to set up)."""
    for id, config, files, first, extra, words in FOUND:
        answer = upload(client, archive([*first, *base_folder(tokenizer_files | files, config), *extra]))
        assert answer.status_code == 422, (id, answer.text)
        assert words in answer.json()["error"]["message"], (id, answer.text)
        assert_refused_in_words(answer, keyed)
    # The same folder without a finding registers: each refusal was the finding's.
    whole = upload(client, archive(base_folder(tokenizer_files, TINY_CONFIG)))
    assert whole.status_code == 201, whole.text


def test_a_local_model_of_a_config_nested_too_deep_is_not_a_500(
    settings_factory: Any, db_url: str, models_dir: Path, tmp_path: Path
) -> None:
    """The submit and the dry run read a local folder's config.json: one nested past the JSON parser's
    recursion was a RecursionError there too."""
    local = tmp_path / "models"
    shutil.copytree(models_dir / "tiny-bert", local / "tiny-bert")
    (local / "tiny-bert" / "config.json").write_bytes(DEEP)
    with _client(settings_factory(db_url, models_dir=local)) as http:
        for path in ("/v1/jobs?dry_run=true", "/v1/jobs"):
            answer = http.post(path, json={"spec": {"model_name_or_path": "tiny-bert", "task_name": "sst2"}})
            # Unreadable to the API, so the worker's to report when it loads the folder (model_check.py).
            assert answer.status_code == (200 if "dry_run" in path else 201), (path, answer.text)


# ---------------------------------------------------------------------------------------------------
# Search spaces
# ---------------------------------------------------------------------------------------------------

SPEC = {"model_name_or_path": "tiny-bert", "task_name": "sst2", "max_train_samples": 16}
# Fields a search takes (floats, ints, fractions, counts), and ones it refuses.
FIELDS = st.one_of(
    st.sampled_from(
        [
            "learning_rate",
            "weight_decay",
            "num_train_epochs",
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
            "num_warmup_steps",
            "adam_beta1",
            "adam_epsilon",
            "cls_dropout",
            "lora_r",
            "max_grad_norm",
            "fp16",
            "seed",
            "task_name",
        ]
    ),
    st.text(max_size=12),
)
# What a Python JSON parser accepts though JSON has no such numbers (sent as NaN and Infinity).
NOT_FINITE = [math.nan, math.inf, -math.inf]
FLOATS = st.one_of(
    st.sampled_from(
        [1.7e308, -1.7e308, 1e300, -1e300, 5e-324, -5e-324, 0.0, -0.0, 1e-8, 1e-5, 1e-3, 0.5, 0.9, 1.0, 64.0,
         *NOT_FINITE]
    ),
    st.floats(allow_nan=False, allow_infinity=False),
)  # fmt: skip
INTS = st.one_of(
    st.sampled_from(
        [2**63, -(2**63), 2**64, 2**53 + 1, 2**31, 2**31 + 1, -(2**31), 0, -1, 1, 2, 3, 8, 64, 10**30]
    ),
    st.integers(min_value=-(10**20), max_value=10**20),
)
CHOICES = st.one_of(
    st.lists(st.one_of(st.booleans(), INTS, FLOATS, st.text(max_size=8)), max_size=8),
    st.sampled_from([[], [True, 1], [1, 1.0], [16, 32], [1e-5, 1e-3]]),
    st.integers(40, 1200).map(lambda n: list(range(1, n + 1))),  # past MAX_CHOICES, past the edge's list
)


@st.composite
def parameters(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["float", "int", "categorical", "other"]))
    if kind == "float":
        low, high = draw(FLOATS), draw(FLOATS)
        return {
            "type": "float",
            "low": low,
            "high": high,
            **draw(st.fixed_dictionaries({}, optional={"log": st.booleans()})),
        }
    if kind == "int":
        return {
            "type": "int",
            "low": draw(INTS),
            "high": draw(INTS),
            **draw(st.fixed_dictionaries({}, optional={"step": INTS, "log": st.booleans()})),
        }
    if kind == "categorical":
        return {"type": "categorical", "choices": draw(CHOICES)}
    return draw(
        st.one_of(
            st.none(), FLOATS, st.text(max_size=8), st.fixed_dictionaries({"type": st.text(max_size=8)})
        )
    )


# Ranges that a spec field takes, so that some searches are accepted and their trials drawn.
ACCEPTABLE = st.sampled_from(
    [
        {"learning_rate": {"type": "float", "low": 5e-324, "high": 1.0, "log": True}},
        {"learning_rate": {"type": "float", "low": 1e-8, "high": 1.0}},
        {"weight_decay": {"type": "float", "low": 0.0, "high": 1.0}},
        {"num_train_epochs": {"type": "float", "low": 1e-300, "high": 10_000, "log": True}},
        {"num_train_epochs": {"type": "int", "low": 1, "high": 10_000, "log": True}},
        {"per_device_train_batch_size": {"type": "int", "low": 1, "high": 64, "step": 7}},
        {"num_warmup_steps": {"type": "int", "low": 0, "high": 2**31 - 1, "step": 2**30}},
        {"num_warmup_steps": {"type": "float", "low": 0.0, "high": 2.0}},
        {"adam_beta1": {"type": "float", "low": 0.0, "high": 0.999999}},
        {"per_device_train_batch_size": {"type": "categorical", "choices": [1, 2, 4, 8, 16, 32, 64]}},
        {"fp16": {"type": "categorical", "choices": [True, False]}},
    ]
)
COUNTS = st.one_of(st.integers(0, 10**6), st.sampled_from([-1, 0, 1, 2, 100, 101, 2**31, 2**63, 10**30]))


@st.composite
def search_bodies(draw: st.DrawFn) -> dict[str, Any]:
    if draw(st.booleans()):
        space: Any = draw(st.dictionaries(FIELDS, parameters(), max_size=3))
    else:
        space = draw(ACCEPTABLE)
        if draw(st.booleans()):  # an acceptable range with one end or its scale fuzzed
            ((name, parameter),) = space.items()
            key = draw(st.sampled_from(["low", "high", "log", "step"]))
            value = (
                draw(st.booleans())
                if key == "log"
                else draw(FLOATS if parameter["type"] == "float" else INTS)
            )
            space = {name: {**parameter, key: value}}
    body: dict[str, Any] = {"spec": SPEC, "space": space}
    optional = {
        "n_trials": st.integers(1, 6) | COUNTS,
        "parallelism": st.integers(1, 3) | COUNTS,
        "sampler": st.fixed_dictionaries(
            {},
            optional={
                "type": st.sampled_from(["tpe", "random", "cmaes"]),
                "n_startup_trials": COUNTS,
                "seed": st.integers(0, 2**31 - 1) | INTS,
            },
        ),
        "pruner": st.fixed_dictionaries(
            {},
            optional={
                "type": st.sampled_from(["median", "asha", "successive_halving", "none", "hyperband"]),
                "n_startup_trials": COUNTS,
                "n_warmup_steps": COUNTS,
                "min_resource": COUNTS,
                "reduction_factor": COUNTS,
            },
        ),
    }
    body |= draw(st.fixed_dictionaries({}, optional=optional))
    if isinstance(body.get("parallelism"), int) and body["parallelism"] > 3:
        body["parallelism"] = 3  # each queued trial is a job checked in full: the fuzz's time, not its reach
    return body


def draw_later_trials(db: Database, search_id: int, asks: int) -> list[dict[str, Any]]:
    """What the search's driver does as trials end: the study rebuilt from the stored rows, each open
    trial completed, then new trials asked for, each resolved to its job spec."""
    with db.session() as session:
        search = searches_store.get_search(session, search_id=search_id)
        records = [record_of(row) for row in searches_store.list_trials(session, search_ids=[search_id])]
    drawn = []
    for step in range(asks):
        for record in records:
            if record.state != COMPLETE:
                record.state, record.value = COMPLETE, float((record.number + step) % 3)
        optimizer = optimizer_for(search, records)
        number, params = optimizer.ask()
        trial_job(search.spec, params)  # the driver's ValidationError or InvalidSpec: a trial that cannot run
        records.append(TrialRecord(number=number, params=params))
        drawn.append(params)
    return drawn


def within(value: Any, parameter: dict[str, Any]) -> bool:
    if parameter["type"] == "categorical":
        return any(value == choice and type(value) is type(choice) for choice in parameter["choices"])
    return math.isfinite(value) and parameter["low"] <= value <= parameter["high"]


@pytest.fixture
def search_client(settings_factory: Any, db_url: str) -> Iterator[TestClient]:
    with _client(settings_factory(db_url)) as test_client:
        yield test_client


@pytest.mark.slow
def test_fuzzed_search_spaces_are_refused_naming_the_field_or_drawn_from(
    search_client: TestClient, db: Database
) -> None:
    answers: dict[int, int] = {}

    @fuzz_settings(SEARCH_CASES)
    @seed(SEED)
    @given(body=search_bodies())
    def fuzz(body: dict[str, Any]) -> None:
        before = (count_rows(db, Search), count_rows(db, Job))
        raw = json.dumps(body, allow_nan=True)  # NaN and Infinity literals as a careless client sends them
        answer = search_client.post("/v1/searches", content=raw, headers={"Content-Type": "application/json"})
        answers[answer.status_code] = answers.get(answer.status_code, 0) + 1
        assert answer.status_code < 500, (body, answer.text)
        found = answer.json()
        if answer.status_code != 201:
            assert answer.status_code == 422, (body, found)
            assert found["error"]["field"] and found["error"]["message"], (body, found)
            assert (count_rows(db, Search), count_rows(db, Job)) == before, body
            return
        space = found["space"]
        for trial in found["trials"]:
            assert all(within(trial["params"][name], space[name]) for name in space), (body, trial)
        for params in draw_later_trials(db, found["id"], asks=3):
            assert all(within(params[name], space[name]) for name in space), (body, params)

    fuzz()
    assert answers.get(201, 0) > 0 and answers.get(422, 0) > 0, answers
