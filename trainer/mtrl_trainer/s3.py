"""Small S3 helpers (boto3's default credential chain; AWS_ENDPOINT_URL for moto)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3


def client() -> Any:
    return boto3.session.Session().client("s3")


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """s3://bucket/some/prefix -> ("bucket", "some/prefix") without a trailing slash."""
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    return bucket, prefix.strip("/")


def join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p.strip("/"))


def list_keys(s3: Any, bucket: str, prefix: str) -> list[str]:
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", [])]
    return keys


def download_prefix(bucket: str, prefix: str, target: Path) -> None:
    s3 = client()
    for key in list_keys(s3, bucket, prefix + "/"):
        path = target / key[len(prefix) + 1 :]
        path.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(bucket, key, str(path))
