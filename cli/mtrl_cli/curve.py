"""`mtrl curve RUN`: one metric of every step, from the run's metrics.jsonl, as a chart in the
terminal; `--png FILE` also writes it as a PNG line chart."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from mtrl_cli import aws, chart, command, display, kube, metrics, plot
from mtrl_cli.errors import CliError


def main(argv: Sequence[str] | None = None) -> int:
    parser = command.parser("curve", __doc__)
    parser.add_argument("run", metavar="RUN", help="the run's name")
    kube.add_arguments(parser)
    parser.add_argument("--metric", default="reward_mean", help="a numeric field of the "
                        "trainer's reports, snake_case or camelCase (default: reward_mean)")
    parser.add_argument("--png", type=Path, metavar="FILE", help="also write a PNG line chart")
    parser.add_argument("--height", type=int, default=10, help="rows of the terminal chart")
    args = parser.parse_args(argv)

    def curve() -> int:
        cluster = kube.connect(args)
        run = cluster.run(args.run, cluster.namespace)
        output = display.status(run).get("outputUri")
        if not output:
            raise CliError(f'run "{args.run}" has no status.outputUri yet '
                           f"(phase {display.phase(run)})")
        uri = aws.metrics_uri(output)
        rows = metrics.parse(aws.read_text(uri))
        points = metrics.series(rows, args.metric)
        if not points:
            raise CliError(f"{uri} has no {metrics.metric_key(args.metric)!r} "
                           f"(it has: {', '.join(metrics.numeric_keys(rows)) or 'no steps'})")
        width = max(10, min(100, shutil.get_terminal_size().columns) - 12)
        print(f"{metrics.metric_key(args.metric)} of {cluster.namespace}/{args.run}, "
              f"{len(points)} steps ({uri})")
        print("\n".join(chart.chart(points, width, max(1, args.height))))
        if args.png:
            try:
                plot.line_chart(points, args.png, title=f"{cluster.namespace}/{args.run}",
                                ylabel=metrics.metric_key(args.metric))
            except OSError as exc:
                raise CliError(f"writing {args.png}: {exc.strerror}") from None
            print(f"wrote {args.png}")
        return 0

    return command.reported(parser, curve)
