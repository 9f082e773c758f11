"""Curves drawn in the terminal with block characters: a one-line sparkline, or a column chart
of several rows with its range on the left and its steps below."""

from __future__ import annotations

from mtrl_cli.metrics import Point

BLOCKS = " ▁▂▃▄▅▆▇█"  # eighths of a cell, from empty to full
LEVELS = len(BLOCKS) - 1


def resample(values: list[float], width: int) -> list[float]:
    """At most `width` values: consecutive values averaged into equal buckets."""
    if len(values) <= width:
        return list(values)
    out = []
    for i in range(width):
        bucket = values[i * len(values) // width:(i + 1) * len(values) // width]
        out.append(sum(bucket) / len(bucket))
    return out


def columns(values: list[float], width: int, height: int) -> list[str]:
    """Rows, top first, of one column per value (resampled to `width`); the lowest value is
    one eighth high so that it shows, the highest fills the column; all equal: half height."""
    values = resample(values, width)
    if not values:
        return [""] * height
    lo, hi = min(values), max(values)
    cells = height * LEVELS
    levels = [cells // 2 if hi == lo else 1 + round((v - lo) / (hi - lo) * (cells - 1))
              for v in values]
    rows = []
    for row in range(height - 1, -1, -1):
        rows.append("".join(BLOCKS[max(0, min(LEVELS, level - row * LEVELS))] for level in levels))
    return rows


def sparkline(values: list[float], width: int) -> str:
    return columns(values, width, 1)[0]


def chart(points: list[Point], width: int = 60, height: int = 10) -> list[str]:
    """The column chart with its highest and lowest value on the left and the first and last
    step below."""
    if not points:
        return ["(no points)"]
    values = [v for _, v in points]
    labels = [f"{max(values):.3f}", f"{min(values):.3f}"]
    pad = max(len(s) for s in labels)
    body = columns(values, width, height)
    lines = []
    for i, row in enumerate(body):
        label = labels[0] if i == 0 else labels[1] if i == height - 1 else ""
        lines.append(f"{label:>{pad}} ┤{row}" if label else f"{'':>{pad}} │{row}")
    drawn = len(body[0])
    lines.append(f"{'':>{pad}} └{'─' * drawn}")
    first, last = str(points[0][0]), str(points[-1][0])
    gap = max(1, drawn - len(first) - len(last))
    lines.append(f"{'':>{pad}}  {first}{' ' * gap}{last}" if len(points) > 1 else
                 f"{'':>{pad}}  {first}")
    return lines
