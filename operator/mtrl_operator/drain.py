"""`mtrl drain`: delete every trigger and run and wait until the operator has removed them all.

The chart runs this as a pre-delete hook, so `helm uninstall` never removes the operator
while triggers or runs still carry its finalizer (which would strand them and their cloud
resources). Triggers go first, so no new run starts while the runs are being deleted.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from mtrl_operator.adapters.kube import Kube
from mtrl_operator.settings import Settings

KINDS = ("MultiTurnRLTrigger", "MultiTurnRLRun")


async def drain(kube: Kube, scopes: list[str], wait_s: float) -> list[tuple[str, str]]:
    """Delete every trigger, then every run; what is left after `wait_s` seconds."""
    for kind in KINDS:
        for namespace, name in await kube.names(kind, scopes):
            await kube.delete(kind, name, namespace)
            print(f"deleting {kind} {namespace}/{name}", flush=True)
    deadline = time.monotonic() + wait_s
    while True:  # the operator's teardown has no event to wait on here: look every 2 s
        remaining = [found for kind in KINDS for found in await kube.names(kind, scopes)]
        if not remaining or time.monotonic() >= deadline:
            return remaining
        await asyncio.sleep(2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mtrl drain", description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds to wait for the operator's teardown (default 600)")
    args = parser.parse_args(argv)
    scopes = Settings.from_env().namespaces or ["*"]  # the chart's values allow no globs here
    remaining = asyncio.run(drain(Kube(), scopes, args.timeout))
    if remaining:
        print(f"timed out with {len(remaining)} trigger(s) or run(s) left: {remaining}; the "
              "operator may be down — see docs/operator.md on mtrl.dev/force-release",
              file=sys.stderr)
        return 1
    print("no triggers or runs left", flush=True)
    return 0
