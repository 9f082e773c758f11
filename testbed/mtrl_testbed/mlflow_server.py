"""A real MLflow tracking server on loopback (`mlflow server`, SQLite store) for
spec.output.mlflow: the trainer logs to it over HTTP as it would to a team's server."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from mtrl_testbed.ports import ServerExited, free_port, wait_until


@dataclass
class MlflowServer:
    root: Path  # the SQLite file and the artifacts
    port: int = field(default_factory=free_port)
    _proc: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180) -> MlflowServer:
        self.root.mkdir(parents=True, exist_ok=True)
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 - the child holds it
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1",
             "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
             "--artifacts-destination", str(self.root / "artifacts")],
            stdout=log, stderr=subprocess.STDOUT)
        wait_until(self._ready, timeout, f"MLflow server on {self.uri}", interval=0.5)
        return self

    def _ready(self) -> bool:
        if self._proc is not None and self._proc.poll() is not None:
            tail = (self.root / "server.log").read_text(errors="replace")[-2000:]
            raise ServerExited(f"MLflow server exited with {self._proc.returncode}: {tail}")
        with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as resp:
            return resp.status == 200

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None
