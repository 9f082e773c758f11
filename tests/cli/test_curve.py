"""`mtrl curve`: a run's metrics.jsonl as a terminal chart and as a PNG."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from mtrl_testbed.cluster import LocalCluster
from tests.cli.conftest import Result, make_run, put_metrics
from tests.cli.test_plot import blue_pixels

pytestmark = [pytest.mark.cluster, pytest.mark.aws]


def test_curve_prints_the_chart_and_writes_a_png(cluster: LocalCluster, aws_env: dict[str, str],
                                                 cli_namespace: str, tmp_path: Path,
                                                 mtrl: Callable[..., Result]) -> None:
    output = put_metrics(f"{cli_namespace}/drawn", [0.2, 0.4, 0.8])
    make_run(cluster, cli_namespace, "drawn", status={"phase": "Succeeded", "outputUri": output})
    png = tmp_path / "reward.png"
    drawn = mtrl("curve", "drawn", "-n", cli_namespace, "--height", "2", "--png", str(png))
    assert drawn.code == 0, drawn.err
    lines = drawn.out.splitlines()
    assert lines[0] == f"rewardMean of {cli_namespace}/drawn, 3 steps ({output}/metrics.jsonl)"
    assert lines[1:3] == ["0.800 ┤  █", "0.200 ┤▁▆█"]
    assert lines[4].split() == ["1", "3"] and lines[5] == f"wrote {png}"
    assert len(blue_pixels(png)) > 100, "the curve is drawn"

    unknown = mtrl("curve", "drawn", "-n", cli_namespace, "--metric", "loss")
    assert unknown.code == 1 and unknown.out == ""
    assert unknown.err == f"mtrl curve: {output}/metrics.jsonl has no 'loss' (it has: rewardMean, " \
                          "totalSteps)\n"


def test_a_run_without_an_output_folder_says_so(cluster: LocalCluster, cli_namespace: str,
                                                mtrl: Callable[..., Result]) -> None:
    make_run(cluster, cli_namespace, "young")
    young = mtrl("curve", "young", "-n", cli_namespace)
    assert (young.code, young.out) == (1, "")
    assert young.err == 'mtrl curve: run "young" has no status.outputUri yet (phase Pending)\n'
