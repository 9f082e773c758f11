"""Preflight as pure functions: what to look up, and what a look-up's answer means."""

from __future__ import annotations

from typing import Any

import pytest

from mtrl_api.run import MultiTurnRLRunSpec, MultiTurnRLRunStatus, Phase
from mtrl_operator.controllers.preflight import due
from mtrl_operator.reconcile.preflight import (
    Found,
    S3Lookup,
    ecs_cluster_problem,
    nodes_problem,
    s3_lookups,
    s3_problem,
    verdict,
)
from mtrl_operator.reconcile.run import Act, decide
from tests.operator.reconcile.test_run import NOW, observed


def spec(**sections: Any) -> MultiTurnRLRunSpec:
    base: dict[str, Any] = {
        "model": {"name": "s3://models/qwen/7b"}, "rollout": {"environment": "wordle"},
        "dataset": {"s3": {"trainUri": "s3://data/wordle/train.jsonl",
                           "validationUri": "s3://data/wordle/val.jsonl"}},
        "output": {"s3Uri": "s3://outs/runs", "resumeFrom": "s3://outs/old/checkpoints"},
        "trainer": {"instanceType": "ml.p5.48xlarge", "nodes": 2}}
    return MultiTurnRLRunSpec.model_validate({**base, **sections})


def test_every_location_a_run_reads_or_writes_is_looked_up() -> None:
    lookups = {lk.field: lk for lk in s3_lookups(spec())}
    assert set(lookups) == {"spec.output.s3Uri", "spec.dataset.s3.trainUri",
                            "spec.dataset.s3.validationUri", "spec.model.name",
                            "spec.output.resumeFrom"}
    # The output folder is the run's own and need not exist: only its bucket.
    assert (lookups["spec.output.s3Uri"].bucket, lookups["spec.output.s3Uri"].prefix) == ("outs", "")
    train = lookups["spec.dataset.s3.trainUri"]
    assert (train.bucket, train.prefix, train.whole_key) == ("data", "wordle/train.jsonl", True)
    # A folder is listed as a folder: "qwen/7b/", so "qwen/7b-old/..." does not count.
    assert lookups["spec.model.name"].prefix == "qwen/7b/"


def test_a_hub_model_and_inline_data_need_no_s3_lookup_but_the_bucket() -> None:
    lookups = s3_lookups(spec(model={"name": "Qwen/Qwen2.5-7B"}, output={"s3Uri": "s3://o"},
                              dataset={"inline": {"train": [{"secret": "crane"}]}}))
    assert [lk.field for lk in lookups] == ["spec.output.s3Uri"]


@pytest.mark.parametrize(("whole_key", "found", "expected"), [
    (True, Found.NO_BUCKET, ("BucketNotFound",
                             "spec.x: S3 bucket 'data' does not exist (s3://data/k)")),
    (True, Found.NOTHING, ("ObjectNotFound", "spec.x: no S3 object s3://data/k")),
    (False, Found.NOTHING, ("NothingAtPrefix", "spec.x: nothing under s3://data/k/ in S3")),
    (True, Found.PRESENT, None),
    (True, Found.DENIED, None),  # not checked, not failed
])
def test_an_s3_lookup_names_the_field_and_the_location(
        whole_key: bool, found: Found, expected: tuple[str, str] | None) -> None:
    assert s3_problem(S3Lookup("spec.x", "s3://data/k", "data", "k", whole_key), found) == expected


def test_an_empty_output_bucket_is_fine() -> None:
    lookup = s3_lookups(spec())[0]
    assert s3_problem(lookup, Found.NOTHING) is None
    assert s3_problem(lookup, Found.NO_BUCKET) is not None


def test_a_missing_or_inactive_ecs_cluster_is_named_with_its_region() -> None:
    missing = {"clusters": [], "failures": [{"arn": "arn:...:cluster/c", "reason": "MISSING"}]}
    reason, message = ecs_cluster_problem("c", "eu-west-1", missing) or ("", "")
    assert reason == "ClusterNotFoundException"
    assert message.startswith("ECS cluster 'c' was not found in eu-west-1 (DescribeClusters)")
    inactive = {"clusters": [{"clusterName": "c", "status": "INACTIVE"}]}
    assert ecs_cluster_problem("c", "eu-west-1", inactive) is not None
    active = {"clusters": [{"clusterName": "c", "status": "ACTIVE"}]}
    assert ecs_cluster_problem("c", "eu-west-1", active) is None


def node(name: str, instance_type: str, gpus: int = 8, efa: int = 32) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"node.kubernetes.io/instance-type": instance_type}},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus),
                                       "vpc.amazonaws.com/efa": str(efa), "cpu": "192"}}}


def test_nodes_of_the_instance_type_with_the_devices_asked_for_pass() -> None:
    nodes = [node("p5-0", "ml.p5.48xlarge"), node("p5-1", "ml.p5.48xlarge"), node("c", "ml.m5.xlarge")]
    assert nodes_problem(spec(), nodes) is None


