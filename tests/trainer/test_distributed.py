"""Two gloo processes under torchrun compute the same step as one process on the same batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("ddp_step.py")


def run_step(nproc: int) -> dict[str, float]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", str(SCRIPT)]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(SCRIPT.parents[2])}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_two_gloo_ranks_match_one_process() -> None:
    one, two = run_step(1), run_step(2)
    assert one["tokens"] == two["tokens"] > 0
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5, abs=1e-6)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
    assert two["digest"] == pytest.approx(one["digest"], rel=1e-5)  # same update applied
