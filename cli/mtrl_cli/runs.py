"""`mtrl runs [-n NS | -A]`: the runs as a table for people (`kubectl get mtrlruns` for
machines): phase, step, reward, success rate, attempts, age and the status message."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from mtrl_cli import command, display, kube

COLUMNS = ("NAME", "PHASE", "STEP", "REWARD", "SUCCESS", "ATTEMPTS", "AGE", "MESSAGE")
MIN_MESSAGE = 20


def rows(runs: list[dict[str, Any]], now: datetime, namespaces: bool) -> list[list[str]]:
    out = []
    for run in sorted(runs, key=lambda r: (r["metadata"]["namespace"], r["metadata"]["name"])):
        progress = display.progress(run)
        row = [run["metadata"]["name"], display.phase(run), display.step(run),
               display.number(progress.get("rewardMean")), display.percent(
                   progress.get("successRate")), str(display.status(run).get("attempts") or 0),
               display.age(display.created(run), now), display.status(run).get("message") or ""]
        out.append([run["metadata"]["namespace"], *row] if namespaces else row)
    return out


def table(runs: list[dict[str, Any]], now: datetime, namespaces: bool, width: int) -> str:
    """Left-aligned columns three spaces apart, as kubectl prints them; the message (last)
    is cut to what is left of `width`."""
    header = ["NAMESPACE", *COLUMNS] if namespaces else list(COLUMNS)
    body = rows(runs, now, namespaces)
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header) - 1)]
    room = max(MIN_MESSAGE, width - sum(w + 3 for w in widths))
    lines = []
    for r in [header, *body]:
        cells = [c.ljust(w) for c, w in zip(r, widths, strict=False)]
        lines.append("   ".join([*cells, display.cut(r[-1], room)]).rstrip())
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = command.parser("runs", __doc__)
    kube.add_arguments(parser, all_namespaces=True)
    args = parser.parse_args(argv)

    def run() -> int:
        cluster = kube.connect(args)
        namespace = None if args.all_namespaces else cluster.namespace
        runs = cluster.runs(namespace)
        if not runs:
            print(f"No runs found in namespace {namespace}." if namespace else "No runs found.",
                  file=sys.stderr)  # as kubectl says it
            return 0
        print(table(runs, display.now(), namespace is None, shutil.get_terminal_size().columns))
        return 0

    return command.reported(parser, run)
