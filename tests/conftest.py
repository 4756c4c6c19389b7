"""Shared fixtures: an S3 server on 127.0.0.1 (moto) and small generated datasets.

In-process moto patches only botocore in one process; pyarrow's S3 filesystem, mosaicml-streaming's
uploads and worker processes need a real endpoint, so tests run ``ThreadedMotoServer`` on loopback
and point ``S3_ENDPOINT_URL`` / ``AWS_*`` at it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_bucket(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket on the loopback S3 server, with the environment pointed at it."""
    import boto3

    env = {
        "S3_ENDPOINT_URL": moto_endpoint,
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    bucket = f"freescale-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    return bucket


def pytest_configure(config: pytest.Config) -> None:
    # Keep worker processes and the Triton interpreter from oversubscribing the 2-core CI machine.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("POLARS_MAX_THREADS", "2")
