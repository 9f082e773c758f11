"""Curves in the terminal: resampling, columns of eighth blocks, the sparkline, the chart."""

from __future__ import annotations

from mtrl_cli.chart import BLOCKS, chart, columns, resample, sparkline


def test_resample_averages_equal_buckets_and_keeps_short_series() -> None:
    assert resample([1.0, 2.0, 3.0], 5) == [1.0, 2.0, 3.0]
    assert resample([0.0, 2.0, 4.0, 6.0], 2) == [1.0, 5.0]
    assert len(resample([float(i) for i in range(1000)], 60)) == 60


def test_a_sparkline_rises_from_the_lowest_to_the_highest_block() -> None:
    assert sparkline([0.0, 0.5, 1.0], 10) == "▁▅█"
    assert sparkline([0.1 * i for i in range(8)], 10) == BLOCKS[1:]
    assert sparkline([2.0, 2.0], 10) == "▄▄"  # flat: half height
    assert sparkline([], 10) == ""


def test_columns_stack_full_blocks_under_a_partial_top() -> None:
    rows = columns([0.0, 1.0, 0.75], 10, 2)  # levels 1, 16 and 1 + round(0.75 * 15) = 12
    assert rows == [" █▄", "▁██"]


def test_the_chart_labels_its_range_and_its_steps() -> None:
    lines = chart([(1, 0.25), (2, 0.5), (10, 0.75)], width=20, height=3)
    assert lines[0].startswith("0.750 ┤") and lines[2].startswith("0.250 ┤")
    assert lines[1].startswith("      │")
    assert lines[3] == "      └───"
    assert lines[4].split() == ["1", "10"]
    assert chart([], 20, 3) == ["(no points)"]
