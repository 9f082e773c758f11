"""A PNG line chart from the standard library (zlib, struct): white ground, grey axes and
quarter grid lines, the curve in blue. No text: `mtrl curve` prints the range beside it."""

from __future__ import annotations

import itertools
import struct
import zlib

from mtrl_cli.metrics import Point

WHITE, GRID, AXIS, LINE = (255, 255, 255), (225, 225, 225), (90, 90, 90), (31, 119, 180)
MARGIN = 24


class Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(WHITE) * (width * height))

    def dot(self, x: int, y: int, color: tuple[int, int, int]) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            i = 3 * (y * self.width + x)
            self.pixels[i:i + 3] = bytes(color)

    def line(self, x0: int, y0: int, x1: int, y1: int, color: tuple[int, int, int],
             thick: int = 1) -> None:
        """Bresenham's line, `thick` pixels wide."""
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        while True:
            for ox in range(thick):
                for oy in range(thick):
                    self.dot(x0 + ox, y0 + oy, color)
            if x0 == x1 and y0 == y1:
                return
            twice = 2 * err
            if twice >= dy:
                err, x0 = err + dy, x0 + sx
            if twice <= dx:
                err, y0 = err + dx, y0 + sy

    def png(self) -> bytes:
        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + \
                struct.pack(">I", zlib.crc32(kind + data))

        stride = 3 * self.width
        rows = b"".join(b"\0" + self.pixels[y * stride:(y + 1) * stride]  # filter: none
                        for y in range(self.height))
        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)  # 8-bit RGB
        return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + \
            chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b"")


def line_chart(points: list[Point], width: int = 640, height: int = 360) -> bytes:
    """The points joined by a line, x from the first to the last step, y from the lowest to the
    highest value (a flat curve: across the middle)."""
    canvas = Canvas(width, height)
    left, right, top, bottom = MARGIN, width - MARGIN, MARGIN, height - MARGIN
    for quarter in range(1, 5):
        y = bottom - quarter * (bottom - top) // 4
        canvas.line(left, y, right, y, GRID)
    canvas.line(left, top, left, bottom, AXIS)
    canvas.line(left, bottom, right, bottom, AXIS)
    if points:
        steps, values = [s for s, _ in points], [v for _, v in points]
        x_lo, x_span = min(steps), max(steps) - min(steps) or 1
        y_lo, y_span = min(values), max(values) - min(values)

        def at(step: int, value: float) -> tuple[int, int]:
            x = left + round((step - x_lo) / x_span * (right - left)) if len(points) > 1 \
                else (left + right) // 2
            fraction = (value - y_lo) / y_span if y_span else 0.5
            return x, bottom - round(fraction * (bottom - top))

        xy = [at(s, v) for s, v in points]
        for (x0, y0), (x1, y1) in itertools.pairwise(xy):
            canvas.line(x0, y0, x1, y1, LINE, thick=2)
        if len(xy) == 1:
            canvas.line(*xy[0], *xy[0], LINE, thick=4)
    return canvas.png()
