"""AWS as the commands use it: a run's metrics.jsonl in S3 and its workers' CloudWatch Logs.
boto3 finds credentials, region and endpoint (AWS_ENDPOINT_URL) as it always does; every
failure comes out as a CliError naming the object or log group."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import boto3
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
)

from mtrl_cli.errors import CliError

METRICS_KEY = "metrics.jsonl"  # mtrl_trainer.progress.MetricsHistory.KEY


@contextlib.contextmanager
def calling(what: str) -> Iterator[None]:
    try:
        yield
    except NoCredentialsError:
        raise CliError(f"no AWS credentials for {what}: set AWS_PROFILE, or AWS_ACCESS_KEY_ID "
                       "and AWS_SECRET_ACCESS_KEY") from None
    except NoRegionError:
        raise CliError(f"no AWS region for {what}: set AWS_REGION") from None
    except EndpointConnectionError as exc:
        raise CliError(f"cannot reach AWS for {what}: {exc}") from None
    except ClientError as exc:
        error = exc.response.get("Error", {})
        raise CliError(f"{what}: {error.get('Code')}: {error.get('Message')}") from None
    except BotoCoreError as exc:
        raise CliError(f"{what}: {exc}") from None


def metrics_uri(output_uri: str) -> str:
    return f"{output_uri.rstrip('/')}/{METRICS_KEY}"


def read_text(uri: str) -> str:
    """An S3 object's text; a missing one is a CliError saying so."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    with calling(f"reading {uri}"):
        s3 = boto3.client("s3")
        try:
            return str(s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode())
        except s3.exceptions.NoSuchKey:
            raise CliError(f"{uri} does not exist (yet)") from None


def log_events(group: str, start_ms: int | None = None) -> Iterator[dict[str, Any]]:
    """Every event of a log group from `start_ms` on, in time order within each page, with
    its stream's name (`logStreamName`) and `eventId`."""
    args: dict[str, Any] = {"logGroupName": group}
    if start_ms is not None:
        args["startTime"] = start_ms
    with calling(f"reading log group {group}"):
        logs = boto3.client("logs")
        try:
            for page in logs.get_paginator("filter_log_events").paginate(**args):
                yield from page.get("events", [])
        except logs.exceptions.ResourceNotFoundException:
            raise CliError(f"log group {group} does not exist") from None
