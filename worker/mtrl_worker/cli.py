"""`mtrl worker` / `python -m mtrl_worker`: run a rollout worker configured by MTRL_* env vars."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from mtrl_rollout import logs
from mtrl_worker.config import ConfigError, WorkerConfig
from mtrl_worker.runtime import Worker

log = logging.getLogger("mtrl_worker")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mtrl worker",
        description="Run a rollout worker. All configuration comes from MTRL_* environment "
        "variables (docs/environments.md).",
    )
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logs.configure(args.log_level)
    try:
        config = WorkerConfig.from_env()
        worker = Worker(config)
    except (ConfigError, LookupError, TypeError, ValueError) as exc:
        print(f"mtrl worker: {exc}", file=sys.stderr)
        return 2
    asyncio.run(_serve(worker))
    log.info("worker %s stopped after %d episodes", config.worker_id, worker.completed)
    return 0


async def _serve(worker: Worker) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await worker.run(stop)
