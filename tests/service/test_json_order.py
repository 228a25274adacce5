"""Stored JSON comes back in the order it was written on both databases: a job's spec in JobSpec's
field order, an uploaded file's label counts in label order (Postgres's JSONB re-sorted keys by
length: `bf16, fast, fp16 …`; the columns are json there since migration 0009)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.main import create_app
from shared.core.config import Settings
from shared.jobspec.spec import JobSpec
from tests.support.e2e import LOOPBACK_URL
from tests.support.kit import TINY_MODEL


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings), base_url=LOOPBACK_URL) as test_client:
        yield test_client


def test_a_jobs_spec_and_label_counts_come_back_in_their_order(client: TestClient) -> None:
    # Labels whose sorted order ("aa" before "b") is not JSONB's (shorter keys first).
    rows = "".join(f"sentence number {i},{'aa' if i % 2 else 'b'}\n" for i in range(20))
    uploaded = client.post("/v1/files", files={"file": ("own.csv", b"sentence,label\n" + rows.encode())})
    assert uploaded.status_code == 201, uploaded.text
    file = uploaded.json()
    spec = {
        "model_name_or_path": TINY_MODEL,
        "train_file": file["id"],
        "validation_file": file["id"],
        "seed": 3,
        "bf16": False,
    }
    created = client.post("/v1/jobs", json={"spec": spec, "metadata": {"zeta": "1", "a": "2"}})
    assert created.status_code == 201, created.text

    job: dict[str, Any] = client.get(f"/v1/jobs/{created.json()['id']}").json()
    listed = client.get(f"/v1/files/{file['id']}").json()

    assert list(job["spec"]) == [name for name in JobSpec.model_fields if name in job["spec"]]
    assert list(job["spec"])[:3] == ["model_name_or_path", "registered_model", "task_name"]
    assert list(job["metadata"]) == ["zeta", "a"]  # as the user wrote it
    assert list(listed["checks"]["label_counts"]) == ["aa", "b"]
