"""Preflight against the real API server, the node agent's nodes and moto: a run that cannot
work fails before anything is created (no queue, no worker, no trainer), within a minute, with
one sentence naming what and where."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import boto3
import pytest

from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.operator import OperatorProcess
from tests.conftest import OUTPUT_BUCKET
from tests.operator.runs import (
    apply,
    aws_leftovers,
    condition,
    get,
    k8s_leftovers,
    names_of,
    run_manifest,
    wait_for,
    wait_phase,
)

pytestmark = [pytest.mark.cluster, pytest.mark.aws]

DATA_BUCKET = OUTPUT_BUCKET  # made by the operator fixture; the objects below are not
# Each case: the spec's sections, then the Failed reason and message the run must show.
CASES: dict[str, tuple[dict[str, Any], str, str]] = {
    "no-bucket": ({"output": {"s3Uri": "s3://mtrl-no-such-bucket/runs"}}, "BucketNotFound",
                  "spec.output.s3Uri: S3 bucket 'mtrl-no-such-bucket' does not exist "
                  "(s3://mtrl-no-such-bucket/runs)"),
    "no-dataset": ({"dataset": {"s3": {"trainUri": f"s3://{DATA_BUCKET}/data/missing.jsonl"}}},
                   "ObjectNotFound",
                   f"spec.dataset.s3.trainUri: no S3 object s3://{DATA_BUCKET}/data/missing.jsonl"),
    "no-model": ({"model": {"name": f"s3://{DATA_BUCKET}/models/qwen", "dtype": "float32"}},
                 "NothingAtPrefix",
                 f"spec.model.name: nothing under s3://{DATA_BUCKET}/models/qwen/ in S3"),
    "no-checkpoint": ({"output": {"s3Uri": f"s3://{DATA_BUCKET}/runs",
                                  "resumeFrom": f"s3://{DATA_BUCKET}/runs/gone"}},
                      "NothingAtPrefix",
                      f"spec.output.resumeFrom: nothing under s3://{DATA_BUCKET}/runs/gone/ in S3"),
    # A run that finished its 3 steps: resuming from it at maxSteps 3 would train nothing.
    "resume-past-end": ({"output": {"s3Uri": f"s3://{DATA_BUCKET}/runs",
                                    "resumeFrom": f"s3://{DATA_BUCKET}/runs/finished"}},
                        "ResumePastMaxSteps",
                        "spec.output.resumeFrom: its newest checkpoint is at step 3, at or past "
                        "spec.grpo.maxSteps 3: this run would train nothing"),
    "no-such-nodes": ({"trainer": {"instanceType": "p5.48xlarge"}}, "NoNodeOfInstanceType",
                      "spec.trainer.instanceType: no node has node.kubernetes.io/instance-type="
                      "p5.48xlarge (the cluster has ml.p5.48xlarge)"),
    "too-many-gpus": ({"trainer": {"gpusPerNode": 16}}, "InsufficientResources",
                      "spec.trainer.gpusPerNode asks for 16 nvidia.com/gpu per node; nodes of "
                      "ml.p5.48xlarge have at most 8"),
    # Everything wrong is told at once: a user fixing a new spec applies it once.
    "three-problems": ({"output": {"s3Uri": "s3://mtrl-no-such-bucket/runs"},
                        "dataset": {"s3": {"trainUri": f"s3://{DATA_BUCKET}/data/missing.jsonl"}},
                        "trainer": {"gpusPerNode": 16}}, "BucketNotFound",
                       "spec.output.s3Uri: S3 bucket 'mtrl-no-such-bucket' does not exist "
                       "(s3://mtrl-no-such-bucket/runs) (and 2 more: spec.dataset.s3.trainUri: "
                       f"no S3 object s3://{DATA_BUCKET}/data/missing.jsonl; "
                       "spec.trainer.gpusPerNode asks for 16 nvidia.com/gpu per node; nodes of "
                       "ml.p5.48xlarge have at most 8"),
}


def test_a_run_that_cannot_work_fails_before_anything_is_created(
        cluster: LocalCluster, operator: OperatorProcess, namespace: str) -> None:
    # A model folder next to the one asked for must not count: "models/qwen-old/".
    s3 = boto3.client("s3")
    s3.put_object(Bucket=DATA_BUCKET, Key="models/qwen-old/config.json", Body=b"{}")
    for step in (2, 3):
        s3.put_object(Bucket=DATA_BUCKET, Key=f"runs/finished/checkpoints/step-{step:06d}/COMPLETE",
                      Body=b"")
    for name, (sections, _, _) in CASES.items():
        manifest = run_manifest(name, **sections)
        if "s3" in manifest["spec"]["dataset"]:
            del manifest["spec"]["dataset"]["inline"]
        apply(cluster, namespace, manifest)
    for name, (_, reason, message) in CASES.items():
        run = wait_phase(cluster, namespace, name, "Failed", timeout=60)
        status = run["status"]
        assert (condition(run, "Failed") or {}).get("reason") == reason, status
        assert status["message"].startswith(message), status["message"]
        assert (condition(run, "Preflight") or {}).get("status") == "False", status
        # Nothing was made: no trainer was ever launched (recorded before any create), and
        # neither AWS nor the cluster holds anything of the run.
        assert status.get("launchedAttempt", 0) == 0, status
        names = names_of(run)
        assert not aws_leftovers(names), aws_leftovers(names)
        assert not k8s_leftovers(cluster, namespace, names.uid), name


def test_a_run_that_can_work_records_what_preflight_checked(
        cluster: LocalCluster, operator: OperatorProcess, namespace: str) -> None:
    s3 = boto3.client("s3")
    s3.put_object(Bucket=DATA_BUCKET, Key="data/train.jsonl", Body=b'{"target": "a"}\n')
    manifest = run_manifest("fine", dataset={"s3": {"trainUri": f"s3://{DATA_BUCKET}/data/train.jsonl"}})
    del manifest["spec"]["dataset"]["inline"]
    apply(cluster, namespace, manifest)
    run = wait_phase(cluster, namespace, "fine", "Succeeded", timeout=120)
    preflight = condition(run, "Preflight") or {}
    assert (preflight.get("status"), preflight.get("reason")) == ("True", "Passed"), preflight
    assert preflight["message"] == "checked S3 locations, nodes of ml.p5.48xlarge", preflight


def test_without_aws_credentials_a_run_waits_saying_so_and_creates_nothing(
        cluster: LocalCluster, operator_factory: Callable[..., OperatorProcess]) -> None:
    """No credentials is not the spec's fault (IRSA may be fixed in a minute): the run stays
    Pending and says why, instead of a blank phase, and nothing is created meanwhile."""
    namespace = f"nocreds-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", namespace)
    operator_factory(MTRL_OPERATOR_ID="nocreds", MTRL_NAMESPACES=namespace,
                     MTRL_SWEEP_INTERVAL_SECONDS="0", AWS_ACCESS_KEY_ID="",
                     AWS_SECRET_ACCESS_KEY="", AWS_SESSION_TOKEN="",
                     AWS_SHARED_CREDENTIALS_FILE="/nonexistent", AWS_CONFIG_FILE="/nonexistent",
                     AWS_EC2_METADATA_DISABLED="true")
    apply(cluster, namespace, run_manifest("no-creds"))
    status = wait_for(lambda: "NoCredentialsError" in (
        s := ((get(cluster, namespace, "no-creds") or {}).get("status") or {})).get("message", "")
        and s, 60, "the run to say it has no credentials")
    assert status["phase"] == "Pending", status
    assert status["message"] == "NoCredentialsError: Unable to locate credentials; retrying", status
    assert status.get("launchedAttempt", 0) == 0
    assert not k8s_leftovers(cluster, namespace, get(cluster, namespace, "no-creds")["metadata"]["uid"])
    cluster.kubectl("annotate", "mtrlrun", "no-creds", "-n", namespace,
                    "mtrl.dev/force-release=true")
    cluster.kubectl("delete", "mtrlrun", "no-creds", "-n", namespace, "--timeout=60s")
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
