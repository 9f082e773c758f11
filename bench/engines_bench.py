"""Engines side by side (issue 23): the same model, task, worker and steps trained by the
reference trainer synchronously, by it with `maxStepsOffPolicy: 2`, and by TRL's GRPOTrainer
(`spec.trainer.engine: trl`), one run each, one after the other on this machine.

Per run: steps per hour and completion tokens per second end to end (sampled tokens over the
run's step time), decode tokens per second (over the time the policy server decoded), the
reward of each step, and held-out success before the first step (`evalOnStart`) and after the
last. `--model smollm2` (default) is SmolLM2-135M-Instruct playing `guess`, as the learning
benchmark; `--model tiny` a random tiny model on the `target` task, which takes minutes.

    python bench/engines_bench.py [--model smollm2|tiny] [--steps 4] [--runs sync ahead2 trl]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import train
from learning_bench import MODEL

from mtrl_testbed.moto import aws_endpoint
from mtrl_trainer.tokenizer import CharChatTokenizer

RUNS = {  # --runs key -> (label, engine, grpo overrides)
    "sync": ("mtrl, synchronous", "mtrl", {}),
    "ahead2": ("mtrl, maxStepsOffPolicy 2", "mtrl", {"maxStepsOffPolicy": 2}),
    "trl": ("trl (GRPOTrainer)", "trl", {}),
}


def spec(args: argparse.Namespace, engine: str, grpo: dict[str, Any]) -> dict[str, Any]:
    common_grpo = {"groupSize": 8, "promptsPerStep": args.prompts, "maxSteps": args.steps,
                   "temperature": 1.0, "seed": 0, **grpo}
    if args.model == "tiny":
        target = {"target_token_id": str(CharChatTokenizer().encode("a")[0])}
        return {
            "model": {"name": "random:tiny-qwen2", "dtype": "float32", "maxSequenceLength": 256,
                      "lora": {"rank": 8, "alpha": 16, "dropout": 0.0}},
            "trainer": {"engine": engine, "gpusPerNode": 0},
            "grpo": common_grpo | {"learningRate": 0.02, "maxNewTokens": 12},
            "rollout": {"environment": "target", "maxTurns": 1, "episodeTimeoutSeconds": 120},
            "dataset": {"inline": {"train": [target] * 4, "validation": [target] * 4},
                        "evalIntervalSteps": args.steps, "evalOnStart": True},
            "output": {"s3Uri": "s3://set-by-harness/run", "checkpointIntervalSteps": args.steps},
        }
    return {
        "model": {"name": MODEL, "dtype": "float32", "maxSequenceLength": 1024,
                  "lora": {"rank": 16, "alpha": 32, "dropout": 0.0}},
        "trainer": {"engine": engine, "gpusPerNode": 0},
        "grpo": common_grpo | {"learningRate": 3e-4, "maxNewTokens": 16,
                               "gradientAccumulationSteps": 8},
        "rollout": {"environment": "guess", "environmentArgs": {"max_guesses": "6"},
                    "maxTurns": 6, "episodeTimeoutSeconds": 1800},
        "dataset": {"generated": {"trainSize": args.steps * args.prompts,
                                  "validationSize": args.validation},
                    "evalIntervalSteps": args.steps, "evalOnStart": True},
        "output": {"s3Uri": "s3://set-by-harness/run", "checkpointIntervalSteps": args.steps},
    }


def summary(metrics: list[dict[str, Any]], minutes: float) -> dict[str, Any]:
    before = next(m for m in metrics if m["step"] == 0)
    trained = [m for m in metrics if m["step"] > 0]
    seconds = sum(m["stepSeconds"] for m in trained)
    tokens = sum(m["completionTokens"] for m in trained)
    decode = sum(m["decodeSeconds"] for m in trained)
    return {
        "steps_per_hour": 3600 * len(trained) / seconds,
        "tokens_per_s": tokens / seconds,
        "decode_tokens_per_s": tokens / decode if decode else float("nan"),
        "rewards": [m["rewardMean"] for m in trained],
        "before": before["validationSuccessRate"],
        "after": trained[-1]["validationSuccessRate"],
        "minutes": minutes,
    }


def main(args: argparse.Namespace) -> None:
    results = {}
    with tempfile.TemporaryDirectory(prefix="engines-bench-") as tmp:
        logs = Path(args.logs or tmp)
        logs.mkdir(parents=True, exist_ok=True)
        for key in args.runs:
            label, engine, grpo = RUNS[key]
            started = time.monotonic()
            metrics = train(spec(args, engine, grpo), logs, engine,
                            timeout_s=args.timeout_s, worker_concurrency=8 * args.prompts)
            results[label] = summary(metrics, (time.monotonic() - started) / 60)
            print(f"{label}: {results[label]}", flush=True)
    what = ("SmolLM2-135M-Instruct playing `guess` (6 guesses), LoRA r16, lr 3e-4, 8 "
            f"micro-batches, {args.validation} held-out games" if args.model == "smollm2" else
            "a random tiny Qwen2 on the `target` task, LoRA r8, lr 0.02, 4 held-out prompts")
    print(f"\n> {what}; {args.prompts} prompts x 8 per step, {args.steps} steps, seed 0; one "
          f"worker, moto on loopback; runs {', '.join(args.runs)}, one after the other\n")
    print("| engine | steps/hour | completion tok/s (end to end) | decode tok/s | reward by step "
          "| held-out success before -> after | minutes |")
    print("|---|---|---|---|---|---|---|")
    for label, r in results.items():
        rewards = ", ".join(f"{v:.3f}" for v in r["rewards"])
        print(f"| {label} | {r['steps_per_hour']:.1f} | {r['tokens_per_s']:.1f} | "
              f"{r['decode_tokens_per_s']:.1f} | {rewards} | {r['before']:.3f} -> "
              f"{r['after']:.3f} | {r['minutes']:.1f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4, help="prompts (games) per step")
    parser.add_argument("--validation", type=int, default=16, help="held-out games (smollm2)")
    parser.add_argument("--timeout-s", type=float, default=3600)
    parser.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS),
                        help="which runs, in this order")
    parser.add_argument("--logs", help="keep the trainers' and worker's logs in this folder")
    arguments = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    with aws_endpoint():
        main(arguments)
