"""Server fixtures: each server starts once per test run."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import shutil
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mtrl_testbed import chart_identity
from mtrl_testbed.chart_identity import ChartIdentity
from mtrl_testbed.cluster import REPO_ROOT, LocalCluster
from mtrl_testbed.moto import EXECUTION_ROLE_ARN, MotoServer
from mtrl_testbed.operator import OperatorProcess
from mtrl_testbed.ports import free_port, wait_until

# Under pytest-xdist (`make test`) each worker process starts its own servers and keeps its
# logs apart: out/test/gw0, out/test/gw1.
ARTIFACTS = (Path(os.environ.get("MTRL_TEST_ARTIFACTS", REPO_ROOT / "out" / "test"))
             / os.environ.get("PYTEST_XDIST_WORKER", ""))
LOG_TAIL_LINES = 40
OUTPUT_BUCKET = "mtrl-test-outputs"
TEST_PRICE = 3600.0  # USD per node-hour the shared operator charges: a dollar a node-second


_STARTED = pytest.StashKey[float]()
# The tests of the real images and of the real kubelet share one Docker engine: one worker
# runs them all.
DOCKER_DIRS = ("tests/images/", "tests/kubelet/")


# The slowest files, slowest first (seconds each took in a 2-worker run on 2 cores,
# 2026-12-07). They run first, so that the suite does not end with one worker idle while
# the other runs one of them; the order of the other files is pytest's.
SLOW_FIRST = (
    "tests/images/test_image_contents.py", "tests/images/test_real_images.py",  # with
    "tests/kubelet/test_e2e.py",  # the kubelet's tests, one scope: 1470 s
    "tests/operator/test_crash_consistency.py",  # 800
    "tests/trainer/test_output.py",  # 750
    "tests/operator/reconcile/test_lifecycle_model.py",  # 430
    "tests/trainer/test_resume.py",  # 330
    "tests/operator/test_launchers.py",  # 320
    "tests/testbed/test_conformance.py",  # 290
    "tests/trainer/test_learning.py",  # 280
    "tests/trainer/test_distributed.py", "tests/trainer/test_real_model.py",  # 240
    "tests/trainer/test_failing_episodes.py",  # 220
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`make test` deals whole files to its workers, so that a file's module fixtures start
    once (xdist's `loadfile`), and the Docker engine's tests as one."""
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "docker" if path.startswith(DOCKER_DIRS) else path

    return FileScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_STARTED] = time.time()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test shows what the operators said while it ran: CI keeps only its output,
    not `out/test`. The warnings and errors come first, then the last lines."""
    report: pytest.TestReport = yield
    if report.failed and call.when == "call":
        started = item.stash.get(_STARTED, 0.0)
        for log in sorted(ARTIFACTS.glob("operator-*.log")):
            if log.stat().st_mtime >= started:
                report.sections.append((f"operator log {log.name}", _log_tail(log, started)))
    return report


def _log_tail(log: Path, since: float) -> str:
    """The lines logged since `since` (logs are JSON lines that start with their time)."""
    start = dt.datetime.fromtimestamp(since, dt.UTC).isoformat(timespec="milliseconds")
    lines = [line for line in log.read_text(errors="replace").splitlines()
             if (m := re.match(r'{"ts": "([^"]+)"', line)) is None or m[1] >= start]
    loud = [line for line in lines if re.search(r'"level": "(warning|error|critical)"', line)]
    return "\n".join(["-- warnings and errors --", *loud[-LOG_TAIL_LINES:],
                      "-- last lines --", *lines[-LOG_TAIL_LINES // 2:]])


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    """A moto server on loopback; tests get its endpoint and credentials via `aws_env`."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    server = MotoServer(log_path=ARTIFACTS / "moto.log").start()
    yield server
    server.stop()


