"""`python -m mtrl_trainer` (also `mtrl trainer`, and under torchrun): run the configured GRPO
training to spec.grpo.maxSteps. Exit 0 when done, 2 on a configuration error, 143 when SIGTERM
stopped it (after a checkpoint at the step it was on), 1 on any other unrecoverable error
(episodes that keep failing, and a step whose gradient norm is not finite, among them), always
with one clear log line saying why, and the same line as the container's termination message
(the file $MTRL_TERMINATION_MESSAGE_PATH names, set by the operator to the container's
terminationMessagePath), which the operator copies into the run's status."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from pathlib import Path

from mtrl_api import CONFIG_ERROR_EXIT_CODE, CONFIG_ERROR_PREFIX, TERMINATED_EXIT_CODE
from mtrl_rollout import logs
from mtrl_trainer.config import ConfigError, TrainerConfig
from mtrl_trainer.distributed import close_world, init_world

log = logging.getLogger("mtrl_trainer")
MAX_TERMINATION_MESSAGE = 4096  # the kubelet keeps no more


def _stop(code: int, cause: str) -> int:
    """Log the cause and leave it as the termination message; return the exit code."""
    log.error("%s", cause)
    path = os.environ.get("MTRL_TERMINATION_MESSAGE_PATH")
    if path:  # unset outside a pod the operator built: the log line is all there is
        with contextlib.suppress(OSError):
            Path(path).write_text(cause[:MAX_TERMINATION_MESSAGE])
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mtrl trainer", description=__doc__)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logs.configure(args.log_level)
    try:
        config = TrainerConfig.from_env()
    except ConfigError as exc:
        return _stop(CONFIG_ERROR_EXIT_CODE, f"{CONFIG_ERROR_PREFIX} {exc}")
    # torch is heavy: import it after the config is valid
    from mtrl_trainer.loop import EpisodesFailed, Run, Terminated
    from mtrl_trainer.update import Diverged

    world = init_world()
    try:
        if config.spec.trainer.engine == "trl":
            from mtrl_trainer.trl_engine import TrlRun as Run  # TRL is imported only for it
        run = Run(config, world)
        if world.is_leader:
            asyncio.run(run.lead())
        else:
            run.follow()
    except ConfigError as exc:  # found only once the run looked at its inputs
        return _stop(CONFIG_ERROR_EXIT_CODE, f"{CONFIG_ERROR_PREFIX} {exc}")
    except Terminated as exc:
        return _stop(TERMINATED_EXIT_CODE, str(exc))
    except (EpisodesFailed, Diverged) as exc:
        return _stop(1, str(exc))
    except Exception as exc:
        log.exception("training failed")
        return _stop(1, f"training failed: {type(exc).__name__}: {exc}")
    close_world(world)
    log.info("training finished at step %d", config.spec.grpo.max_steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
