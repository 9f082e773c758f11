"""A stand-in trainer for the test bed: the real trainer's contract with the operator, without
a model.

`python -m mtrl_testbed.standin_trainer [--step-seconds S]` reads the run spec the operator
mounts ($MTRL_CONFIG), then for each of spec.grpo.maxSteps steps logs the step line the real
trainer logs and writes its progress through the real trainer's sinks
(`mtrl_trainer.progress`: the run's progress ConfigMap, with MTRL_ATTEMPT), and at the end
reports the outcome "Succeeded" and exits 0, as `mtrl_trainer.loop.Run.lead` does after its
last checkpoint. SIGTERM ends it at once with 143, like a trainer stopped mid-run. Lifecycle
and example tests run it where the real trainer would need a model, GPUs or minutes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

from mtrl_trainer.progress import ConfigMapSink, Progress, ProgressReport, ProgressSink

# The real trainer's logger, so the step line matches what HyperPod's log monitoring is told
# to look for (mtrl_operator.builders.trainer.STEP_LOG_PATTERN).
log = logging.getLogger("mtrl_trainer.loop")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="standin_trainer", description=__doc__)
    parser.add_argument("--step-seconds", type=float, default=0.5)
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    spec = json.loads(Path(os.environ["MTRL_CONFIG"]).read_text())
    total = int(spec.get("grpo", {}).get("maxSteps", 100))
    sinks: list[ProgressSink] = []
    if os.environ.get("MTRL_PROGRESS_CONFIGMAP") and os.environ.get("MTRL_POD_NAMESPACE"):
        sinks.append(ConfigMapSink(os.environ["MTRL_PROGRESS_CONFIGMAP"],
                                   os.environ["MTRL_POD_NAMESPACE"]))
    attempt = os.environ.get("MTRL_ATTEMPT")
    progress = Progress(sinks, attempt=int(attempt) if attempt else None)
    for step in range(1, total + 1):
        time.sleep(args.step_seconds)
        log.info("step %d/%d reward %.4f (stand-in)", step, total, step / total)
        progress.report(ProgressReport(
            step=step, total_steps=total, reward_mean=step / total, reward_std=0.0,
            success_rate=None, zero_variance_fraction=0.0, validation_success_rate=None,
            tokens_per_second=None, components=[], policy_version=step))
    progress.succeeded(total, total)
    log.info("training finished at step %d", total)
    return 0


if __name__ == "__main__":
    sys.exit(main())
