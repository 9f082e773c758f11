"""A stand-in trainer for the test bed: the real trainer's contract with the operator, without
a model.

`python -m mtrl_testbed.standin_trainer [--step-seconds S] [--trained-steps N] [--no-outcome]`
reads the run spec the operator mounts ($MTRL_CONFIG), then for each of spec.grpo.maxSteps
steps logs the step line the real trainer logs and writes its progress through the real
trainer's sinks (`mtrl_trainer.progress`: the run's progress ConfigMap, with MTRL_ATTEMPT and
MTRL_LAUNCH), and at the end reports the outcome "Succeeded" with the steps that trained and
exits 0, as `mtrl_trainer.loop.Run.lead` does after its last checkpoint. SIGTERM ends it at
once with 143, like a trainer stopped mid-run. Lifecycle and example tests run it where the
real trainer would need a model, GPUs or minutes.

`--trained-steps 0` is a trainer whose every group scored alike (it reports success with no
trained step, which the operator must not take for one); `--no-outcome` one that exits 0
without reporting an outcome (a broken trainer, or a command that is not one).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mtrl_api import PROGRESS_KEY
from mtrl_trainer.progress import (
    SUCCEEDED,
    ConfigMapSink,
    Progress,
    ProgressReport,
    ProgressSink,
)

# The real trainer's logger, so the step line matches what HyperPod's log monitoring is told
# to look for (mtrl_operator.builders.trainer.STEP_LOG_PATTERN).
log = logging.getLogger("mtrl_trainer.loop")


def finished_report(env: Mapping[str, str], total: int,
                    trained: int | None = None) -> tuple[str, dict[str, Any]]:
    """(the progress ConfigMap's name, the merge patch) a trainer whose container has `env`
    writes when it finishes all `total` steps: for a test bed that plays the training
    operator's part (setting a job's conditions by hand) and must leave the evidence a real
    trainer would."""
    body = {"step": total, "totalSteps": total, "components": [], "policyVersion": total,
            "trainedSteps": total if trained is None else trained,
            "attempt": int(env["MTRL_ATTEMPT"]), "launch": int(env["MTRL_LAUNCH"]),
            "outcome": SUCCEEDED}
    return env["MTRL_PROGRESS_CONFIGMAP"], {"data": {PROGRESS_KEY: json.dumps(body)}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="standin_trainer", description=__doc__)
    parser.add_argument("--step-seconds", type=float, default=0.5)
    parser.add_argument("--trained-steps", type=int, default=None,
                        help="steps whose update trained (default: every step)")
    parser.add_argument("--no-outcome", action="store_true",
                        help="exit 0 after the last step without reporting the outcome")
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    spec = json.loads(Path(os.environ["MTRL_CONFIG"]).read_text())
    total = int(spec.get("grpo", {}).get("maxSteps", 100))
    sinks: list[ProgressSink] = []
    if os.environ.get("MTRL_PROGRESS_CONFIGMAP") and os.environ.get("MTRL_POD_NAMESPACE"):
        sinks.append(ConfigMapSink(os.environ["MTRL_PROGRESS_CONFIGMAP"],
                                   os.environ["MTRL_POD_NAMESPACE"]))
    attempt, launch = os.environ.get("MTRL_ATTEMPT"), os.environ.get("MTRL_LAUNCH")
    progress = Progress(sinks, attempt=int(attempt) if attempt else None,
                        launch=int(launch) if launch else None)
    trained = total if args.trained_steps is None else args.trained_steps
    for step in range(1, total + 1):
        time.sleep(args.step_seconds)
        log.info("step %d/%d reward %.4f (stand-in)", step, total, step / total)
        progress.report(ProgressReport(
            step=step, total_steps=total, reward_mean=step / total, reward_std=0.0,
            success_rate=None, zero_variance_fraction=0.0, validation_success_rate=None,
            tokens_per_second=None, components=[], policy_version=step,
            trained_steps=min(step, trained)))
    if args.no_outcome:
        log.info("stopping at step %d without an outcome (stand-in)", total)
        return 0
    progress.succeeded(total, total, trained)
    log.info("training finished at step %d", total)
    return 0


if __name__ == "__main__":
    sys.exit(main())
