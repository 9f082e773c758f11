"""`python -m mtrl_trainer` (also `mtrl trainer`, and under torchrun): run the configured GRPO
training to spec.grpo.maxSteps. Exit 0 when done, 2 on a configuration error, 1 on any other
unrecoverable error, always with one clear log line saying why."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from mtrl_trainer.config import ConfigError, TrainerConfig
from mtrl_trainer.distributed import close_world, init_world

log = logging.getLogger("mtrl_trainer")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mtrl trainer", description=__doc__)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = TrainerConfig.from_env()
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    from mtrl_trainer.loop import Run  # torch is heavy: import it after the config is valid

    world = init_world()
    try:
        run = Run(config, world)
        if world.is_leader:
            asyncio.run(run.lead())
        else:
            run.follow()
    except ConfigError as exc:  # found only once the run looked at its inputs
        log.error("%s", exc)
        return 2
    except Exception as exc:
        log.exception("training failed: %s: %s", type(exc).__name__, exc)
        return 1
    close_world(world)
    log.info("training finished at step %d", config.spec.grpo.max_steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
