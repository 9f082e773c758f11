"""A rank under torchrun for the launcher's tests, without torch.distributed: it says it is up
(a file per rank in $RANKS_DIR, holding its pid), then waits. SIGTERM: after $STOP_SECONDS it
writes `<rank>.sigterm` and exits 143, as the trainer does once its checkpoint is saved. With
$CRASH_RANK set, that rank exits 3 once up (a rank's own crash); with $FINISH set, every rank
exits 0 once up."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

rank = os.environ["RANK"]
ranks = Path(os.environ["RANKS_DIR"])


def stop(_signum: int, _frame: FrameType | None) -> None:
    time.sleep(float(os.environ.get("STOP_SECONDS", "0")))  # saving a checkpoint
    (ranks / f"{rank}.sigterm").write_text("saved")
    sys.exit(143)


signal.signal(signal.SIGTERM, stop)
(ranks / f"{rank}.up").write_text(str(os.getpid()))
if os.environ.get("FINISH"):
    sys.exit(0)
if os.environ.get("CRASH_RANK") == rank:
    sys.exit(3)
time.sleep(120)
sys.exit(0)