@pytest.fixture
def unreachable_s3() -> Any:
    """An S3 client whose endpoint refuses connections: every read fails as a network fault
    does, after botocore's own handling (one attempt, so a test does not wait for retries)."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=f"http://127.0.0.1:{free_port()}", region_name="us-west-2",
                        aws_access_key_id="testing", aws_secret_access_key="testing",
                        config=Config(retries={"max_attempts": 1}, connect_timeout=2))


@pytest.fixture(scope="session")
def aws_env(moto_server: MotoServer) -> Iterator[dict[str, str]]:
    """Point boto3 in this process (and children given this env) at the moto server."""
    env = moto_server.env()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    moto_server.bucket(OUTPUT_BUCKET)  # tests/operator/runs.py's spec.output.s3Uri (preflight)
    yield env
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A real control plane (etcd, kube-apiserver, controller-manager, scheduler, node agent)
    with the project's CRDs installed."""
    with started_cluster(tmp_path_factory.mktemp("cluster"), "cluster-logs",
                         training_operator=True) as local:
        yield local


@contextlib.contextmanager
def started_cluster(root: Path, logs: str, **options: bool) -> Iterator[LocalCluster]:
    """A LocalCluster with the project's CRDs; its logs are kept in ARTIFACTS/`logs`, where
    CI can show them."""
    local = LocalCluster(root, **options).start()
    try:
        local.install_crds(REPO_ROOT / "crds")
        yield local
    finally:
        local.stop()
        shutil.rmtree(ARTIFACTS / logs, ignore_errors=True)
        shutil.copytree(root / "logs", ARTIFACTS / logs, dirs_exist_ok=True)


@pytest.fixture
def namespace(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards."""
    name = "t-" + re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    with cluster.namespace(f"{name}-{uuid.uuid4().hex[:6]}") as created:
        yield created


@pytest.fixture(scope="session")
def pods_reach_moto(cluster: LocalCluster, moto_server: MotoServer) -> None:
    """Pods run by the node agent get the moto endpoint, as IRSA would give them AWS."""
    (cluster.root / "pod-env.json").write_text(json.dumps(moto_server.env()))


@pytest.fixture(scope="session")
def operator_identity(cluster: LocalCluster) -> ChartIdentity:
    """The chart's ServiceAccount with the chart's RBAC and admission policy (default values,
    cluster-wide): operators in tests act as it, so a permission the chart lacks fails them."""
    return chart_identity.install(cluster)


@pytest.fixture(scope="session")
def operator_factory(cluster: LocalCluster, moto_server: MotoServer, aws_env: dict[str, str],
                     pods_reach_moto: None, operator_identity: ChartIdentity,
                     ) -> Iterator[Callable[..., OperatorProcess]]:
    """Start `mtrl operator` processes against the local cluster and moto, as the chart's
    ServiceAccount unless given another kubeconfig."""
    subnet, group = moto_server.prepare_fargate()
    network = {"MTRL_ECS_SUBNETS": subnet, "MTRL_ECS_SECURITY_GROUPS": group,
               "MTRL_ECS_EXECUTION_ROLE_ARN": EXECUTION_ROLE_ARN}
    started: list[OperatorProcess] = []

    def start(kubeconfig: Path | None = None, **env: str) -> OperatorProcess:
        proc = OperatorProcess(cluster, {**aws_env, **network, **operator_identity.env, **env},
                               ARTIFACTS / f"operator-{len(started)}.log",
                               kubeconfig or operator_identity.kubeconfig).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture(scope="session")
def shared_operator(operator_factory: Callable[..., OperatorProcess]) -> OperatorProcess:
    proc = operator_factory(MTRL_OPERATOR_ID="shared", MTRL_NAMESPACES="t-*",
                            MTRL_INSTANCE_PRICES=f"ml.p5.48xlarge={TEST_PRICE}")
    _wait_healthy(proc)
    return proc


@pytest.fixture
def operator(shared_operator: OperatorProcess) -> OperatorProcess:
    """One operator shared by the lifecycle tests (each test uses its own namespace). Request
    it before `namespace`, so the operator already watches when the namespace appears.

    An operator exits when it loses its Lease (tests/robustness restarts this worker's API
    server) and its Deployment's kubelet starts it again: so does this fixture, before the
    next test that needs it."""
    if not shared_operator.alive:
        _wait_healthy(shared_operator.start())
    return shared_operator


def _wait_healthy(proc: OperatorProcess) -> None:
    wait_until(lambda: urllib.request.urlopen(
        f"http://127.0.0.1:{proc.health_port}/healthz", timeout=2).status == 200,
        60, "the shared operator's liveness endpoint")
