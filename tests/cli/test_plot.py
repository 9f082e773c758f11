"""The PNG line chart: a PNG of the asked size with the curve where the points put it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.image import imread

from mtrl_cli.plot import line_chart

BLUE = np.array([31, 119, 180]) / 255  # matplotlib's tab:blue


def blue_pixels(path: Path) -> np.ndarray:
    """(row, column) of every pixel of the curve's colour."""
    image = imread(path)[:, :, :3]
    return np.argwhere(np.abs(image - BLUE).max(axis=2) < 0.02)


def test_a_rising_curve_runs_up_from_left_to_right(tmp_path: Path) -> None:
    path = tmp_path / "rising.png"
    line_chart([(1, 0.0), (5, 0.5), (9, 1.0)], path, title="t", ylabel="reward")
    assert imread(path).shape[:2] == (360, 640)
    curve = blue_pixels(path)
    assert len(curve) > 100
    middle = np.median(curve[:, 1])
    left, right = curve[curve[:, 1] < middle], curve[curve[:, 1] >= middle]
    assert left[:, 0].mean() > right[:, 0].mean() + 50  # rows grow downwards


def test_a_falling_curve_runs_down(tmp_path: Path) -> None:
    path = tmp_path / "falling.png"
    line_chart([(1, 1.0), (2, 0.2)], path, title="t", ylabel="loss", size=(400, 300))
    assert imread(path).shape[:2] == (300, 400)
    curve = blue_pixels(path)
    middle = np.median(curve[:, 1])
    assert curve[curve[:, 1] < middle][:, 0].mean() < curve[curve[:, 1] >= middle][:, 0].mean()


def test_a_single_point_is_drawn(tmp_path: Path) -> None:
    path = tmp_path / "one.png"
    line_chart([(4, 0.3)], path, title="t", ylabel="reward")
    assert len(blue_pixels(path)) > 10
