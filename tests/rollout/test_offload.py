"""Offloaded payloads: under the run's own prefix, and a denied read told as what it is."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from botocore.exceptions import ClientError

from mtrl_rollout.offload import Codec
from mtrl_rollout.protocol import PayloadPointer, RolloutResult, StopReason, encode
from mtrl_rollout.settings import DataPlaneSettings, run_payload_prefix


class _DeniedS3:
    """S3 as it answers a reader without s3:ListBucket a key that is not there: 403."""

    def get_object(self, **_: Any) -> Any:
        raise ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"},
                           "ResponseMetadata": {"HTTPStatusCode": 403}}, "GetObject")


async def test_a_denied_payload_read_is_logged_as_a_permissions_error(
        caplog: pytest.LogCaptureFixture) -> None:
    """A 403 is not a passing fault: the log says which permission the reader's role lacks
    (the message is left for SQS to deliver again, and to dead-letter). It used to leave as
    an unexplained ClientError, read by every consumer as a transient failure."""
    body = encode(PayloadPointer(bucket="outputs", key="mtrl-payloads/mtrl-a-b-c/x.json",
                                 size_bytes=300_000, sha256="0" * 64))
    with caplog.at_level(logging.ERROR, logger="mtrl.offload"), \
            pytest.raises(ClientError, match="AccessDenied"):
        await Codec(_DeniedS3(), "outputs").from_body(body)
    [record] = [r for r in caplog.records if r.name == "mtrl.offload"]
    assert "s3://outputs/mtrl-payloads/mtrl-a-b-c/x.json was denied" in record.getMessage()
    assert "s3:ListBucket" in record.getMessage() and "s3:GetObject" in record.getMessage()


class _RecordingS3:
    def __init__(self) -> None:
        self.keys: list[str] = []

    def put_object(self, Bucket: str, Key: str, Body: bytes) -> None:
        self.keys.append(Key)


async def test_payloads_go_under_the_prefix_the_operator_gives() -> None:
    """MTRL_PAYLOAD_PREFIX, read by workers and trainer alike, is where a payload goes: the run's
    own prefix, which its teardown deletes. (They went to mtrl-payloads/<uuid>, under no run.)"""
    prefix = run_payload_prefix("mtrl-team-a-run-0b7e3c9e")
    settings = DataPlaneSettings.from_env({
        "MTRL_ROLLOUT_QUEUE_URL": "r", "MTRL_RESULT_QUEUE_URL": "s",
        "MTRL_GENERATE_QUEUE_URL": "g", "MTRL_DLQ_URL": "d", "MTRL_PAYLOAD_BUCKET": "outputs",
        "MTRL_PAYLOAD_PREFIX": prefix})
    s3 = _RecordingS3()
    codec = Codec(s3, settings.payload_bucket, prefix=settings.payload_prefix, threshold_bytes=64)
    result = RolloutResult(run_id="u", step=0, group_id="g", sample_id="s", policy_version=0,
                           aggregate_reward_score=0.0, stop_reason=StopReason.DONE,
                           metrics_list=[], error="e" * 500)
    pointer = json.loads(await codec.to_body(result))
    assert pointer["key"].startswith(f"{prefix}/") and s3.keys == [pointer["key"]]
