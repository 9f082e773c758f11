"""Held-out evaluation: sampled and greedy, every play in eval.jsonl beside metrics.jsonl."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import boto3
import pytest

pytest.importorskip("torch")

from mtrl_rollout.protocol import MetricEntry, RolloutResult, StopReason
from mtrl_trainer.evaluation import evaluation, plays
from mtrl_trainer.loop import Run
from mtrl_trainer.orchestration import sample_id
from mtrl_trainer.progress import EvaluationLog, MetricsHistory
from mtrl_trainer.sampling import SamplingParams

from .conftest import TrainingRun, run_spec


def _result(kind: str, task: int, play: int, reward: float, solved: bool) -> RolloutResult:
    return RolloutResult(
        run_id="r", step=3, group_id=f"a1-{kind}3-g{task}",
        sample_id=sample_id("a1", kind, 3, task, play), policy_version=4,
        aggregate_reward_score=reward, stop_reason=StopReason.DONE,
        metrics_list=[MetricEntry(name="solved", value=float(solved), type="Reward"),
                      MetricEntry(name="consistent", value=0.5, type="Reward"),
                      MetricEntry(name="turns", value=6.0, type="Metric")])


def test_each_play_is_a_line_naming_its_task_play_success_components_and_metrics() -> None:
    results = [_result("v", 12, 10, 0.9, True), _result("v", 12, 2, 0.1, False),
               _result("v", 3, 0, 0.2, False)]
    assert plays(4, "sampled", results) == [
        {"step": 4, "mode": "sampled", "task": 3, "play": 0, "success": False, "reward": 0.2,
         "components": {"solved": 0.0, "consistent": 0.5},
         "metrics": {"turns": 6.0}},
        {"step": 4, "mode": "sampled", "task": 12, "play": 2, "success": False, "reward": 0.1,
         "components": {"solved": 0.0, "consistent": 0.5},
         "metrics": {"turns": 6.0}},
        {"step": 4, "mode": "sampled", "task": 12, "play": 10, "success": True, "reward": 0.9,
         "components": {"solved": 1.0, "consistent": 0.5},
         "metrics": {"turns": 6.0}},
    ]
    greedy = [_result("vg", 12, 0, 0.9, True), _result("vg", 3, 0, 0.9, True)]
    assert evaluation(results, [1, 2], greedy).greedy_success_rate == 1.0
    assert evaluation(results, [1, 2], None).greedy_success_rate is None
    assert evaluation(results, [1, 2], None).success_rate == pytest.approx(1 / 3)


def test_a_greedy_evaluation_turns_rank_zeros_sampler_greedy_and_back() -> None:
    """While greedy games play, rank 0's decoder samples at temperature 0 and serves every
    request (no other rank's decoder switched); after, the run's sampling is as it was, with
    the same random generator (greedy decoding draws nothing from it)."""
    import torch

    params = SamplingParams(temperature=0.7, top_p=0.9, stop_token_ids=frozenset({2}))
    generator = torch.Generator()
    decoder = SimpleNamespace(params=params, generator=generator)

    lock = threading.Lock()
    held: list[bool] = []

    def configure(new: SamplingParams, gen: torch.Generator | None = None) -> None:
        held.append(lock.locked())
        decoder.params, decoder.generator = new, gen

    decoder.configure = configure
    run = SimpleNamespace(service=SimpleNamespace(decoder=decoder), model_lock=lock,
                          _greedy_now=False)
    run._configure_sampler = lambda p, g: Run._configure_sampler(run, p, g)  # type: ignore[arg-type]
    seen = []

    async def evaluate() -> None:
        async with Run._greedy(run):  # type: ignore[arg-type]
            seen.append((decoder.params, decoder.generator, run._greedy_now))

    asyncio.run(evaluate())
    assert seen == [(SamplingParams(0.0, 0.9, frozenset({2})), generator, True)]
    assert (decoder.params, decoder.generator, run._greedy_now) == (params, generator, False)
    assert held == [True, True]  # both switches under the model lock


class _Bucket:
    """What the logs need of an S3 client."""

    class exceptions:
        class NoSuchKey(Exception):
            pass

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    def put_object(self, Bucket: str, Key: str, Body: bytes) -> None:
        self.objects[Key] = Body

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        if Key not in self.objects:
            raise self.exceptions.NoSuchKey(Key)

        class Body:
            @staticmethod
            def read() -> bytes:
                return self.objects[Key]

        return {"Body": Body}


def test_the_evaluation_log_keeps_every_play_by_step_and_a_resumed_run_drops_later_steps() -> None:
    bucket = _Bucket()
    log = EvaluationLog("s3://b/runs/x", 0, client=bucket)
    log.add(0, [{"step": 0, "mode": "sampled", "task": 0}])
    log.add(0, [{"step": 0, "mode": "greedy", "task": 0}])
    log.add(4, [{"step": 4, "mode": "sampled", "task": 0}])
    lines = [json.loads(line) for line in bucket.objects["runs/x/eval.jsonl"].splitlines()]
    assert [(line["step"], line["mode"]) for line in lines] == [
        (0, "sampled"), (0, "greedy"), (4, "sampled")]
    resumed = EvaluationLog("s3://b/runs/x", 2, client=bucket)  # step 4 is played again
    resumed.add(4, [{"step": 4, "mode": "greedy", "task": 1}])
    lines = [json.loads(line) for line in bucket.objects["runs/x/eval.jsonl"].splitlines()]
    assert [(line["step"], line["mode"]) for line in lines] == [
        (0, "sampled"), (0, "greedy"), (4, "greedy")]
    # metrics.jsonl keeps its one line per step
    metrics = MetricsHistory("s3://b/runs/x", 0, client=bucket)
    metrics.report({"step": 1, "rewardMean": 0.1})
    metrics.report({"step": 1, "rewardMean": 0.2})
    assert bucket.objects["runs/x/metrics.jsonl"] == b'{"step": 1, "rewardMean": 0.2}\n'


def _eval_lines(run: TrainingRun, spec: dict[str, Any]) -> list[dict[str, Any]]:
    bucket, _, prefix = run.output_uri(spec).removeprefix("s3://").partition("/")
    body = boto3.client("s3").get_object(Bucket=bucket, Key=f"{prefix}/eval.jsonl")["Body"]
    return [json.loads(line) for line in body.read().decode().splitlines()]


@pytest.mark.slow
@pytest.mark.aws
@pytest.mark.parametrize("engine", ["mtrl", "trl"])
def test_greedy_evaluation_decodes_the_policys_own_best_and_every_play_is_recorded(
        training_runs: Callable[[], TrainingRun], engine: str) -> None:
    """Both evaluations (before training and after the last step) play every validation task
    four times sampled and once greedily, and eval.jsonl has each play; the two validation
    tasks are the same row, so their greedy plays (the most likely tokens from the same
    prompt) score the same."""
    if engine == "trl":
        pytest.importorskip("trl")
    run = training_runs()
    # 48 new tokens: the random policy samples the target in some group, so the run trains and
    # exits 0 (at 12, two steps can score 0 everywhere: 'nothing trained', as test_output met).
    spec = run_spec(run.bucket, maxSteps=2, maxNewTokens=48)
    spec["dataset"] |= {"evalIntervalSteps": 2, "evalOnStart": True, "evalGreedy": True,
                        "evalPassAtK": [1, 4]}
    if engine == "trl":
        spec |= {"trainer": {"engine": "trl", "gpusPerNode": 0}}
    run.start_worker()
    trainer = run.start_trainer(spec)
    deadline = time.monotonic() + 300
    while trainer.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert trainer.wait(5) == 0, run.log("trainer")[-3000:]
    metrics = {m["step"]: m for m in run.metrics(spec)}
    assert [s for s, m in metrics.items() if m["validationGreedySuccessRate"] is not None] == [0, 2]
    lines = _eval_lines(run, spec)
    for step in (0, 2):
        sampled = [line for line in lines if line["step"] == step and line["mode"] == "sampled"]
        greedy = [line for line in lines if line["step"] == step and line["mode"] == "greedy"]
        assert sorted((line["task"], line["play"]) for line in sampled) == [
            (t, p) for t in (0, 1) for p in range(4)]
        assert sorted((line["task"], line["play"]) for line in greedy) == [(0, 0), (1, 0)]
        assert len({line["reward"] for line in greedy}) == 1, greedy
        assert all(set(line["components"]) == {"target_fraction"} for line in lines)
        rates = (metrics[step]["validationSuccessRate"], metrics[step]["validationGreedySuccessRate"])
        assert rates == (pytest.approx(sum(line["success"] for line in sampled) / 8),
                         pytest.approx(sum(line["success"] for line in greedy) / 2))
