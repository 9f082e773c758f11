"""The operator as a child process, for tests, the demo and benchmarks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.ports import free_port

# Fast loops for tests: resync, sweep and the backoff between trainer attempts in seconds,
# not minutes; a standby (or the operator
# a test starts after killing one) takes over an abandoned Lease in 8 s, not 15. The renew
# deadline stays generous: on a loaded 2-core machine a starved leader must not lose its Lease
# (and exit) while it is merely slow.
TEST_DEFAULTS = {
    "MTRL_RESYNC_SECONDS": "3",
    "MTRL_COST_REFRESH_SECONDS": "3",
    "MTRL_SWEEP_INTERVAL_SECONDS": "3",
    "MTRL_SWEEP_MIN_AGE_SECONDS": "0",  # orphans planted by tests go at the next sweep
    "MTRL_LOG_FORMAT": "json",
    "MTRL_LEASE_DURATION_SECONDS": "8",
    "MTRL_RENEW_DEADLINE_SECONDS": "6",
    "MTRL_RETRY_PERIOD_SECONDS": "1",
    "MTRL_RETRY_BACKOFF_SECONDS": "1",  # between a failed trainer attempt and the next
}


@dataclass
class OperatorProcess:
    cluster: LocalCluster
    env: dict[str, str]
    log_path: Path
    kubeconfig: Path | None = None
    metrics_port: int = field(default_factory=free_port)
    health_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        env = {**os.environ, **TEST_DEFAULTS, **self.env,
               "KUBECONFIG": str(self.kubeconfig or self.cluster.kubeconfig),
               "MTRL_METRICS_PORT": str(self.metrics_port),
               "MTRL_HEALTH_PORT": str(self.health_port)}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 (the child owns it)
        self.proc = subprocess.Popen([sys.executable, "-m", "mtrl_cli", "operator"],
                                     env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
