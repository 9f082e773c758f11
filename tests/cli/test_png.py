"""The PNG line chart: a valid PNG (signature, chunk CRCs, IHDR, rows) with the curve where
the points put it."""

from __future__ import annotations

import struct
import zlib

from mtrl_cli.png import LINE, MARGIN, Canvas, line_chart


def decode(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and RGB rows of an 8-bit RGB PNG without filters; checks every CRC."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(kind + body), kind
        chunks[kind] = chunks.get(kind, b"") + body
        pos += 12 + length
    assert list(chunks) == [b"IHDR", b"IDAT", b"IEND"]
    width, height, depth, colour, *_ = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert (depth, colour) == (8, 2)
    raw = zlib.decompress(chunks[b"IDAT"])
    stride = 1 + 3 * width
    assert len(raw) == stride * height
    rows = [raw[y * stride:(y + 1) * stride] for y in range(height)]
    assert all(row[0] == 0 for row in rows)
    return width, height, [row[1:] for row in rows]


def pixel(rows: list[bytes], x: int, y: int) -> tuple[int, ...]:
    return tuple(rows[y][3 * x:3 * x + 3])


def test_a_rising_curve_runs_from_bottom_left_to_top_right() -> None:
    width, height, rows = decode(line_chart([(1, 0.0), (5, 0.5), (9, 1.0)], 200, 100))
    assert (width, height) == (200, 100)
    left, right, top, bottom = MARGIN, 200 - MARGIN, MARGIN, 100 - MARGIN
    assert pixel(rows, left, bottom) == LINE
    assert pixel(rows, right, top) == LINE
    assert pixel(rows, (left + right) // 2, (top + bottom) // 2) == LINE
    assert pixel(rows, left + 5, top + 5) != LINE  # above the line: ground or grid
    assert pixel(rows, 2, 2) == (255, 255, 255)


def test_a_flat_or_single_point_curve_is_drawn_across_the_middle() -> None:
    _, _, rows = decode(line_chart([(1, 0.3), (2, 0.3)], 100, 60))
    assert pixel(rows, 50, 30) == LINE
    _, _, rows = decode(line_chart([(4, 0.3)], 100, 60))
    assert pixel(rows, 50, 30) == LINE


def test_lines_in_every_direction_join_their_ends_pixel_by_pixel() -> None:
    ends = [(0, 0), (9, 0), (9, 4), (0, 4), (4, 9), (0, 9), (5, 5), (3, 8)]
    for x0, y0 in ends:
        for x1, y1 in ends:
            canvas = Canvas(10, 10)
            canvas.line(x0, y0, x1, y1, LINE)
            lit = {(i // 3 % 10, i // 30) for i in range(0, len(canvas.pixels), 3)
                   if tuple(canvas.pixels[i:i + 3]) == LINE}
            assert {(x0, y0), (x1, y1)} <= lit
            assert len(lit) == max(abs(x1 - x0), abs(y1 - y0)) + 1  # one pixel a step
