"""Both trainer engines run under the operator as users run them: the trainer image's own
command (torchrun), the run's Kubernetes workers playing, the run's queues between them."""

from __future__ import annotations

import json

import boto3
import pytest

from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.operator import OperatorProcess
from tests.operator.runs import apply, names_of, run_manifest, wait_clean, wait_phase

pytestmark = [pytest.mark.cluster, pytest.mark.aws, pytest.mark.slow]
pytest.importorskip("trl")

STEPS = 10


def test_a_trl_run_succeeds_through_the_operator_and_its_reward_rises(
        cluster: LocalCluster, operator: OperatorProcess, namespace: str) -> None:
    """The target task (reward: the share of completion tokens that are one character) on a
    tiny random model: TRL's GRPOTrainer learns it through the operator's queues and workers."""
    from mtrl_trainer.tokenizer import CharChatTokenizer

    target = CharChatTokenizer().encode("a")[0]
    manifest = run_manifest(
        "trl", trainer={"engine": "trl"},
        model={"name": "random:tiny-qwen2", "dtype": "float32", "maxSequenceLength": 256,
               "lora": {"rank": 8, "alpha": 16, "dropout": 0.0}},
        grpo={"maxSteps": STEPS, "groupSize": 8, "promptsPerStep": 4, "learningRate": 0.02,
              "maxNewTokens": 12, "seed": 7},
        rollout={"environment": "target", "maxTurns": 1, "episodeTimeoutSeconds": 60},
        dataset={"inline": {"train": [{"target_token_id": str(target)}] * 4}})
    del manifest["spec"]["trainer"]["command"]  # the image's: torchrun -m mtrl_trainer
    apply(cluster, namespace, manifest)
    run = wait_phase(cluster, namespace, "trl", "Succeeded", timeout=600)
    assert run["status"]["attempts"] == 1 and run["status"]["progress"]["step"] == STEPS, \
        run["status"]
    bucket, _, prefix = run["status"]["outputUri"].removeprefix("s3://").partition("/")
    body = boto3.client("s3").get_object(Bucket=bucket, Key=f"{prefix}/metrics.jsonl")["Body"]
    metrics = [json.loads(line) for line in body.read().decode().splitlines()]
    assert all(m["engine"] == "trl" for m in metrics), metrics
    rewards = {m["step"]: m["rewardMean"] for m in metrics}
    print(f"reward by step: {rewards}")
    assert sorted(rewards) == list(range(1, STEPS + 1))
    first, last = (rewards[1] + rewards[2]) / 2, (rewards[STEPS - 1] + rewards[STEPS]) / 2
    assert last > first + 0.3, rewards
    wait_clean(cluster, names_of(run))
