"""Asynchronous GRPO on CPU (issue 15): synchronous steps against maxStepsOffPolicy 1 and 2,
side by side, on the same machine, model, tasks and seeds.

Each mode is a real training run through the real protocol: `python -m mtrl_trainer` (a tiny
random Qwen2-shaped policy with LoRA) and one `python -m mtrl_worker` playing the learnable
`target` environment with `--turns` turns per episode, each reply delayed by `--latency-ms`
(an environment that thinks: a tool call, a code run, a simulated user), over SQS and S3 on a
moto server. Every mode trains the same number of steps, so the same number of samples. Each
latency gets a table of its own.

Reported per mode, from the run's own metrics.jsonl (stepSeconds, updateSeconds, decodeSeconds,
rolloutSeconds):
- wall seconds per step (mean and median over steps 2..N: step 1 also fills the pipeline) and
  steps per hour, with the ratio to the synchronous run;
- the fraction of wall time the trainer is busy: updating, or generating (the model is locked
  by one of them at a time), and updating alone. Overlap hides the environment's share of a
  synchronous step: 1 / (the synchronous run's busy fraction) is about what hiding all of it
  gains, printed under the table (more episodes at once also batch better, so a bound can beat
  it a little). On this CPU the policy's own sampling is a large share of a step, where a GPU
  samples this tiny model in milliseconds;
- the trainer's idle seconds per step, and the episodes' critical path: from publishing a
  step's requests to its last result, over the steps whose trainer waited for them (the last
  result came during the wait). A step's requests go out maxStepsOffPolicy steps ahead, so
  with k steps of play ahead k+1 steps must hold an episode's whole critical path (every turn
  sampled, then answered by the environment) and the update;
- the ceiling at each depth: the synchronous step over the longer of the trainer's own work
  and (the critical path plus the update) / (k+1), at the synchronous run's speeds, and the
  share of it reached;
- the mean reward of the first and the last two steps, and the policy lag actually trained on.

    python bench/async_bench.py [--steps 20] [--turns 4] [--latency-ms 200 1000] [--bounds 0 1 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import SqsProbe, train

from mtrl_testbed.moto import aws_endpoint
from mtrl_trainer.tokenizer import CharChatTokenizer

GROUP, PROMPTS = 8, 4
WAITED_S = 0.1  # a step whose gather took longer waited for its episodes


def spec(args: argparse.Namespace, bound: int) -> dict[str, Any]:
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
        "output": {"s3Uri": "s3://set-by-harness/run", "checkpointIntervalSteps": args.steps},
    }


def run(args: argparse.Namespace, bound: int, latency_ms: int,
        workdir: Path) -> dict[str, Any]:
    """One training run: the summary of its metrics.jsonl, and the AWS endpoint's latency
    meanwhile."""
    with SqsProbe() as probe:
        metrics = train(spec(args, bound), workdir, f"async{bound}",
                        environment_args={"turns": args.turns, "latency_ms": latency_ms})
    return summary(metrics) | {"sqs_ms": probe.median_ms}


def mean_of(metrics: list[dict[str, Any]], key: str) -> float | None:
    values = [m[key] for m in metrics if m.get(key) is not None]
    return statistics.mean(values) if values else None


def summary(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    steady = metrics[1:]
    wall = sum(m["stepSeconds"] for m in steady)
    rewards = [m["rewardMean"] for m in metrics]
    return {
        "mean_s": wall / len(steady),
        "median_s": statistics.median(m["stepSeconds"] for m in steady),
        "busy": sum(m["updateSeconds"] + m["decodeSeconds"] for m in steady) / wall,
        "updating": sum(m["updateSeconds"] for m in steady) / wall,
        "update_s": sum(m["updateSeconds"] for m in steady) / len(steady),
        # From publishing a step's requests to its last result: the episodes' critical path
        # (turns one after another, each an environment reply and a sampled turn). Known only
        # for steps whose trainer waited for results (then the last arrived during the wait);
        # a step that found them all there has its floor in the trainer's own work.
        "episodes_s": statistics.mean(waited) if (waited := [
            m["rolloutSeconds"] for m in steady if m["rolloutWaitSeconds"] > WAITED_S]) else None,
        # How the decoder spent its steps: prompt tokens served from cached prefixes, and of
        # the rows each decode step computed, those still generating (means over steps).
        "reuse": mean_of(steady, "prefixReuse"),
        "occupancy": mean_of(steady, "decodeRowOccupancy"),
        "gap": mean_of(steady, "logprobGap"),
        # A turn's wait for the policy's reply, as the workers saw it, and the sampler's part.
        "turn": mean_of(steady, "turnSeconds"),
        "turn_sample": mean_of(steady, "turnSampleSeconds"),
        "first": (rewards[0] + rewards[1]) / 2,
        "last": (rewards[-2] + rewards[-1]) / 2,
        "lag": max(m["trainedPolicyVersion"] - m["oldestPolicyVersion"] for m in metrics),
        "stale": sum(m["staleSamples"] for m in metrics),
    }


def main(args: argparse.Namespace) -> None:
    with SqsProbe() as idle:
        time.sleep(3)
    with tempfile.TemporaryDirectory(prefix="async-bench-") as tmp:
        for latency_ms in args.latency_ms:
            results = {bound: run(args, bound, latency_ms, Path(tmp)) for bound in args.bounds}
            table(args, latency_ms, results, idle.median_ms)


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def milliseconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def turn_split(r: dict[str, Any]) -> str:
    if r["turn"] is None or r["turn_sample"] is None:
        return "-"
    return f"{r['turn']:.3f} = {r['turn_sample']:.3f} + {r['turn'] - r['turn_sample']:.3f}"


def ceiling(base: dict[str, Any], depth: int) -> float | None:
    """The speed-up over the synchronous run that `depth` steps of play ahead can reach at most,
    at the synchronous run's own speeds: a step is no shorter than the trainer's own work
    (sampling and updating) and, since its requests went out `depth` steps earlier, no shorter
    than 1/(depth+1) of an episode's critical path plus the update."""
    if base["episodes_s"] is None:
        return None
    floor = max(base["mean_s"] * base["busy"], (base["episodes_s"] + base["update_s"]) / (depth + 1))
    return base["mean_s"] / floor