def test_an_instance_type_no_node_has_is_named_with_the_types_there_are() -> None:
    nodes = [node("p5-0", "ml.p5.48xlarge"), node("c", "ml.m5.xlarge", gpus=0, efa=0)]
    reason, message = nodes_problem(spec(trainer={"instanceType": "p5.48xlarge"}), nodes) or ("", "")
    assert reason == "NoNodeOfInstanceType"
    assert message == ("spec.trainer.instanceType: no node has node.kubernetes.io/instance-type="
                       "p5.48xlarge (the cluster has ml.m5.xlarge, ml.p5.48xlarge)")


def test_a_cpu_instance_asked_for_gpus_says_how_many_it_has() -> None:
    nodes = [node("c", "ml.m5.xlarge", gpus=0, efa=0)]
    reason, message = nodes_problem(spec(trainer={"instanceType": "ml.m5.xlarge"}), nodes) or ("", "")
    assert reason == "InsufficientResources"
    assert message == ("spec.trainer.gpusPerNode asks for 8 nvidia.com/gpu per node; nodes of "
                       "ml.m5.xlarge have at most 0 (node c)")
    assert nodes_problem(spec(trainer={"instanceType": "ml.m5.xlarge", "gpusPerNode": 0,
                                       "efaPerNode": 0}), nodes) is None


def test_more_nodes_than_the_cluster_has_fit_is_refused() -> None:
    nodes = [node("p5-0", "ml.p5.48xlarge"), node("p5-1", "ml.p5.48xlarge", gpus=4)]
    reason, message = nodes_problem(spec(), nodes) or ("", "")
    assert (reason, message) == ("NotEnoughNodes", "spec.trainer.nodes asks for 2 nodes of "
                                                   "ml.p5.48xlarge; the cluster has 1")


def test_preflight_runs_until_it_passed_once_and_never_once_a_trainer_launched() -> None:
    assert due(MultiTurnRLRunStatus(), deleting=False)
    assert not due(MultiTurnRLRunStatus(), deleting=True)
    assert not due(MultiTurnRLRunStatus(phase=Phase.FAILED), deleting=False)
    assert not due(MultiTurnRLRunStatus(phase=Phase.RUNNING, attempts=1, launched_attempt=1),
                   deleting=False)
    passed = decide(observed(preflight="checked S3 locations")).status
    assert not due(passed, deleting=False)


def test_a_passed_preflight_is_a_condition_and_a_failed_one_fails_before_anything_is_made() -> None:
    d = decide(observed(preflight="checked S3 locations, nodes of ml.p5.48xlarge"))
    preflight = next(c for c in d.status.conditions if c.type == "Preflight")
    assert (preflight.status, preflight.reason) == ("True", "Passed")
    assert d.actions == [Act.ENSURE_QUEUES]
    d = decide(observed(spec_error=("BucketNotFound", "spec.output.s3Uri: S3 bucket 'o' does "
                                                      "not exist (s3://o)")))
    preflight = next(c for c in d.status.conditions if c.type == "Preflight")
    assert (preflight.status, preflight.reason) == ("False", "BucketNotFound")
    assert d.status.phase == Phase.FAILED and d.status.completion_time == NOW
    assert Act.ENSURE_QUEUES not in d.actions and Act.ENSURE_TRAINER not in d.actions


def test_every_problem_is_told_at_once_the_first_leading() -> None:
    assert verdict([]) is None
    assert verdict([("BucketNotFound", "spec.output.s3Uri: no bucket")]) == \
        ("BucketNotFound", "spec.output.s3Uri: no bucket")
    assert verdict([("BucketNotFound", "spec.output.s3Uri: no bucket"),
                    ("ObjectNotFound", "spec.dataset.s3.trainUri: no object"),
                    ("NotEnoughNodes", "spec.trainer.nodes: two asked, one there")]) == (
        "BucketNotFound", "spec.output.s3Uri: no bucket (and 2 more: spec.dataset.s3.trainUri: "
                          "no object; spec.trainer.nodes: two asked, one there)")


def test_a_resume_from_a_checkpoint_at_or_past_max_steps_is_refused() -> None:
    from mtrl_operator.reconcile.preflight import resume_problem

    run = spec(grpo={"maxSteps": 20})
    keys = ["old/checkpoints/step-000010/COMPLETE", "old/checkpoints/step-000020/adapter.bin",
            "old/checkpoints/step-000020/COMPLETE", "older/checkpoints/step-000005/COMPLETE"]
    reason, message = resume_problem(run, keys) or ("", "")
    assert reason == "ResumePastMaxSteps" and "newest checkpoint is at step 20" in message
    # A checkpoint not yet committed (no COMPLETE) does not count; one below maxSteps is fine.
    assert resume_problem(run, keys[:2] + keys[3:]) is None
    assert resume_problem(run, []) is None
