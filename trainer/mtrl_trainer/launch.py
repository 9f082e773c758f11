"""`mtrl torchrun ARGS` (also `python -m mtrl_trainer.launch ARGS`): torchrun ARGS as a child
process, with the exit code of a graceful stop that Kubernetes can read.

A trainer's pod that is deleted gets SIGTERM and its grace period; the trainer saves a
checkpoint at the step it is on and exits 143, and the Job's podFailurePolicy ignores exit 143
of the trainer container, so the pod is replaced without spending an attempt
(`launchers/job.py`). torchrun forwards SIGTERM to its ranks, waits for them, and then exits 1
with a traceback (`SignalException`) whatever they did, so a multi-process trainer deleted
outright would still spend an attempt. This launcher passes SIGTERM and SIGINT on to torchrun
and, once torchrun has exited after a SIGTERM it passed on, exits 143; otherwise it exits with
torchrun's own code (0 when the run finished, 1 when a rank failed), unchanged. It imports
nothing heavy: torch is the child's."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
import sys
from types import FrameType

from mtrl_api import TERMINATED_EXIT_CODE

FORWARDED = (signal.SIGTERM, signal.SIGINT)


def torchrun(argv: list[str]) -> list[str]:
    """The torchrun command line, run by this interpreter (its console script's module)."""
    return [sys.executable, "-m", "torch.distributed.run", *argv]


def exit_code(returncode: int, terminated: bool) -> int:
    """This launcher's exit code from torchrun's (negative: killed by that signal) and whether
    a SIGTERM was passed on to it first."""
    if terminated and returncode != 0:
        return TERMINATED_EXIT_CODE
    return 128 - returncode if returncode < 0 else returncode


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent() -> None:
    """In torchrun's process before it starts: SIGKILL once this launcher is gone, as a
    container's other processes are once its PID 1 is (torchrun is in a session of its own, so
    a SIGKILL of this launcher's process group does not reach it)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    child: subprocess.Popen[bytes] | None = None
    received: set[int] = set()
    early: list[int] = []  # came before the child existed: passed on once it does

    def forward(signum: int, _frame: FrameType | None) -> None:
        received.add(signum)
        if child is None:
            early.append(signum)
        else:
            child.send_signal(signum)

    # Before the child starts, so a signal that comes meanwhile is not lost.
    for sig in FORWARDED:
        signal.signal(sig, forward)
    # Its own session: a signal sent to this launcher's process group (a terminal's Ctrl-C, the
    # test bed's node agent) reaches torchrun once, through here, not twice (torch 2.15's
    # torchrun, given a second SIGTERM while it waits for its ranks, breaks off that wait, sends
    # them SIGTERM again and waits anew).
    child = subprocess.Popen(torchrun(argv), start_new_session=True,
                             preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    while early:  # a handler that runs from here on passes its signal on itself
        child.send_signal(early.pop(0))
    returncode = child.wait()
    return exit_code(returncode, signal.SIGTERM in received)


if __name__ == "__main__":
    sys.exit(main())