def table(args: argparse.Namespace, latency_ms: int, results: dict[int, dict[str, Any]],
          idle_sqs_ms: float | None) -> None:
    base = results[args.bounds[0]]
    print(f"\n> `target` environment, {args.turns} turns, {latency_ms} ms environment latency "
          f"per turn, {PROMPTS} prompts x {GROUP} episodes per step, {args.steps} steps "
          f"({args.steps * PROMPTS * GROUP} samples) per mode; a tiny random policy on CPU, one "
          "worker process, moto on loopback\n")
    print("| maxStepsOffPolicy | s/step (mean) | s/step (median) | steps/hour | vs sync | "
          "trainer busy | updating | idle (s/step) | episodes: publish -> last result, steps "
          "that waited (s) | ceiling at this depth (of it) | prefix reuse | decode row "
          "occupancy | a turn's reply: waited, in the sampler, in the queues (s) | SQS probe "
          "(ms) | trainer - sampler logprob | reward first 2 -> last 2 steps | max lag trained "
          "| stale |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for bound, r in results.items():
        speedup, most = base["mean_s"] / r["mean_s"], ceiling(base, bound)
        print(f"| {bound} | {r['mean_s']:.2f} | {r['median_s']:.2f} | {3600 / r['mean_s']:,.0f} "
              f"| {speedup:.2f}x | {r['busy']:.0%} | {r['updating']:.0%} "
              f"| {r['mean_s'] * (1 - r['busy']):.2f} "
              f"| {'-' if r['episodes_s'] is None else format(r['episodes_s'], '.2f')} "
              f"| {'-' if most is None else f'{most:.2f}x ({speedup / most:.0%})'} "
              f"| {percent(r['reuse'])} | {percent(r['occupancy'])} | {turn_split(r)} "
              f"| {milliseconds(r['sqs_ms'])} "
              f"| {'-' if r['gap'] is None else format(r['gap'], '.1e')} "
              f"| {r['first']:.3f} -> {r['last']:.3f} | {r['lag']} | {r['stale']} |")
    print(f"\n> At {latency_ms} ms the synchronous trainer is busy {base['busy']:.0%} of a step "
          f"(sampling or updating): hiding all environment time at its sampling speed would "
          f"give about {1 / base['busy']:.2f}x (more episodes at once also batch better). Busy "
          "= updating or sampling (one holds the model at a time), steps 2..N; the last "
          "maxStepsOffPolicy steps have nothing left to play ahead. Idle: neither sampling nor "
          "updating. A step's requests go out maxStepsOffPolicy steps before it gathers them: "
          "their last result ends that many steps plus the wait. Ceiling at this depth: the "
          "synchronous run's step over the longer of its own trainer work and (its episodes' "
          "publish-to-last-result time plus its update) / (maxStepsOffPolicy + 1): the most "
          "this depth can give at the synchronous run's sampling speed. Prefix reuse: the share "
          "of prompt tokens the decoder took from cached prefixes (an update drops them); decode "
          "row occupancy: the share of the rows its decode steps "
          "computed that were still generating (idle rows below the highest busy one are "
          "computed too). A turn's reply: the workers' mean wait for one (metrics.jsonl's "
          "turnSeconds), the part a request spent in the trainer's sampler, waiting to be "
          "admitted and decoding (turnSampleSeconds), and the rest: the queues' round trip, "
          "the server's and the worker's event loops included. SQS probe: the median of one "
          "SendMessage and one ReceiveMessage by a bystander during the run "
          f"({milliseconds(idle_sqs_ms)} ms with nothing else running); the queues' share of a "
          "turn grows with it. Trainer - sampler logprob: the "
          "mean |difference| per trained token before the update (metrics.jsonl's logprobGap): "
          "numerical alone when synchronous, the policy's lag too when played ahead.")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--latency-ms", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--bounds", type=int, nargs="+", default=[0, 1, 2])
    arguments = parser.parse_args()
    with aws_endpoint():
        main(arguments)
