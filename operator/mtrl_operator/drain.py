"""`mtrl drain`: delete every trigger and run and wait until the operator has removed them all.

The chart runs this as a pre-delete hook, so `helm uninstall` never removes the operator
while triggers or runs still carry its finalizer (which would strand them and their cloud
resources). Triggers go first, so no new run starts while the runs are being deleted.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from lightkube import Client
from lightkube.core.exceptions import ApiError

from mtrl_operator.adapters.kube import MultiTurnRLRun
from mtrl_operator.adapters.trigger_kube import MultiTurnRLTrigger
from mtrl_operator.settings import Settings


def _listed(client: Client, resource: Any, namespaces: list[str]) -> list[tuple[str, str]]:
    found = []
    for ns in namespaces or ["*"]:
        try:
            found += [(r.metadata.namespace, r.metadata.name)
                      for r in client.list(resource, namespace=ns)]
        except ApiError as exc:
            if exc.status.code != 404:  # no trigger CRD installed: no triggers
                raise
    return found


def _delete_all(client: Client, resource: Any, namespaces: list[str]) -> None:
    for namespace, name in _listed(client, resource, namespaces):
        try:
            client.delete(resource, name, namespace=namespace)
            print(f"deleting {resource.__name__} {namespace}/{name}", flush=True)
        except ApiError as exc:
            if exc.status.code != 404:
                raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mtrl drain", description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv)
    namespaces = Settings.from_env().namespaces  # the chart's values allow no globs here
    client = Client()
    for resource in (MultiTurnRLTrigger, MultiTurnRLRun):
        _delete_all(client, resource, namespaces)
    deadline = time.monotonic() + args.timeout

    def left() -> list[tuple[str, str]]:
        return [*_listed(client, MultiTurnRLTrigger, namespaces),
                *_listed(client, MultiTurnRLRun, namespaces)]

    while (remaining := left()) and time.monotonic() < deadline:
        time.sleep(2)
    if remaining:
        print(f"timed out with {len(remaining)} trigger(s) or run(s) left: {remaining}; the "
              "operator may be down — see docs/operator.md on mtrl.dev/force-release",
              file=sys.stderr)
        return 1
    print("no triggers or runs left", flush=True)
    return 0
