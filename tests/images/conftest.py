"""The real images, built once per test run by `hack/build-images.sh` (cached per machine: a
warm machine with unchanged sources rebuilds nothing) on the project's own Docker engine
(`hack/docker.sh`), which this fixture stops afterwards if it started it."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TAG = os.environ.get("MTRL_IMAGE_TAG", "dev")


def _script(*args: str) -> str:
    return subprocess.run(["bash", str(REPO / "hack" / "docker.sh"), *args], check=True,
                          capture_output=True, text=True).stdout.strip()


@dataclass(frozen=True)
class Images:
    client: str
    host: str

    @staticmethod
    def ref(name: str) -> str:
        return f"mtrl.local/mtrl-{name}:{TAG}"

    def docker(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.client, *args], capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, "DOCKER_HOST": self.host})

    def run(self, name: str, argv: list[str], *options: str) -> subprocess.CompletedProcess[str]:
        """argv in a new container of the image as pods run it (uid 65532, no capabilities,
        no privilege escalation), with a read-only root and no network unless options say
        otherwise."""
        return self.docker("run", "--rm", "--read-only", "--network", "none",
                           "--user", "65532:65532", "--cap-drop", "ALL",
                           "--security-opt", "no-new-privileges", *options,
                           "--entrypoint", argv[0], self.ref(name), *argv[1:])


def _engine_possible() -> str | None:
    """Why no Docker engine can be had here, or None."""
    if os.environ.get("DOCKER_HOST") or shutil.which("dockerd"):
        return None
    if os.geteuid() == 0 and shutil.which("apt-get"):
        return None  # hack/docker.sh installs Debian's docker.io
    return "no Docker engine (dockerd), and not root with apt-get to install one"


@pytest.fixture(scope="session")
def images() -> Iterator[Images]:
    reason = _engine_possible()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must build and test the real images: {reason}")
        pytest.skip(f"the real images cannot be built here: {reason}")
    client, host = _script("client"), _script("host")
    was_up = subprocess.run([client, "version"], capture_output=True,
                            env={**os.environ, "DOCKER_HOST": host}).returncode == 0
    built = subprocess.run(["bash", str(REPO / "hack" / "build-images.sh")],
                           capture_output=True, text=True)
    try:
        assert built.returncode == 0, f"hack/build-images.sh failed:\n{built.stderr[-6000:]}"
        yield Images(client, _script("host"))
    finally:
        if not was_up:
            _script("down")
