"""`mtrl drain`: delete every run and wait until the operator has removed them all.

The chart runs this as a pre-delete hook, so `helm uninstall` never removes the operator
while runs still carry its finalizer (which would strand them and their cloud resources).
"""

from __future__ import annotations

import argparse
import sys
import time

from lightkube import Client
from lightkube.core.exceptions import ApiError

from mtrl_operator.adapters.kube import MultiTurnRLRun
from mtrl_operator.settings import Settings


def _runs(client: Client, namespaces: list[str]) -> list[tuple[str, str]]:
    found = []
    for ns in namespaces or ["*"]:
        found += [(r.metadata.namespace, r.metadata.name)
                  for r in client.list(MultiTurnRLRun, namespace=ns)]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mtrl drain", description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv)
    namespaces = Settings.from_env().namespaces  # the chart's values allow no globs here
    client = Client()
    for namespace, name in _runs(client, namespaces):
        try:
            client.delete(MultiTurnRLRun, name, namespace=namespace)
            print(f"deleting {namespace}/{name}", flush=True)
        except ApiError as exc:
            if exc.status.code != 404:
                raise
    deadline = time.monotonic() + args.timeout
    while (left := _runs(client, namespaces)) and time.monotonic() < deadline:
        time.sleep(2)
    if left:
        print(f"timed out with {len(left)} run(s) left: {left}; the operator may be down — "
              "see docs/operator.md on mtrl.dev/force-release", file=sys.stderr)
        return 1
    print("no runs left", flush=True)
    return 0
