"""`mtrl watch RUN`: a run's progress, drawn again on every change of the run, until it
finishes (exit 0 when it Succeeded, 1 when it Failed) or Ctrl-C.

status.progress holds the latest step only; the curve comes from the run's metrics.jsonl (one
report per step, in status.outputUri), read again whenever the step moves. When it cannot be
read, the curve is made of the values seen while watching, and the frame says why.
"""

from __future__ import annotations

import shutil
import sys
import textwrap
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TextIO

from mtrl_cli import aws, chart, command, display, kube, metrics
from mtrl_cli.errors import CliError
from mtrl_cli.metrics import Point

BAR = 30
LABEL = 9
CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen


class Curve:
    """One metric's points: metrics.jsonl's when it could be read, and the values seen while
    watching for the steps it does not have (yet)."""

    def __init__(self, metric: str) -> None:
        self.key = metrics.metric_key(metric)
        self.seen: dict[int, float] = {}
        self.read: list[Point] = []
        self.problem: str | None = None
        self._read_at: int | None = None

    def update(self, run: dict[str, Any]) -> None:
        progress = display.progress(run)
        step, value = progress.get("step") or 0, progress.get(self.key)
        if step and isinstance(value, int | float):
            self.seen[step] = float(value)
        output = display.status(run).get("outputUri")
        if output and (self._read_at is None or step != self._read_at):
            self._read_at = step
            try:
                self.read = metrics.series(metrics.parse(aws.read_text(aws.metrics_uri(output))),
                                           self.key)
                self.problem = None
            except CliError as exc:
                self.problem = str(exc)
        elif not output:
            self.problem = "the run has no status.outputUri yet"

    @property
    def points(self) -> list[Point]:
        merged = {**self.seen, **dict(self.read)}
        return sorted(merged.items())


def frame(run: dict[str, Any], curve: Curve, now: datetime, width: int = 80) -> str:
    status, progress = display.status(run), display.progress(run)
    meta = run["metadata"]
    lines = [f"{meta['namespace']}/{meta['name']}   {display.phase(run)}   "
             f"attempt {status.get('attempts') or 0}   age {display.age(display.created(run), now)}"]
    step, total = progress.get("step") or 0, progress.get("totalSteps") or 0
    bar = ""
    if total:
        filled = round(BAR * min(step, total) / total)
        bar = f"   {'█' * filled}{'░' * (BAR - filled)}  {100 * step // total}%"
    lines.append(f"{'step':<{LABEL}}{display.step(run)}{bar}")
    reward = display.number(progress.get("rewardMean"))
    if progress.get("rewardStd") is not None:
        reward += f" ± {display.number(progress['rewardStd'])}"
    lines.append(f"{'reward':<{LABEL}}{reward}")
    lines.append(f"{'success':<{LABEL}}{display.percent(progress.get('successRate'))}")
    held_out = held_out_line(progress)
    if held_out:
        lines.append(f"{'held-out':<{LABEL}}{held_out}")
    lines.append(f"{'message':<{LABEL}}{display.cut(status.get('message') or '', width - LABEL)}")
    points = curve.points
    if points:
        values = [v for _, v in points]
        lines.append(f"{'curve':<{LABEL}}{chart.sparkline(values, width - LABEL)}")
        lines.append(f"{'':<{LABEL}}{curve.key}, steps {points[0][0]}-{points[-1][0]}: "
                     f"{min(values):.3f} to {max(values):.3f}")
    else:
        lines.append(f"{'curve':<{LABEL}}(no steps reported yet)")
    if curve.problem:
        note = f"from the values seen while watching; metrics.jsonl: {curve.problem}"
        wrapped = textwrap.wrap(note, max(20, width - LABEL), break_long_words=False,
                                break_on_hyphens=False)
        lines += [f"{'':<{LABEL}}{part}" for part in wrapped]
    return "\n".join(lines)


def held_out_line(progress: dict[str, Any]) -> str:
    """The latest evaluation of the held-out split beside the first (the base model's, with
    dataset.evalOnStart): greedy success where dataset.evalGreedy plays it, and sampled."""
    history = progress.get("validationHistory") or []

    def rates(point: dict[str, Any]) -> str:
        greedy = point.get("greedySuccessRate")
        sampled = f"{display.percent(point.get('successRate'))} sampled"
        return sampled if greedy is None else f"{display.percent(greedy)} greedy, {sampled}"

    if not history:
        return ""
    first, last = history[0], history[-1]
    line = f"step {last['step']}: {rates(last)}"
    return line if first is last else f"{line} (step {first['step']}: {rates(first)})"


def exit_code(run: dict[str, Any]) -> int:
    return 1 if display.phase(run) == "Failed" else 0


class Screen:
    """A terminal is cleared and drawn again; a pipe or file gets each new frame once."""

    def __init__(self, out: TextIO) -> None:
        self.out, self.tty, self.last = out, out.isatty(), ""

    def show(self, text: str) -> None:
        if text == self.last:
            return
        self.out.write(f"{CLEAR}{text}\n" if self.tty else f"{text}\n\n" if self.last else
                       f"{text}\n")
        self.out.flush()
        self.last = text


def main(argv: Sequence[str] | None = None) -> int:
    parser = command.parser("watch", __doc__)
    parser.add_argument("run", metavar="RUN", help="the run's name")
    kube.add_arguments(parser)
    parser.add_argument("--metric", default="reward_mean",
                        help="the metrics.jsonl field the curve draws (default: reward_mean)")
    parser.add_argument("--once", action="store_true",
                        help="print one frame and exit (1 if the run Failed, else 0)")
    args = parser.parse_args(argv)

    def watch() -> int:
        cluster = kube.connect(args)
        curve, screen = Curve(args.metric), Screen(sys.stdout)
        width = min(100, shutil.get_terminal_size().columns)
        if args.once:
            run = cluster.run(args.run, cluster.namespace)
            curve.update(run)
            screen.show(frame(run, curve, display.now(), width))
            return exit_code(run)
        for run in cluster.watch_run(args.run, cluster.namespace):
            curve.update(run)
            screen.show(frame(run, curve, display.now(), width))
            if display.phase(run) in ("Succeeded", "Failed"):
                return exit_code(run)
        raise CliError(f'run "{args.run}" in namespace "{cluster.namespace}" was deleted')

    return command.reported(parser, watch)
