"""Asynchronous GRPO on CPU (issue 15): synchronous steps against maxStepsOffPolicy 1 and 2,
side by side, on the same machine, model, tasks and seeds.

Each mode is a real training run through the real protocol: `python -m mtrl_trainer` (a tiny
random Qwen2-shaped policy with LoRA) and one `python -m mtrl_worker` playing the learnable
`target` environment with `--turns` turns per episode, each reply delayed by `--latency-ms`
(an environment that thinks: a tool call, a code run, a simulated user), over SQS and S3 on a
moto server. Every mode trains the same number of steps, so the same number of samples. Each
latency gets a table of its own.

Reported per mode, from the run's own metrics.jsonl (stepSeconds, updateSeconds, decodeSeconds):
- wall seconds per step (mean and median over steps 2..N: step 1 also fills the pipeline) and
  steps per hour, with the ratio to the synchronous run;
- the fraction of wall time the trainer is busy: updating, or generating (the model is locked
  by one of them at a time), and updating alone. Overlap hides the environment's share of a
  synchronous step: 1 / (the synchronous run's busy fraction) is about what hiding all of it
  gains, printed under the table (more episodes at once also batch better, so a bound can beat
  it a little). On this CPU the policy's own sampling is a large share of a step, where a GPU
  samples this tiny model in milliseconds;
- the mean reward of the first and the last two steps, and the policy lag actually trained on.

    python bench/async_bench.py [--steps 20] [--turns 4] [--latency-ms 200 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import boto3

from mtrl_rollout.queues import create_run_queues, resource_tags
from mtrl_testbed.moto import aws_endpoint
from mtrl_trainer.tokenizer import CharChatTokenizer

GROUP, PROMPTS = 8, 4


def spec(bucket: str, args: argparse.Namespace, bound: int) -> dict[str, Any]:
    target = str(CharChatTokenizer().encode("a")[0])
    return {
        "model": {"name": "random:tiny-qwen2", "dtype": "float32", "maxSequenceLength": 512,
                  "lora": {"rank": 8, "alpha": 16, "dropout": 0.0}},
        "grpo": {"groupSize": GROUP, "promptsPerStep": PROMPTS, "maxSteps": args.steps,
                 "learningRate": 0.02, "maxNewTokens": 12, "temperature": 1.0,
                 "lossType": "dapo", "seed": 7, "maxStepsOffPolicy": bound,
                 "rolloutCorrection": {"mode": "token" if bound else "none"}},
        "rollout": {"environment": "target", "maxTurns": args.turns, "episodeTimeoutSeconds": 120},
        "dataset": {"inline": {"train": [{"target_token_id": target}] * PROMPTS},
                    "evalIntervalSteps": 0},
        "output": {"s3Uri": f"s3://{bucket}/run", "checkpointIntervalSteps": args.steps},
    }


def run(args: argparse.Namespace, bound: int, latency_ms: int,
        workdir: Path) -> list[dict[str, Any]]:
    """One training run; its metrics.jsonl."""
    prefix = f"async{bound}-{uuid.uuid4().hex[:8]}"
    run_id = f"uid-{prefix}"
    queues = create_run_queues(boto3.client("sqs"), prefix,
                               resource_tags(run_id, "default", "bench", "bench"))
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=prefix, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    config = workdir / f"{prefix}.json"
    config.write_text(json.dumps(spec(prefix, args, bound)))
    env = os.environ | {
        "MTRL_RUN_ID": run_id, "MTRL_RUN_NAME": "bench", "MTRL_NAMESPACE": "bench",
        "MTRL_ROLLOUT_QUEUE_URL": queues.rollout_url, "MTRL_RESULT_QUEUE_URL": queues.result_url,
        "MTRL_GENERATE_QUEUE_URL": queues.generate_url, "MTRL_DLQ_URL": queues.dlq_url,
        "MTRL_PAYLOAD_BUCKET": prefix, "OMP_NUM_THREADS": "1",
    }
    with open(workdir / f"{prefix}-worker.log", "wb") as log:
        worker = subprocess.Popen([sys.executable, "-m", "mtrl_worker"], stdout=log,
                                  stderr=subprocess.STDOUT, env=env | {
            "MTRL_ENVIRONMENT": "target", "MTRL_QUEUE_PREFIX": prefix, "MTRL_WORKER_ID": "w0",
            "MTRL_ENVIRONMENT_ARGS": json.dumps({"turns": args.turns,
                                                 "latency_ms": latency_ms}),
            "MTRL_HEALTH_PORT": "0", "MTRL_POLL_WAIT_S": "1", "MTRL_CONCURRENCY": "256"})
    try:
        with open(workdir / f"{prefix}-trainer.log", "wb") as log:
            code = subprocess.run([sys.executable, "-m", "mtrl_trainer"], stdout=log,
                                  stderr=subprocess.STDOUT, timeout=1800,
                                  env=env | {"MTRL_CONFIG": str(config),
                                             "MTRL_COLLECT_GRACE_S": "10"}).returncode
    finally:
        worker.terminate()
        worker.wait(30)
    if code:
        tail = (workdir / f"{prefix}-trainer.log").read_text(errors="replace")[-2000:]
        raise SystemExit(f"the trainer of mode {bound} exited {code}:\n{tail}")
    key = f"run/bench/bench/{run_id}/metrics.jsonl"
    body = s3.get_object(Bucket=prefix, Key=key)["Body"].read().decode()
    return [json.loads(line) for line in body.splitlines()]


def summary(metrics: list[dict[str, Any]]) -> dict[str, float]:
    steady = metrics[1:]
    wall = sum(m["stepSeconds"] for m in steady)
    rewards = [m["rewardMean"] for m in metrics]
    return {
        "mean_s": wall / len(steady),
        "median_s": statistics.median(m["stepSeconds"] for m in steady),
        "busy": sum(m["updateSeconds"] + m["decodeSeconds"] for m in steady) / wall,
        "updating": sum(m["updateSeconds"] for m in steady) / wall,
        "first": (rewards[0] + rewards[1]) / 2,
        "last": (rewards[-2] + rewards[-1]) / 2,
        "lag": max(m["trainedPolicyVersion"] - m["oldestPolicyVersion"] for m in metrics),
        "stale": sum(m["staleSamples"] for m in metrics),
    }


def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="async-bench-") as tmp:
        for latency_ms in args.latency_ms:
            results = {bound: summary(run(args, bound, latency_ms, Path(tmp)))
                       for bound in args.bounds}
            table(args, latency_ms, results)


def table(args: argparse.Namespace, latency_ms: int, results: dict[int, dict[str, float]]) -> None:
    base = results[args.bounds[0]]
    print(f"\n> `target` environment, {args.turns} turns, {latency_ms} ms environment latency "
          f"per turn, {PROMPTS} prompts x {GROUP} episodes per step, {args.steps} steps "
          f"({args.steps * PROMPTS * GROUP} samples) per mode; a tiny random policy on CPU, one "
          "worker process, moto on loopback\n")
    print("| maxStepsOffPolicy | s/step (mean) | s/step (median) | steps/hour | vs sync | "
          "trainer busy | updating | reward first 2 -> last 2 steps | max lag trained | stale |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for bound, r in results.items():
        print(f"| {bound} | {r['mean_s']:.2f} | {r['median_s']:.2f} | {3600 / r['mean_s']:,.0f} "
              f"| {base['mean_s'] / r['mean_s']:.2f}x | {r['busy']:.0%} | {r['updating']:.0%} "
              f"| {r['first']:.3f} -> {r['last']:.3f} | {r['lag']} | {r['stale']} |")
    print(f"\n> At {latency_ms} ms the synchronous trainer is busy {base['busy']:.0%} of a step "
          f"(sampling or updating): hiding all environment time at its sampling speed would "
          f"give about {1 / base['busy']:.2f}x (more episodes at once also batch better). Busy "
          "= updating or sampling (one holds the model at a time), steps 2..N; the last "
          "maxStepsOffPolicy steps have nothing left to play ahead.")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--latency-ms", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--bounds", type=int, nargs="+", default=[0, 1, 2])
    arguments = parser.parse_args()
    with aws_endpoint():
        main(arguments)
