"""`mtrl watch`: the frame, the curve from metrics.jsonl or from what was seen, and the live
watch that ends with the run."""

from __future__ import annotations

import queue
import subprocess
import threading
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from mtrl_cli.watch import Curve, frame
from mtrl_testbed.cluster import LocalCluster
from tests.cli.conftest import VENV_BIN, Result, buffered_env, make_run, put_metrics, set_status

NOW = datetime(2026, 1, 2, 12, 0, tzinfo=UTC)


def _run(**status: object) -> dict:
    return {"metadata": {"namespace": "team-a", "name": "wordle",
                         "creationTimestamp": "2026-01-02T11:24:00Z"}, "status": status}


def test_a_frame_shows_progress_reward_success_message_and_curve() -> None:
    run = _run(phase="Running", attempts=2, message="training",
               progress={"step": 5, "totalSteps": 10, "rewardMean": 0.5, "rewardStd": 0.125,
                         "successRate": 0.4})
    curve = Curve("reward_mean")
    curve.seen = {1: 0.0, 3: 0.25}
    curve.update(run)  # no outputUri: the curve is what was seen, and the frame says why
    lines = frame(run, curve, NOW, width=60).splitlines()
    assert lines[0] == "team-a/wordle   Running   attempt 2   age 36m"
    assert lines[1] == f"step     5/10   {'█' * 15}{'░' * 15}  50%"
    assert lines[2:5] == ["reward   0.500 ± 0.125", "success  40%", "message  training"]
    assert lines[5] == "curve    ▁▅█"
    assert lines[6] == "         rewardMean, steps 1-5: 0.000 to 0.500"
    assert lines[7:] == ["         from the values seen while watching; metrics.jsonl:",
                         "         the run has no status.outputUri yet"]


def test_a_frame_before_the_first_step() -> None:
    lines = frame(_run(), Curve("reward_mean"), NOW).splitlines()
    assert lines[1:5] == ["step     0", "reward   -", "success  -", "message  "]
    assert lines[5] == "curve    (no steps reported yet)"


def test_a_frame_shows_the_held_out_evaluations_first_and_latest() -> None:
    """The base model's evaluation (step 0) beside the latest, greedy where it was played."""
    history = [{"step": 0, "successRate": 0.03, "greedySuccessRate": 0.0},
               {"step": 6, "successRate": 0.1, "greedySuccessRate": 0.25},
               {"step": 12, "successRate": 0.2, "greedySuccessRate": 0.5}]
    run = _run(phase="Running", progress={"step": 12, "totalSteps": 12,
                                          "validationHistory": history})
    lines = frame(run, Curve("reward_mean"), NOW).splitlines()
    assert lines[4] == "held-out step 12: 50% greedy, 20% sampled (step 0: 0% greedy, 3% sampled)"
    # Sampled only (no dataset.evalGreedy), one evaluation so far: no comparison yet.
    run["status"]["progress"]["validationHistory"] = [{"step": 5, "successRate": 0.4}]
    assert frame(run, Curve("reward_mean"), NOW).splitlines()[4] == "held-out step 5: 40% sampled"


@pytest.mark.cluster
@pytest.mark.aws
def test_once_draws_the_curve_of_metrics_jsonl(cluster: LocalCluster, aws_env: dict[str, str],
                                               cli_namespace: str,
                                               mtrl: Callable[..., Result]) -> None:
    output = put_metrics(f"{cli_namespace}/curved", [0.1, 0.5, 0.9])
    make_run(cluster, cli_namespace, "curved", status={
        "phase": "Running", "outputUri": output,
        "progress": {"step": 3, "totalSteps": 3, "rewardMean": 0.9, "successRate": 1.0}})
    once = mtrl("watch", "curved", "-n", cli_namespace, "--once")
    assert once.code == 0, once.err
    lines = once.out.splitlines()
    assert lines[0].startswith(f"{cli_namespace}/curved   Running")
    assert "curve    ▁▅█" in lines
    assert "         rewardMean, steps 1-3: 0.100 to 0.900" in lines
    assert "seen while watching" not in once.out


@pytest.mark.cluster
@pytest.mark.aws
def test_once_falls_back_to_the_status_when_metrics_jsonl_is_missing(
        cluster: LocalCluster, aws_env: dict[str, str], cli_namespace: str,
        mtrl: Callable[..., Result]) -> None:
    output = put_metrics(f"{cli_namespace}/elsewhere", [0.1]).replace("elsewhere", "missing")
    make_run(cluster, cli_namespace, "missing", status={
        "phase": "Failed", "outputUri": output, "message": "the trainer failed",
        "progress": {"step": 1, "totalSteps": 3, "rewardMean": 0.25}})
    once = mtrl("watch", "missing", "-n", cli_namespace, "--once")
    assert once.code == 1  # the run Failed
    assert "curve    ▄" in once.out.splitlines()
    note = " ".join(once.out.split("curve    ▄\n")[1].split())  # wrapped to the width
    assert note == (f"rewardMean, steps 1-1: 0.250 to 0.250 from the values seen while watching; "
                    f"metrics.jsonl: {output}/metrics.jsonl does not exist (yet)")


@pytest.mark.cluster
def test_watch_redraws_on_each_change_and_exits_with_the_run(
        cluster: LocalCluster, cli_namespace: str, mtrl: Callable[..., Result]) -> None:
    make_run(cluster, cli_namespace, "live", status={
        "phase": "Running", "progress": {"step": 1, "totalSteps": 3, "rewardMean": 0.25}})
    proc = subprocess.Popen([str(VENV_BIN / "mtrl"), "watch", "live", "-n", cli_namespace],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=buffered_env(KUBECONFIG=str(cluster.kubeconfig)))
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout or []],
                     daemon=True).start()

    def wait_line(prefix: str) -> str:
        while True:
            line = lines.get(timeout=30)  # each frame comes within seconds of its change
            if line.startswith(prefix):
                return line

    try:
        assert wait_line("step").startswith("step     1/3")
        set_status(cluster, cli_namespace, "live", {
            "progress": {"step": 2, "totalSteps": 3, "rewardMean": 0.5}})
        assert wait_line("step").startswith("step     2/3")
        assert wait_line("curve") == "curve    ▁█\n"  # both values seen while watching
        set_status(cluster, cli_namespace, "live", {"phase": "Failed", "message": "gave up"})
        assert wait_line("message") == "message  gave up\n"
        assert proc.wait(timeout=30) == 1
    finally:
        proc.kill()
        proc.wait()
    set_status(cluster, cli_namespace, "live", {"phase": "Succeeded"})
    assert mtrl("watch", "live", "-n", cli_namespace).code == 0
