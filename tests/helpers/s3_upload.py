"""Test helper: copy a local directory tree into the loopback S3 bucket (the ``s3_bucket`` fixture)."""

from __future__ import annotations

import os
from pathlib import Path


def upload_tree(local: str | Path, bucket: str, prefix: str) -> str:
    """Upload every file under ``local`` to ``s3://bucket/prefix/<relative path>``; returns that URI."""
    import boto3

    client = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"])
    root = Path(local)
    for path in root.rglob("*"):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(root)}")
    return f"s3://{bucket}/{prefix}"
