"""Server fixtures: each server starts once per test run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from mtrl_testbed.moto import MotoServer

ARTIFACTS = Path(os.environ.get("MTRL_TEST_ARTIFACTS", Path(__file__).parent.parent / "out" / "test"))


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    """A moto server on loopback; tests get its endpoint and credentials via `aws_env`."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    server = MotoServer(log_path=ARTIFACTS / "moto.log").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def aws_env(moto_server: MotoServer) -> Iterator[dict[str, str]]:
    """Point boto3 in this process (and children given this env) at the moto server."""
    env = moto_server.env()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield env
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
