"""A curve as a PNG line chart, drawn by matplotlib (the `plots` extra) without pyplot's
global state; `mtrl curve --png` and `make demo` draw through here."""

from __future__ import annotations

from pathlib import Path

from mtrl_cli.errors import CliError
from mtrl_cli.metrics import Point

DPI = 100


def line_chart(points: list[Point], path: Path, *, title: str, ylabel: str,
               size: tuple[int, int] = (640, 360)) -> None:
    """The points joined by a line (each marked while there are few), step on x, written to
    `path` as a PNG of `size` pixels."""
    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise CliError("writing a PNG needs matplotlib: install mtrl with its 'plots' extra") from None
    fig = Figure(figsize=(size[0] / DPI, size[1] / DPI), dpi=DPI)
    ax = fig.subplots()
    ax.plot([s for s, _ in points], [v for _, v in points], color="tab:blue",
            marker="o" if len(points) <= 50 else None)
    ax.set(xlabel="step", ylabel=ylabel, title=title)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png")
