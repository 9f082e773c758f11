"""What the shipped worker and trainer policies let a reader of offloaded payloads do, and what a
missing payload answers with them (no servers: the policies, rendered, and the evaluator).

S3 answers a read of a missing key with 404 only to a reader allowed s3:ListBucket on the
bucket, and with 403 to any other (docs.aws.amazon.com/AmazonS3/latest/API/API_GetObject.html,
"Permissions"). A 404 is a poison message (`Codec.from_body`: ProtocolError, dead-lettered at
once); a 403 is logged as a permissions error and left for SQS to deliver again.
"""

from __future__ import annotations

import pytest

from mtrl_operator.naming import RunNames
from mtrl_rollout.settings import run_payload_prefix
from tests.iam.calls import Permission
from tests.iam.policy import allows, rendered

NAMES = RunNames("team-a", "run", "0b7e3c9e-2a65-4f1c-9d55-3b1f7e8d2c11")
OTHER = RunNames("team-b", "run", "1c8f4dae-3b76-4a2d-8e66-4c2f8f9e3d22")
BUCKET = "outputs"
VALUES = {"Region": "us-west-2", "Account": "123456789012", "OutputBucket": BUCKET,
          "OutputPrefix": "runs", "QueuePrefix": NAMES.aws_prefix}


def _key(names: RunNames) -> str:
    return f"{run_payload_prefix(names.aws_prefix)}/6f1c.json"


@pytest.mark.parametrize("file", ["worker-policy.json", "trainer-policy.json"])
def test_a_missing_payload_of_the_run_answers_404(file: str) -> None:
    """The reader may list its run's payload prefix, so S3 says 404 for a key that is not
    there. (Without s3:ListBucket the shipped worker policy made every missing payload a
    403, which the reader took for a passing fault and retried until the dead-letter queue.)"""
    policy = rendered(file, VALUES)
    assert allows(policy, Permission("s3:ListBucket", f"arn:aws:s3:::{BUCKET}",
                                     (("s3:prefix", _key(NAMES)),)))


@pytest.mark.parametrize("file", ["worker-policy.json", "trainer-policy.json"])
def test_payloads_are_read_and_written_under_the_run_prefix_only(file: str) -> None:
    policy = rendered(file, VALUES)
    for action in ("s3:GetObject", "s3:PutObject", "s3:DeleteObject"):
        assert allows(policy, Permission(action, f"arn:aws:s3:::{BUCKET}/{_key(NAMES)}"))
        assert not allows(policy, Permission(action, f"arn:aws:s3:::{BUCKET}/{_key(OTHER)}"))
    assert not allows(policy, Permission("s3:ListBucket", f"arn:aws:s3:::{BUCKET}",
                                         (("s3:prefix", _key(OTHER)),)))


def test_the_operator_may_delete_every_run_payloads_at_teardown() -> None:
    policy = rendered("operator-policy.json", {
        "Region": "us-west-2", "Account": "123456789012", "EcsCluster": "default",
        "WorkerTaskRoleArn": "arn:aws:iam::123456789012:role/w",
        "WorkerExecutionRoleArn": "arn:aws:iam::123456789012:role/e", "RunBuckets": BUCKET})
    assert allows(policy, Permission("s3:ListBucket", f"arn:aws:s3:::{BUCKET}",
                                     (("s3:prefix", f"{run_payload_prefix(NAMES.aws_prefix)}/"),)))
    assert allows(policy, Permission("s3:DeleteObject", f"arn:aws:s3:::{BUCKET}/{_key(NAMES)}"))
    assert not allows(policy, Permission("s3:DeleteObject", f"arn:aws:s3:::{BUCKET}/runs/x"))
