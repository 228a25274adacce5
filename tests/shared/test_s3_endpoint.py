"""The tests' S3 endpoint (tests/support/s3_endpoint.py) takes the store away and brings it back without
letting go of its port: another process cannot bind it during the outage, the store's clients see
a connection error they retry (shared.core.storage.is_transient), and the bucket is there afterwards."""

from __future__ import annotations

import socket

import boto3
import pytest
from botocore.config import Config

from shared.core.storage import is_transient
from tests.support.s3_endpoint import S3Endpoint


def test_an_outage_keeps_the_port_and_the_bucket(s3_endpoint: S3Endpoint) -> None:
    environment = s3_endpoint.environment()
    s3 = boto3.client(
        "s3",
        endpoint_url=environment["AWS_ENDPOINT_URL"],
        aws_access_key_id=environment["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=environment["AWS_SECRET_ACCESS_KEY"],
        region_name=environment["AWS_DEFAULT_REGION"],
        config=Config(retries={"total_max_attempts": 1}, connect_timeout=5, read_timeout=5),
    )
    s3.create_bucket(Bucket="outage")
    s3.put_object(Bucket="outage", Key="kept", Body=b"bytes")
    s3_endpoint.down()
    try:
        with pytest.raises(Exception) as refused:
            s3.get_object(Bucket="outage", Key="kept")
        assert is_transient(refused.value), repr(refused.value)
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", s3_endpoint.port))
    finally:
        s3_endpoint.up()
    assert s3.get_object(Bucket="outage", Key="kept")["Body"].read() == b"bytes"
