"""`mtrl torchrun` (mtrl_trainer.launch): torchrun under a launcher that passes SIGTERM on and
exits 143 once torchrun stopped after it, so the Job's podFailurePolicy (ignore 143 of the
trainer container) replaces a deleted multi-process trainer's pod without spending an attempt.
torchrun itself exits 1 after SIGTERM whatever its ranks did (the first test holds that)."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mtrl_trainer.launch import exit_code

pytest.importorskip("torch")  # torchrun

RANK_SCRIPT = Path(__file__).with_name("sigterm_rank.py")


def start(tmp_path: Path, *, plain: bool = False, **env: str) -> subprocess.Popen[str]:
    """Two ranks of sigterm_rank.py under `torchrun --standalone`, or under the launcher."""
    head = ["-m", "torch.distributed.run"] if plain else ["-m", "mtrl_trainer.launch"]
    cmd = [sys.executable, *head, "--standalone", "--nproc-per-node=2", str(RANK_SCRIPT)]
    return subprocess.Popen(cmd, env=os.environ | {"RANKS_DIR": str(tmp_path), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_up(tmp_path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"{rank}.up").exists() for rank in (0, 1)):
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.05)


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, out


def test_torchrun_alone_exits_1_after_sigterm_though_its_ranks_exit_143(tmp_path: Path) -> None:
    proc = start(tmp_path, plain=True)
    wait_up(tmp_path, proc)
    proc.send_signal(signal.SIGTERM)
    code, out = finish(proc)
    assert {p.name for p in tmp_path.glob("*.sigterm")} == {"0.sigterm", "1.sigterm"}
    assert code == 1, out
    assert "SignalException" in out


def test_the_launcher_exits_143_once_torchrun_stopped_after_its_sigterm(tmp_path: Path) -> None:
    proc = start(tmp_path, STOP_SECONDS="1")
    wait_up(tmp_path, proc)
    proc.send_signal(signal.SIGTERM)
    code, out = finish(proc)
    # torchrun passed SIGTERM on to every rank, and waited until they stopped as asked
    assert {p.name for p in tmp_path.glob("*.sigterm")} == {"0.sigterm", "1.sigterm"}, out
    assert code == 143, out


def test_torchrun_goes_with_a_killed_launcher(tmp_path: Path) -> None:
    """torchrun runs in a session of its own (a signal to the launcher's group reaches it once,
    through the launcher), so a SIGKILL of the launcher does not reach it: it is killed as the
    launcher dies, as a container's processes are once its PID 1 is."""
    import psutil

    proc = start(tmp_path)
    wait_up(tmp_path, proc)
    [torchrun] = psutil.Process(proc.pid).children()
    try:
        proc.kill()
        assert proc.wait(10) == -signal.SIGKILL
        torchrun.wait(10)
    finally:
        for up in tmp_path.glob("*.up"):  # the ranks, in sessions of their own as torchrun starts them
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(up.read_text()), signal.SIGKILL)


def test_a_ranks_own_crash_keeps_torchruns_exit_code(tmp_path: Path) -> None:
    proc = start(tmp_path, CRASH_RANK="1")
    code, out = finish(proc)
    assert code == 1, out  # torchrun's: a child failed
    assert "exitcode  : 3" in out


def test_a_finished_run_exits_0(tmp_path: Path) -> None:
    proc = start(tmp_path, FINISH="1")
    code, out = finish(proc)
    assert code == 0, out


def test_exit_codes() -> None:
    assert exit_code(0, terminated=False) == 0
    assert exit_code(1, terminated=False) == 1
    assert exit_code(-9, terminated=False) == 137  # torchrun killed: as a shell says it
    assert exit_code(1, terminated=True) == 143
    assert exit_code(-15, terminated=True) == 143  # SIGTERM before torchrun's own handler
    assert exit_code(0, terminated=True) == 0  # it finished meanwhile


# --------------------------------------------------------------------------- the real trainer


@pytest.mark.slow
@pytest.mark.aws
def test_a_two_rank_trainer_given_sigterm_saves_its_step_exits_143_and_the_next_resumes(
        training_run) -> None:
    """The operator's command for one node of several GPUs, on two gloo ranks: SIGTERM to the
    launcher (a pod deleted outright) at step 3 of 8, no checkpoint due before the end."""
    import boto3
    import torch

    from mtrl_trainer.checkpoint import CheckpointStore

    from .conftest import run_spec

    spec = run_spec(training_run.bucket, maxSteps=8)
    spec["output"] |= {"checkpointIntervalSteps": 100, "keepCheckpoints": 10}
    spec["dataset"]["evalIntervalSteps"] = 0
    store = CheckpointStore(training_run.output_uri(spec), keep=10, client=boto3.client("s3"))
    training_run.start_worker()
    first = training_run.start_trainer(spec, "trainer-1", processes=2)
    saved = [training_run.terminate_at(first, "trainer-1", 3, store, timeout_s=180)]

    second = training_run.start_trainer(spec, "trainer-2", processes=2)
    assert second.wait(240) == 0, training_run.log("trainer-2")[-3000:]
    assert f"resumed from checkpoint at step {saved[0]}" in training_run.log("trainer-2")
    final = torch.load(io.BytesIO(store._get(store._key("checkpoints/step-000008/trainer_state.pt"))),
                       weights_only=False)
    assert [h["step"] for h in final["history"]] == list(range(1, 9))  # none lost, none twice


@pytest.mark.slow
@pytest.mark.aws
def test_a_rank_of_the_trainer_that_dies_fails_the_launcher_without_143(training_run) -> None:
    """A rank's own crash (here SIGKILL, as the OOM killer does) is a failure: torchrun stops
    the other rank and exits 1, and the launcher, which passed on no SIGTERM, says the same."""
    import psutil

    from .conftest import run_spec

    spec = run_spec(training_run.bucket, maxSteps=8)
    spec["dataset"]["evalIntervalSteps"] = 0
    training_run.start_worker()
    launcher = training_run.start_trainer(spec, "trainer", processes=2)
    training_run.wait_for_step(launcher, "trainer", 2, timeout_s=180)
    ranks = [p for p in psutil.Process(launcher.pid).children(recursive=True)
             if "mtrl_trainer" in p.cmdline() and "torch.distributed.run" not in p.cmdline()]
    assert len(ranks) == 2, [p.cmdline() for p in ranks]
    ranks[-1].kill()
    assert launcher.wait(90) == 1, training_run.log("trainer")[-3000:]
