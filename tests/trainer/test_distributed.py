"""torchrun with gloo: two processes compute the same step as one process on the same batch, and
N ranks each sample their share of the episodes (sharded generation)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("ddp_step.py")
SHARD_SCRIPT = Path(__file__).with_name("shard_serve.py")


def run_step(nproc: int, script: Path = SCRIPT, *args: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", str(script), *args]
    # Keep the caller's path: a worktree's packages come before the editable install.
    path = os.pathsep.join(p for p in (str(SCRIPT.parents[2]), os.environ.get("PYTHONPATH")) if p)
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as exc:  # its output, always bytes here, would be lost
        said = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        raise AssertionError(f"{script.name} under torchrun ran past 240 s:\n{said[-3000:]}") \
            from None
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_two_gloo_ranks_match_one_process() -> None:
    one, two = run_step(1), run_step(2)
    assert one["tokens"] == two["tokens"] > 0
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5, abs=1e-6)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
    assert two["digest"] == pytest.approx(one["digest"], rel=1e-5)  # same update applied


def test_two_gloo_ranks_match_one_process_where_rows_share_their_opening() -> None:
    """Without gradient checkpointing a micro-batch's rows that open alike run the opening once
    (`SequenceLogprobs.hidden_states`); each rank does so for its half of a group, and DDP's
    all-reduce still gives the step one process computes."""
    one, two = run_step(1, SCRIPT, "--shared-prefix"), run_step(2, SCRIPT, "--shared-prefix")
    assert one["tokens"] == two["tokens"] > 0
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5, abs=1e-6)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
    assert two["digest"] == pytest.approx(one["digest"], rel=1e-5)
    # 2 groups of 4 rows of 40 shared + 6-14 own tokens, one group per micro-batch, each run
    # twice (the policy, and the reference for beta): whole rows would embed at least
    # 2 x 2 x 4 x 46 positions in one process, 2 x 2 x 2 x 46 on each of two ranks.
    forwards = 2
    assert one["embedded"] <= forwards * 2 * (40 + 4 * 14) < forwards * 2 * 4 * 46
    assert two["embedded"] <= forwards * 2 * (40 + 2 * 14) < forwards * 2 * 2 * 46


def test_every_rank_serves_its_share_of_the_episodes() -> None:
    from mtrl_trainer.sharding import shard_of

    ranks = 3
    report = run_step(ranks, SHARD_SCRIPT)
    served = [r["served"] for r in report["ranks"]]
    samples = {s for share in served for s in share}
    assert len(samples) == 24  # 12 episodes x 2 rounds
    for rank, share in enumerate(served):
        assert share, f"rank {rank} served nothing"
        assert set(share) == {s for s in samples if shard_of(s, ranks) == rank}
        assert set(share.values()) == {2}  # both turns of each episode on the same rank
    # Turn 2 extends turn 1: each rank prefilled it from its cached prefix.
    assert all(r["reused"] > 0 for r in report["ranks"])
    # Before the update every rank sampled with version 0, after it with version 1.
    assert report["versions"] == [[0], [1]]


@pytest.mark.aws
def test_every_process_of_a_torchrun_trainer_serves_one_attempt(training_run) -> None:
    """Production's start: `torchrun --nproc-per-node=2 -m mtrl_trainer`, each process deriving
    its attempt as the trainer does. Every rank samples its share, so a rank refusing another
    process's attempt would drop groups; all of them train."""
    from .conftest import run_spec

    spec = run_spec(training_run.bucket, maxSteps=3)
    spec["dataset"]["evalIntervalSteps"] = 0
    training_run.start_worker()
    trainer = training_run.start_trainer(spec, processes=2)
    assert trainer.wait(240) == 0, training_run.log("trainer")[-3000:]
    log = training_run.log("trainer")
    assert "another trainer attempt" not in log
    for step in training_run.metrics(spec):
        assert step["failedEpisodes"] == 0 and step["sampledGroups"] == 4, step
        assert step["trainedGroups"] + round(step["zeroVarianceFraction"] * 4) == 4, step
